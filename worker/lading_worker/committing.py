"""
Group commit: many finished attempts applied in one compare-and-set statement.

Each attempt awaits its own verdict (applied, or stale and discarded), so the
per-attempt semantics stay exact while the round trips are shared: at high throughput
one statement commits up to `commit_batch_size` attempts with their attempt, result and
outbox rows. If the database is unreachable the batch is retried; leases that expire
meanwhile make those completions stale, never double-applied. Attempts that took an earlier
accepted result (`transitions.reused`, docs/reuse.md) are applied by their own statement in the
same round (`reuse.finish_reused_many`), with the same compare-and-set.

A data error is not unavailability: a value PostgreSQL cannot store (lading.storable) fails
the statement for the whole group, and retrying it would fail for ever while the heartbeater
kept the leases alive. The group is split instead (`storable.isolate`, about 2·log₂(n) more
statements for one bad attempt in n) until every good attempt is committed and each bad one is
alone; that one is committed as FAILED_TERMINAL with error class UNSTORABLE and an error naming
the refused field (`transitions.unstorable`). Should even that be refused, its submitter is told
"not applied", the error is logged once, and the lease runs out: nothing is retried here.

    finish_many(group) ─ok──────────▶ every attempt answered (applied or stale)
          │ data error
          ▼
    split in halves ──▶ ... ──▶ one attempt refused ──▶ finish_many([unstorable(it)])
                                                          ├─ok────▶ FAILED_TERMINAL (UNSTORABLE)
                                                          └─refused▶ not applied, logged once
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
from collections.abc import Mapping, Sequence

import asyncpg
import prometheus_client

from lading import looping, metrics, storable
from lading.db import conflicts, jobs, registry, reuse
from lading.ids import PoolName, WorkerId
from lading.jobs import transitions
from lading.settings import ClaimerSettings

logger = logging.getLogger(__name__)

RETRY_DELAY_S = 0.5
"""Pause before retrying a batch whose statement failed (database restart, network blip)."""


@dataclasses.dataclass(frozen=True)
class CommitResult:
    applied: int = 0
    """Attempts committed, the UNSTORABLE replacements included."""
    stale: int = 0
    """Attempts discarded: the lease was lost or the fence superseded."""
    unstorable: int = 0
    """Attempts the database refused to store, committed as FAILED_TERMINAL (UNSTORABLE) instead."""
    lost: int = 0
    """Attempts whose UNSTORABLE replacement was refused too: not committed, left to lease expiry."""
    states: Mapping[str, int] = dataclasses.field(default_factory=dict)
    """How many of the applied attempts left their job in each state."""


Entry = tuple[transitions.Finish, asyncio.Future[bool]]
"""A submitted attempt and the future its submitter awaits."""


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
        self._pending: list[Entry] = []
        self._wake = asyncio.Event()
        self._stale_metric = metrics.STALE_COMPLETIONS.labels(pool)
        self._reused_metric = metrics.RESULTS_REUSED.labels(pool)
        self._finished_metrics: dict[tuple[str, str], prometheus_client.Counter] = {}

    async def submit(self, finish: transitions.Finish) -> bool:
        """Queue `finish`; True once committed (as given, or replaced by its UNSTORABLE failure),
        False if it was stale and discarded or could not be stored at all."""
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._pending.append((finish, future))
        self._wake.set()
        return await future

    async def run_once(self) -> CommitResult:
        """Commit the oldest pending attempts in one statement. A data error (a value PostgreSQL
        cannot store) splits the group until the good attempts are committed and each bad one is
        alone; that one is committed as FAILED_TERMINAL (UNSTORABLE). Any other error propagates
        with the attempts not yet committed still pending: the caller retries them."""
        batch = self._pending[: self._settings.commit_batch_size]
        if not batch:
            return CommitResult()
        committed: dict[asyncio.Future[bool], transitions.Finish | None] = {}
        lost: set[asyncio.Future[bool]] = set()
        unstorable = 0
        try:
            async with self._db.acquire() as conn:
                refused = await self._finish(conn, batch, committed)
                if refused:
                    replacements = [
                        (transitions.unstorable(finish, sqlstate=exc.sqlstate), future)
                        for (finish, future), exc in refused
                    ]
                    for (finish, future), _ in await self._finish(conn, replacements, committed):
                        committed[future] = None
                        lost.add(future)
                        logger.error(
                            "Attempt %s/%s could not be stored, nor its failure (%s); left to lease expiry",
                            finish.job_id, finish.fence, finish.error,
                        )
                    for finish, future in replacements:
                        if committed.get(future) is finish:
                            unstorable += 1
                            logger.warning(
                                "Attempt %s/%s ended FAILED_TERMINAL (%s): %s",
                                finish.job_id, finish.fence, finish.error_class, finish.error,
                            )
                await self._pause(conn, [f for f in committed.values() if f is not None])
        finally:
            states, stale = self._resolve(batch, committed, lost=lost)
        metrics.COMMIT_BATCH.observe(len(batch))
        return CommitResult(
            applied=sum(states.values()), stale=stale, unstorable=unstorable, lost=len(lost), states=states
        )

    async def _finish(
            self,
            conn: asyncpg.Connection,
            entries: Sequence[Entry],
            committed: dict[asyncio.Future[bool], transitions.Finish | None],
    ) -> list[tuple[Entry, asyncpg.PostgresError]]:
        """Apply `entries`, isolating data errors; record in `committed` the finish each group
        applied (None: stale) as soon as its statement returns. Returns the refused entries."""

        async def apply(group: Sequence[Entry]) -> None:
            applied = await conflicts.retrying(
                lambda: jobs.finish_many(conn, [f for f, _ in group], worker_id=self._worker_id), what="Group commit"
            )
            for finish, future in group:
                committed[future] = finish if finish.job_id in applied else None

        reused = [entry for entry in entries if entry[0].reused_from is not None]
        if reused:
            # Their results come from the database, so they are storable: no isolation needed.
            taken = await conflicts.retrying(
                lambda: reuse.finish_reused_many(conn, [f for f, _ in reused], worker_id=self._worker_id),
                what="Group commit of reused results",
            )
            for finish, future in reused:
                committed[future] = finish if finish.job_id in taken else None
            entries = [entry for entry in entries if entry[0].reused_from is None]
        return (await storable.isolate(entries, apply)).refused

    async def _pause(self, conn: asyncpg.Connection, applied: Sequence[transitions.Finish]) -> None:
        pauses = [f for f in applied if f.pause_pool_s is not None]
        if not pauses:
            return
        longest = max(pauses, key=lambda f: f.pause_pool_s or 0.0)
        await registry.pause_pool(
            conn, name=self._pool, seconds=longest.pause_pool_s or 0.0, reason=longest.error_class or ""
        )
        logger.warning("Pool %s paused for %.0f s: %s", self._pool, longest.pause_pool_s, longest.error_class)

    def _resolve(
            self,
            batch: Sequence[Entry],
            committed: dict[asyncio.Future[bool], transitions.Finish | None],
            *,
            lost: set[asyncio.Future[bool]],
    ) -> tuple[collections.Counter[str], int]:
        """Answer every attempt of `batch` with a verdict and drop it from the queue; those
        without one (the statement failed before their group ran) stay queued. (the applied
        attempts by the state they left their job in, stale)."""
        states: collections.Counter[str] = collections.Counter()
        stale = 0
        for _, future in batch:
            if future not in committed:
                continue
            finish = committed[future]
            if finish is not None:
                states[finish.to.value] += 1
                self._finished_metric(finish.outcome, finish.to.value).inc()
                if finish.reused_from is not None:
                    self._reused_metric.inc()
            elif future not in lost:
                stale += 1
                self._stale_metric.inc()
            if not future.done():
                future.set_result(finish is not None)
        if len(committed) == len(batch):
            del self._pending[: len(batch)]  # the usual case: submit() only appends
        else:
            self._pending = [entry for entry in self._pending if entry[1] not in committed]
        return states, stale

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
                await looping.wait_or_stop(stop, 1.0, wake=self._wake)
                continue
            if len(self._pending) < self._settings.commit_batch_size:
                await asyncio.sleep(self._settings.commit_linger_s)
            try:
                result = await self.run_once()
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
                logger.warning("Commit of %d attempts failed, retrying: %s", len(self._pending), exc)
                await asyncio.sleep(RETRY_DELAY_S)
                continue
            if result.applied and logger.isEnabledFor(logging.INFO):
                # One line per commit group rather than per attempt (each attempt's own line is at
                # debug level, or info when it did not end well: claiming.Claimer._attempt_bound).
                logger.info("Committed %d attempts: %s", result.applied, _counts(result.states))
            if result.stale:
                logger.info("Discarded %d stale completions (lease lost or fence superseded)", result.stale)


def _counts(states: Mapping[str, int]) -> str:
    """`198 SUCCEEDED, 2 RETRY_SCHEDULED`: the most frequent first."""
    return ", ".join(f"{n} {state}" for state, n in sorted(states.items(), key=lambda item: (-item[1], item[0])))
