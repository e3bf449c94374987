"""
The reaper: rescues jobs whose worker stopped heartbeating, and fails jobs whose
deadline passed while they waited.

It never decides retry vs. give up by itself: it asks the same retry policy as the
executor. A rescued job gets fence+1, so its old owner can never commit. Safe in every
replica at once: expired leases are locked with SKIP LOCKED.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging

import asyncpg

from lading import costing, looping, metrics
from lading.db import conflicts, jobs, spend
from lading.ids import JobId
from lading.jobs import retry
from lading.jobs.states import JobState
from lading.settings import AttemptSettings, ReaperSettings

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class ReapResult:
    rescued: int = 0
    """Expired leases sent back to RETRY_SCHEDULED."""
    failed: int = 0
    """Expired leases whose attempts or deadline were exhausted: FAILED_TERMINAL."""
    expired: int = 0
    """Waiting jobs whose deadline passed: FAILED_TERMINAL."""


class Reaper:
    def __init__(self, db: asyncpg.Pool, *, settings: ReaperSettings, attempt: AttemptSettings) -> None:
        self._db = db
        self._settings = settings
        self._attempt = attempt

    def verdict(self, lease: jobs.ExpiredLease) -> jobs.Reap:
        decision = retry.decide(
            attempt=lease.attempt,
            now=lease.now,
            deadline_at=lease.deadline_at,
            settings=dataclasses.replace(self._attempt, max_attempts=lease.max_attempts),
        )
        if decision.retry and decision.at is not None:
            delay = max(0.0, (decision.at - lease.now).total_seconds())
            return jobs.Reap(lease.id, lease.fence, JobState.RETRY_SCHEDULED, delay, "LeaseExpired")
        return jobs.Reap(lease.id, lease.fence, JobState.FAILED_TERMINAL, None, decision.reason)

    async def run_once(self) -> ReapResult:
        async with self._db.acquire() as conn:

            async def reap() -> dict[JobId, JobState]:
                async with conn.transaction():
                    leases = await jobs.lock_expired_leases(conn, limit=self._settings.batch_size)
                    return await jobs.reap_many(conn, [self.verdict(lease) for lease in leases])

            moved = await conflicts.retrying(reap, what="Reaping expired leases")
            # An attempt cut off mid-call was charged its reservation (docs/cost.md): count it too.
            for tenant, pool, cost in await spend.reaped_costs(conn, job_ids=list(moved)):
                costing.count_cost(tenant=tenant, pool=pool, currency=cost.currency, amount=cost.amount)
            expired = await conflicts.retrying(
                lambda: jobs.expire_waiting(conn, limit=self._settings.batch_size), what="Expiring waiting jobs"
            )
        rescued = sum(1 for s in moved.values() if s is JobState.RETRY_SCHEDULED)
        failed = len(moved) - rescued
        if rescued:
            metrics.REAPER_RECOVERIES.labels(JobState.RETRY_SCHEDULED.value, "LeaseExpired").inc(rescued)
        if failed:
            metrics.REAPER_RECOVERIES.labels(JobState.FAILED_TERMINAL.value, "LeaseExpired").inc(failed)
        if expired:
            metrics.REAPER_RECOVERIES.labels(JobState.FAILED_TERMINAL.value, "DeadlineExceeded").inc(len(expired))
        return ReapResult(rescued=rescued, failed=failed, expired=len(expired))

    async def _pass(self) -> ReapResult:
        result = await self.run_once()
        if result.rescued or result.failed or result.expired:  # log only when something happened
            logger.info("Reaped: %s", result)
        return result

    async def run_forever(self, stop: asyncio.Event) -> None:
        interval_s = self._settings.interval_s
        await looping.run_forever(
            self._pass, stop, name="Reaper pass", logger=logger,
            transient=(OSError, asyncpg.PostgresError, asyncpg.InterfaceError),
            pause_s=lambda _: looping.jittered(interval_s),
            backoff=looping.Backoff(base_s=interval_s, cap_s=interval_s, jitter="none"),
        )
