"""
The attempts this process owns, with what the heartbeater needs to keep them.

    QUEUED      claimed ahead (prefetch), waiting for a free slot; its model call has not started
    RUNNING     the model call is in progress: what the concurrency limit bounds
    COMMITTING  the model answered; the outcome is being judged and committed

The heartbeater extends every phase. When a lease is gone it drops a queued attempt,
cancels a running one, and leaves a committing one alone: that one is settled by its
compare-and-set.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import time

from lading.db import jobs, reuse
from lading.ids import Fence, JobId


class Phase(enum.Enum):
    QUEUED = "queued"
    RUNNING = "running"
    COMMITTING = "committing"


@dataclasses.dataclass
class Attempt:
    job: jobs.ClaimedJob
    claimed_mono: float
    """time.monotonic() when the claim returned; pairs with job.claimed_at (database time)."""
    lease_deadline_mono: float
    """Our conservative view of when the lease ends, in monotonic time."""
    task: asyncio.Task[None] | None = None
    phase: Phase = Phase.QUEUED
    decision: reuse.Decision | None = None
    """What result reuse decided for this claim (docs/reuse.md); None: call the model."""


class InFlight:
    def __init__(self) -> None:
        self._attempts: dict[JobId, Attempt] = {}
        self._count = {phase: 0 for phase in Phase}
        self.changed = asyncio.Event()
        """Set whenever a slot frees up, so a claimer waiting for one wakes up."""

    def __len__(self) -> int:
        return len(self._attempts)

    @property
    def running(self) -> int:
        """Attempts whose model call is in progress: what the concurrency limit bounds. A call
        that returned frees its slot before its commit, so the next call overlaps the commit."""
        return self._count[Phase.RUNNING]

    @property
    def queued(self) -> int:
        return self._count[Phase.QUEUED]

    def add(self, attempt: Attempt) -> None:
        self._attempts[attempt.job.id] = attempt
        self._count[attempt.phase] += 1

    def move(self, attempt: Attempt, phase: Phase) -> None:
        if self._attempts.get(attempt.job.id) is not attempt or attempt.phase is phase:
            return
        self._count[attempt.phase] -= 1
        self._count[phase] += 1
        if attempt.phase is Phase.RUNNING:
            self.changed.set()
        attempt.phase = phase

    def remove(self, job_id: JobId) -> None:
        attempt = self._attempts.pop(job_id, None)
        if attempt is not None:
            self._count[attempt.phase] -= 1
        self.changed.set()

    def owns(self, attempt: Attempt) -> bool:
        return self._attempts.get(attempt.job.id) is attempt

    def get(self, job_id: JobId) -> Attempt | None:
        return self._attempts.get(job_id)

    def all(self) -> list[Attempt]:
        return list(self._attempts.values())

    def in_phase(self, phase: Phase) -> list[Attempt]:
        return [a for a in self._attempts.values() if a.phase is phase]

    def leases(self) -> list[tuple[JobId, Fence]]:
        return [(a.job.id, a.job.fence) for a in self._attempts.values()]

    def tasks(self) -> list[asyncio.Task[None]]:
        return [a.task for a in self._attempts.values() if a.task is not None]

    @staticmethod
    def now() -> float:
        return time.monotonic()
