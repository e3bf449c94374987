"""
Heartbeats: extend every lease this process owns in one statement, on an interval.

Zero rows updated for a job means ownership is lost (the reaper rescued it, the batch
was cancelled, or the lease ran out): its attempt is cancelled at once and never
commits. If heartbeats cannot reach the database at all, each attempt is abandoned
when our own conservative view of its lease runs out, before another worker can take
the job, so a worker cut off from PostgreSQL stops working on jobs it no longer owns.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging

import asyncpg

from lading import looping, metrics
from lading.db import conflicts, jobs
from lading.ids import PoolName, WorkerId
from lading.settings import LeaseSettings
from lading_worker import inflight

logger = logging.getLogger(__name__)

SAFETY_MARGIN_S = 1.0
"""Abandon an attempt this long before our view of its lease ends (clock drift, latency)."""


@dataclasses.dataclass(frozen=True)
class HeartbeatResult:
    extended: int = 0
    lost: int = 0


class Heartbeater:
    def __init__(
            self,
            db: asyncpg.Pool,
            in_flight: inflight.InFlight,
            *,
            pool: PoolName,
            worker_id: WorkerId,
            settings: LeaseSettings,
    ) -> None:
        self._db = db
        self._worker_id = worker_id
        self._in_flight = in_flight
        self._pool = pool
        self._settings = settings

    async def run_once(self) -> HeartbeatResult:
        attempts = self._in_flight.all()
        if not attempts:
            return HeartbeatResult()
        sent_mono = inflight.InFlight.now()
        async with self._db.acquire() as conn:
            owned = await conflicts.retrying(
                lambda: jobs.heartbeat_many(
                    conn,
                    [(a.job.id, a.job.fence) for a in attempts],
                    worker_id=self._worker_id,
                    lease_ttl_s=self._settings.ttl_s,
                ),
                what="Heartbeat",
            )
        lost = 0
        for attempt in attempts:
            if attempt.job.id in owned:
                attempt.lease_deadline_mono = sent_mono + self._settings.ttl_s
            elif self._lose(attempt):
                lost += 1
        return HeartbeatResult(extended=len(owned), lost=lost)

    def abandon_expired(self) -> int:
        """Cancel running attempts whose lease, as far as we know, is about to end."""
        now = inflight.InFlight.now()
        return sum(self._lose(a) for a in self._in_flight.all() if a.lease_deadline_mono - SAFETY_MARGIN_S <= now)

    def _lose(self, attempt: inflight.Attempt) -> bool:
        if attempt.phase is inflight.Phase.QUEUED:
            self._in_flight.remove(attempt.job.id)  # never started: just forget it
        elif attempt.phase is inflight.Phase.RUNNING and attempt.task is not None and not attempt.task.done():
            attempt.task.cancel()
        else:
            return False  # a committing attempt is settled by its compare-and-set
        metrics.LEASES_LOST.labels(self._pool).inc()
        return True

    async def _beat(self) -> int:
        """One heartbeat, then abandon what it could not extend; returns the attempts abandoned.
        A heartbeat that cannot reach the database is not an error of the loop: the abandonment
        that follows is exactly what must happen then."""
        try:
            result = await self.run_once()
            if result.lost:
                logger.warning("Lost %d leases; their attempts were cancelled", result.lost)
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            logger.warning("Heartbeat failed: %s", exc)
        abandoned = self.abandon_expired()
        if abandoned:
            logger.warning("Abandoned %d attempts whose leases could not be extended", abandoned)
        return abandoned

    def _pause_s(self, abandoned: int) -> float:
        """Look again sooner while attempts are being abandoned: more leases may be running out."""
        interval_s = self._settings.heartbeat_interval_s
        return min(interval_s, SAFETY_MARGIN_S * 2) if abandoned else interval_s

    async def run_forever(self, stop: asyncio.Event) -> None:
        interval_s = self._settings.heartbeat_interval_s
        await looping.run_forever(
            self._beat, stop, name="Heartbeat", logger=logger, transient=(), pause_s=self._pause_s,
            backoff=looping.Backoff(base_s=interval_s, cap_s=interval_s, jitter="none"),
        )
