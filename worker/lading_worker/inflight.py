"""
The attempts running in this process, with what the heartbeater needs to keep them.

An attempt is `running` while the model works and `committing` once the model answered
(it is then validated and handed to the committer). The heartbeater extends both, but
cancels only running ones when their lease is gone: a committing attempt is settled by its
compare-and-set.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import time

from lading.db import jobs
from lading.ids import Fence, JobId


class Phase(enum.Enum):
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
    phase: Phase = Phase.RUNNING


class InFlight:
    def __init__(self) -> None:
        self._attempts: dict[JobId, Attempt] = {}
        self._running = 0
        self.changed = asyncio.Event()
        """Set whenever a model call ends, so a claimer waiting for a free slot wakes up."""

    def __len__(self) -> int:
        return len(self._attempts)

    @property
    def running(self) -> int:
        """Attempts whose model call is still in progress: what the concurrency limit bounds.
        A finished call frees its slot before its commit, so claiming the next job overlaps
        with committing the last one."""
        return self._running

    def add(self, attempt: Attempt) -> None:
        self._attempts[attempt.job.id] = attempt
        self._running += 1

    def committing(self, attempt: Attempt) -> None:
        if attempt.phase is Phase.RUNNING:
            attempt.phase = Phase.COMMITTING
            self._running -= 1
            self.changed.set()

    def remove(self, job_id: JobId) -> None:
        attempt = self._attempts.pop(job_id, None)
        if attempt is not None and attempt.phase is Phase.RUNNING:
            self._running -= 1
        self.changed.set()

    def get(self, job_id: JobId) -> Attempt | None:
        return self._attempts.get(job_id)

    def all(self) -> list[Attempt]:
        return list(self._attempts.values())

    def leases(self) -> list[tuple[JobId, Fence]]:
        return [(a.job.id, a.job.fence) for a in self._attempts.values()]

    def tasks(self) -> list[asyncio.Task[None]]:
        return [a.task for a in self._attempts.values() if a.task is not None]

    @staticmethod
    def now() -> float:
        return time.monotonic()
