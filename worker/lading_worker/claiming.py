"""
The claimer: keeps up to `concurrency` model calls in flight, claiming in batches.

One round trip claims up to `batch_size` jobs (READY or due RETRY_SCHEDULED, shared fairly
among the pool's tenants within their in-flight caps and token budgets, by aged priority
inside each tenant's share, SKIP LOCKED; docs/fairness.md) and opens their attempt rows.
Claimed jobs wait in a local queue (at most `prefetch` beyond the free slots) and each
starts as its own task, executor -> committer, as soon as a slot is free: a slot frees the
moment its model call returns. A second round trip after each claim (`reusing.Reuser`) says
which claimed jobs take an earlier accepted result or wait for a duplicate being extracted
instead of calling the model (docs/reuse.md); those go straight to the committer. It is skipped
when no claimed job may reuse (its batch or tenant turned reuse off): those all call the model. When there is
nothing to claim, the claimer sleeps until a NOTIFY says new work arrived for its pool, a slot
frees up, or the poll interval passes. When it stops, queued jobs that never started are
released for other workers at once.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import logging

import asyncpg

from lading import looping, metrics, tracing
from lading.db import jobs
from lading.db import reuse as reuse_db
from lading.ids import JobId, PoolName, WorkerId
from lading.jobs import states
from lading.settings import ClaimerSettings, LeaseSettings
from lading_worker import committing, executing, inflight, reusing

logger = logging.getLogger(__name__)

_ENDED_WELL = frozenset({states.JobState.SUCCEEDED, states.JobState.REVIEW_REQUIRED})
"""Attempts whose line is at debug level: a result stored, its job done or in review."""

NOTIFY_CHANNEL = "lading_jobs"
"""Channel the acceptance trigger notifies with the pool name."""


@dataclasses.dataclass(frozen=True)
class ClaimResult:
    claimed: int = 0


class Claimer:
    def __init__(
            self,
            db: asyncpg.Pool,
            in_flight: inflight.InFlight,
            *,
            pool: PoolName,
            worker_id: WorkerId,
            executor: executing.Executor,
            committer: committing.Committer,
            settings: ClaimerSettings,
            lease: LeaseSettings,
            reuser: reusing.Reuser | None = None,
    ) -> None:
        self._db = db
        self._reuser = reuser
        """Result reuse (docs/reuse.md); None: every claimed job calls the model."""
        self._in_flight = in_flight
        self._pool = pool
        self._worker_id = worker_id
        self._executor = executor
        self._committer = committer
        self._settings = settings
        self._lease = lease
        self.work_available = asyncio.Event()
        self._queue: collections.deque[inflight.Attempt] = collections.deque()
        self._paused_until_mono = 0.0
        """Set when an attempt found the pool's endpoint refusing everyone: claim nothing until
        then, without waiting for the database pause to be committed."""
        self._claimed_metric = metrics.JOBS_CLAIMED.labels(pool)
        self._in_flight_metric = metrics.IN_FLIGHT.labels(pool)

    @property
    def _capacity(self) -> int:
        """How many more jobs may be claimed now: free slots plus the prefetch allowance."""
        held = self._in_flight.running + self._in_flight.queued
        return self._settings.concurrency + self._settings.prefetch - held

    async def run_once(self) -> ClaimResult:
        capacity = self._capacity
        if capacity <= 0 or inflight.InFlight.now() < self._paused_until_mono:
            return ClaimResult()
        async with self._db.acquire() as conn:
            claimed = await jobs.claim_batch(
                conn,
                pool=self._pool,
                worker_id=self._worker_id,
                limit=min(capacity, self._settings.batch_size),
                lease_ttl_s=self._lease.ttl_s,
                reuse_key_of=None if self._reuser is None else self._reuser.producer.key_parts,
            )
            decisions: dict[JobId, reuse_db.Decision] = {}
            if self._reuser is not None and any(job.may_reuse is not False for job in claimed):
                decisions = await self._reuser.resolve(conn, claimed)
        now = inflight.InFlight.now()
        for job in claimed:
            attempt = inflight.Attempt(
                job=job, claimed_mono=now, lease_deadline_mono=now + self._lease.ttl_s, decision=decisions.get(job.id)
            )
            self._in_flight.add(attempt)
            self._queue.append(attempt)
        self.start_queued()
        if claimed:
            self._claimed_metric.inc(len(claimed))
        return ClaimResult(claimed=len(claimed))

    def start_queued(self) -> None:
        """Start queued jobs while slots are free (skipping any whose lease was lost meanwhile)."""
        while self._queue and self._in_flight.running < self._settings.concurrency:
            attempt = self._queue.popleft()
            if not self._in_flight.owns(attempt):
                continue
            self._in_flight.move(attempt, inflight.Phase.RUNNING)
            name = f"attempt {attempt.job.id}/{attempt.job.fence}"
            attempt.task = asyncio.create_task(self._attempt(attempt), name=name)
        self._in_flight_metric.set(self._in_flight.running)

    def _model_done(self, attempt: inflight.Attempt) -> None:
        self._in_flight.move(attempt, inflight.Phase.COMMITTING)
        self.start_queued()

    async def _attempt(self, attempt: inflight.Attempt) -> None:
        job = attempt.job
        ids = {"job_id": job.id, "attempt": job.attempt, "fence": job.fence, "tenant": job.tenant, "pool": job.pool}
        with tracing.span("lading.attempt", batch_id=job.batch_id, attributes=ids,
                          log_ids={**ids, "batch_id": job.batch_id}):
            await self._attempt_bound(attempt)

    async def _attempt_bound(self, attempt: inflight.Attempt) -> None:
        try:
            settled = None
            if attempt.decision is not None and self._reuser is not None:
                settled = self._reuser.finish(attempt.job, attempt.decision)
            if settled is not None:  # an earlier result taken, or a duplicate waited for: no model call
                self._model_done(attempt)
                finish = settled
            else:
                finish = await self._executor.run(
                    attempt.job, claimed_mono=attempt.claimed_mono, on_model_done=lambda: self._model_done(attempt)
                )
            if finish.pause_pool_s is not None:
                self._paused_until_mono = max(self._paused_until_mono, inflight.InFlight.now() + finish.pause_pool_s)
            # One line per attempt, ids bound by the caller; classes only, never text or output. At
            # debug level when it ended well (the committer logs a count per commit group at info):
            # a formatted line costs 15-25 us, a tenth of a no-op attempt's worker CPU.
            level = logging.DEBUG if finish.to in _ENDED_WELL else logging.INFO
            if logger.isEnabledFor(level):
                logger.log(
                    level, "Attempt finished: %s -> %s%s", finish.outcome, finish.to.value,
                    f" ({finish.error_class})" if finish.error_class else "",
                )
            await self._committer.submit(finish)
        except asyncio.CancelledError:
            logger.info("Attempt %s/%s cancelled; nothing committed", attempt.job.id, attempt.job.fence)
        except Exception:
            # The lease expires and the reaper reschedules the job; never crash the worker.
            logger.exception("Attempt %s/%s crashed; leaving it to lease expiry", attempt.job.id, attempt.job.fence)
        finally:
            self._in_flight.remove(attempt.job.id)
            self.start_queued()

    async def release_queued(self) -> int:
        """Give back jobs claimed ahead that never started (at shutdown)."""
        queued = [a for a in self._queue if self._in_flight.owns(a) and a.phase is inflight.Phase.QUEUED]
        self._queue.clear()
        if not queued:
            return 0
        try:
            async with self._db.acquire() as conn:
                released = await jobs.release_many(
                    conn, [(a.job.id, a.job.fence) for a in queued], worker_id=self._worker_id
                )
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            logger.warning("Could not release %d unstarted jobs; their leases will expire: %s", len(queued), exc)
            released = set()
        for attempt in queued:
            self._in_flight.remove(attempt.job.id)
        return len(released)

    def notified(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        if payload == self._pool:
            self.work_available.set()

    async def run_forever(self, stop: asyncio.Event) -> None:
        listener = await self._listen()
        try:
            while not stop.is_set():
                if self._capacity <= 0:
                    self._in_flight.changed.clear()
                    await looping.wait_or_stop(stop, self._settings.poll_interval_s, wake=self._in_flight.changed)
                    continue
                self.work_available.clear()
                try:
                    result = await self.run_once()
                except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
                    logger.warning("Claim failed: %s", exc)
                    await looping.wait_or_stop(stop, looping.jittered(self._settings.poll_interval_s))
                    continue
                if result.claimed == 0:
                    await looping.wait_or_stop(
                        stop, looping.jittered(self._settings.poll_interval_s), wake=self.work_available
                    )
        finally:
            released = await self.release_queued()
            if released:
                logger.info("Released %d jobs claimed ahead that never started", released)
            if listener is not None:
                with contextlib.suppress(Exception):
                    await listener.remove_listener(NOTIFY_CHANNEL, self.notified)
                    await self._db.release(listener)

    async def _listen(self) -> asyncpg.Connection | None:
        """A dedicated pooled connection for LISTEN; polling still works without it."""
        try:
            conn: asyncpg.Connection = await self._db.acquire()
            await conn.add_listener(NOTIFY_CHANNEL, self.notified)
        except (OSError, asyncpg.PostgresError) as exc:
            logger.warning("Cannot LISTEN for new work, polling only: %s", exc)
            return None
        return conn
