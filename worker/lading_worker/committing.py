"""
Group commit: many finished attempts applied in one compare-and-set statement.

Each attempt awaits its own verdict (applied, or stale and discarded), so the
per-attempt semantics stay exact while the round trips are shared: at high throughput
one statement commits up to `commit_batch_size` attempts with their attempt, result and
outbox rows. If the database is unreachable the batch is retried; leases that expire
meanwhile make those completions stale, never double-applied.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging

import asyncpg
import prometheus_client

from lading import metrics
from lading.db import jobs, registry
from lading.ids import PoolName, WorkerId
from lading.jobs import transitions
from lading.settings import ClaimerSettings
from lading_worker import loops

logger = logging.getLogger(__name__)

RETRY_DELAY_S = 0.5
"""Pause before retrying a batch whose statement failed (database restart, network blip)."""


@dataclasses.dataclass(frozen=True)
class CommitResult:
    applied: int = 0
    stale: int = 0


class Committer:
    def __init__(
            self,
            db: asyncpg.Pool,
            *,
            worker_id: WorkerId,
            pool: PoolName,
            settings: ClaimerSettings,
    ) -> None:
        self._db = db
        self._worker_id = worker_id
        self._pool = pool
        self._settings = settings
        self._pending: list[tuple[transitions.Finish, asyncio.Future[bool]]] = []
        self._wake = asyncio.Event()
        self._stale_metric = metrics.STALE_COMPLETIONS.labels(pool)
        self._finished_metrics: dict[tuple[str, str], prometheus_client.Counter] = {}

    async def submit(self, finish: transitions.Finish) -> bool:
        """Queue `finish`; True once committed, False if it was stale and discarded."""
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._pending.append((finish, future))
        self._wake.set()
        return await future

    async def run_once(self) -> CommitResult:
        batch = self._pending[: self._settings.commit_batch_size]
        if not batch:
            return CommitResult()
        async with self._db.acquire() as conn:
            applied = await jobs.finish_many(conn, [f for f, _ in batch], worker_id=self._worker_id)
            pauses = [f for f, _ in batch if f.pause_pool_s is not None and f.job_id in applied]
            if pauses:
                longest = max(pauses, key=lambda f: f.pause_pool_s or 0.0)
                await registry.pause_pool(
                    conn, name=self._pool, seconds=longest.pause_pool_s or 0.0, reason=longest.error_class or ""
                )
                logger.warning(
                    "Pool %s paused for %.0f s: %s", self._pool, longest.pause_pool_s, longest.error_class
                )
        del self._pending[: len(batch)]
        metrics.COMMIT_BATCH.observe(len(batch))
        stale = 0
        for finish, future in batch:
            ok = finish.job_id in applied
            if ok:
                self._finished_metric(finish.outcome, finish.to.value).inc()
            else:
                stale += 1
                self._stale_metric.inc()
            if not future.done():
                future.set_result(ok)
        return CommitResult(applied=len(batch) - stale, stale=stale)

    def _finished_metric(self, outcome: str, state: str) -> prometheus_client.Counter:
        key = (outcome, state)
        child = self._finished_metrics.get(key)
        if child is None:  # label lookups are a measurable cost at thousands of commits per second
            child = self._finished_metrics[key] = metrics.ATTEMPTS_FINISHED.labels(self._pool, outcome, state)
        return child

    async def run_forever(self, stop: asyncio.Event) -> None:
        """Commit until `stop` is set and nothing is pending."""
        while not (stop.is_set() and not self._pending):
            if not self._pending:
                self._wake.clear()
                await loops.wait_or_stop(stop, 1.0, wake=self._wake)
                continue
            if len(self._pending) < self._settings.commit_batch_size:
                await asyncio.sleep(self._settings.commit_linger_s)
            try:
                result = await self.run_once()
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
                logger.warning("Commit of %d attempts failed, retrying: %s", len(self._pending), exc)
                await asyncio.sleep(RETRY_DELAY_S)
                continue
            if result.stale:
                logger.info("Discarded %d stale completions (lease lost or fence superseded)", result.stale)
