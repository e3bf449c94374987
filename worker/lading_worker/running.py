"""
The Worker: every loop of one worker process wired as a named task, here and nowhere else.

    claimer          claims jobs and starts attempts        (stops first on shutdown)
    heartbeater      extends leases of in-flight attempts    (runs until attempts drained)
    committer        group-commits finished attempts         (runs until attempts drained)
    reaper           rescues expired leases, expires deadlines
    delivery lane N  sends due deliveries to ERP webhooks    (when configured; dispatching.py)
    delivery reaper  moves on deliveries whose dispatcher vanished mid-attempt
    delivery health  endpoint gauges, deliveries waiting for a secret
    outbox relay     outbox rows to RabbitMQ                 (with --amqp-url; relaying.py)
    ingress consumer RabbitMQ events into the inbox          (with --amqp-url; consuming.py)
    limiter client   the pool's shared rate limiter (lading.limiting), for non-builtin pools
    gauge refresher  database gauges, one elected process at a time (lading_elected.gauges; electing)
    cleaner          deletes rows past their retention, one elected process (cleaning.py; electing)
    GPU allocator    prices the GPU time of pools priced by the GPU hour, one elected process
                     (lading_elected.gpu_costs; electing)

The elected three run in `run_worker`, or, under `lading worker --processes N`, in the supervisor
(supervising.py) instead of in each of its worker processes.

If any loop dies, everything stops and the error is re-raised. On stop (SIGTERM): stop
claiming, let in-flight attempts finish within the grace period while heartbeats and
commits go on, then cancel what is left: those jobs keep their rows and are rescued by a
reaper after their lease expires. An accepted job is never lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import secrets
import socket
from collections.abc import AsyncIterator

import asyncpg

from lading import costing, limiting, looping, reuse
from lading.db import pool as dbpool
from lading.db import registry, spend
from lading.documents import fetching
from lading.ids import PoolName, WorkerId
from lading.models import specs
from lading.providers import base, factory
from lading.settings import WorkerProcessSettings
from lading_elected import gauges, gpu_costs
from lading_worker import (
    broker,
    claiming,
    cleaning,
    committing,
    dispatching,
    executing,
    heartbeating,
    inflight,
    reaping,
    reusing,
)

logger = logging.getLogger(__name__)


def new_worker_id() -> WorkerId:
    return WorkerId(f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(2)}")


class PoolNotFound(LookupError):
    """The worker was started for a pool that is not registered in the database."""


class Worker:
    def __init__(
            self,
            db: asyncpg.Pool,
            *,
            settings: WorkerProcessSettings,
            provider: base.Provider | None = None,
            api_key: str | None = None,
            worker_id: WorkerId | None = None,
            delivery: dispatching.DeliveryConfig | None = None,
            events: broker.BrokerConfig | None = None,
            provider_url: str | None = None,
    ) -> None:
        self.db = db
        self._provider_url = provider_url
        """Where a vLLM pool's Service answers (the operator sets $LADING_PROVIDER_URL)."""
        self.events = events
        """When set, this process also runs the outbox relay and the ingress consumer."""
        self.delivery = delivery
        """When set, this process also runs a delivery dispatcher (any number of replicas may)."""
        self.settings = settings
        self.provider = provider
        self._api_key = api_key
        self.worker_id = worker_id or new_worker_id()
        self.inflight = inflight.InFlight()
        self.fetcher = fetching.Fetcher(settings=settings.documents)
        """Reads documents given by manifest (file:// under the document roots, http(s)://)."""

    async def _provider(self) -> base.Provider:
        if self.provider is not None:
            return self.provider
        async with self.db.acquire() as conn:
            pool = await registry.get_pool(conn, name=PoolName(self.settings.pool))
        if pool is None:
            raise PoolNotFound(f"InferencePool {self.settings.pool} is not registered")
        return factory.for_pool(pool, api_key=self._api_key, base_url=self._provider_url)

    async def _limiter(self, pool: PoolName) -> limiting.PoolLimiter | None:
        """The pool's shared limiter; none for builtin pools, which have no upstream to protect."""
        async with self.db.acquire() as conn:
            row = await registry.get_pool(conn, name=pool)
        if row is None or row.provider == "builtin":
            return None
        return limiting.PoolLimiter(self.db, pool=pool, limits=limiting.Limits.from_spec(row.spec))

    async def run(self, stop: asyncio.Event) -> None:
        provider = await self._provider()
        try:
            await self._run(stop, provider)
        finally:
            if provider is not self.provider:  # we built it, we close it (HTTP sessions)
                await base.close(provider)
            await self.fetcher.close()

    async def _run(self, stop: asyncio.Event, provider: base.Provider) -> None:
        s = self.settings
        pool = PoolName(s.pool)
        committer = committing.Committer(self.db, worker_id=self.worker_id, pool=pool, settings=s.claimer)
        limiter = await self._limiter(pool)
        async with self.db.acquire() as conn:  # the pool's default currency, for invoice-strict-v2
            row = await registry.get_pool(conn, name=pool)
        default_currency = specs.stored_default_currency(row.spec) if row is not None else None
        pricing = costing.Pricing.from_stored(row.spec) if row is not None else None
        executor = executing.Executor(
            provider=provider, settings=s.attempt, limiter=limiter, fetcher=self.fetcher,
            default_currency=default_currency, pricing=pricing,
            note_reservation=functools.partial(spend.note_reservation, self.db),
        )
        claimer = claiming.Claimer(
            self.db,
            self.inflight,
            pool=pool,
            worker_id=self.worker_id,
            executor=executor,
            committer=committer,
            settings=s.claimer,
            lease=s.lease,
            reuser=None if row is None else reusing.Reuser(
                producer=reuse.producer_of(row), worker_id=self.worker_id, attempt=s.attempt
            ),
        )
        heartbeater = heartbeating.Heartbeater(
            self.db, self.inflight, pool=pool, worker_id=self.worker_id, settings=s.lease
        )
        reaper = reaping.Reaper(self.db, settings=s.reaper, attempt=s.attempt)

        stop_claiming, stop_support = asyncio.Event(), asyncio.Event()
        claim_task = asyncio.create_task(claimer.run_forever(stop_claiming), name="claimer")
        support = [
            asyncio.create_task(heartbeater.run_forever(stop_support), name="heartbeater"),
            asyncio.create_task(committer.run_forever(stop_support), name="committer"),
            asyncio.create_task(reaper.run_forever(stop_support), name="reaper"),
        ]
        dispatcher = None
        if self.delivery is not None:
            dispatcher = self.delivery.dispatcher(self.db, owner=f"{self.worker_id}-dispatcher")
            support += looping.spawn(dispatcher.loops(stop_support))
        if self.events is not None:
            loops = self.events.loops(self.db, owner=f"{self.worker_id}-relay")
            support += looping.spawn((name, loop(stop_support)) for name, loop in loops)
        stopper = asyncio.create_task(stop.wait(), name="stop signal")
        logger.info("Worker %s started for pool %s", self.worker_id, pool)
        try:
            done, _ = await asyncio.wait([stopper, claim_task, *support], return_when=asyncio.FIRST_COMPLETED)
            stop_claiming.set()
            await claim_task  # re-raises if the claimer died
            for task in done:
                if task is not stopper:
                    task.result()  # a support loop died: re-raise after stopping the claimer
            await self._drain()
        finally:
            stop_claiming.set()
            stop_support.set()
            stopper.cancel()
            for task in self.inflight.tasks():
                task.cancel()
            results = await asyncio.gather(claim_task, *support, stopper, return_exceptions=True)
            for result in results:
                if isinstance(result, BaseException) and not isinstance(result, asyncio.CancelledError):
                    logger.error("Worker loop failed: %r", result)
            if dispatcher is not None:
                await dispatcher.close()  # its HTTP session
            if limiter is not None:
                await limiter.close()  # its LISTEN connection goes back to the pool before the pool closes
        logger.info("Worker %s stopped", self.worker_id)

    async def _drain(self) -> None:
        tasks = self.inflight.tasks()
        if not tasks:
            return
        logger.info("Draining %d in-flight attempts (grace %.0f s)", len(tasks), self.settings.shutdown_grace_s)
        _, pending = await asyncio.wait(tasks, timeout=self.settings.shutdown_grace_s)
        for task in pending:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*pending, return_exceptions=True)
        if pending:
            logger.warning("%d attempts did not finish in the grace period; their leases will expire", len(pending))


async def run_worker(
        dsn: str,
        settings: WorkerProcessSettings,
        stop: asyncio.Event,
        *,
        api_key: str | None = None,
        provider_url: str | None = None,
        delivery: dispatching.DeliveryConfig | None = None,
        events: broker.BrokerConfig | None = None,
        cleaner: cleaning.CleanerSettings | None = None,
        elected: bool = True,
) -> None:
    """Open a pool sized for the worker's loops and run one Worker until `stop`. `elected` False:
    this process does not stand for the elected jobs (its supervisor does, `lading worker --processes`)."""
    # No reset query on release: the limiter acquires and releases per attempt, and the worker's
    # connections keep no session state (`dbpool.keep_session`). Every statement planned for its
    # own arguments (`dbpool.CUSTOM_PLANS`: a generic plan of the claim or the group commit made on
    # a nearly empty job_attempts scans all of it per job once the table has grown).
    db = await dbpool.create_pool(dsn, min_size=2, max_size=8 + (events.connections if events else 0),
                                  reset_sessions=False, custom_plans=True)
    try:
        async with contextlib.AsyncExitStack() as stack:
            if elected:
                await stack.enter_async_context(electing(dsn, cleaner=cleaner))
            await Worker(
                db, settings=settings, api_key=api_key, provider_url=provider_url, delivery=delivery, events=events
            ).run(stop)
    finally:
        await db.close()


@contextlib.asynccontextmanager
async def electing(dsn: str, *, cleaner: cleaning.CleanerSettings | None = None) -> AsyncIterator[None]:
    """Stand for the elected jobs for the body of an `async with`: one process across all replicas
    refreshes the database gauges; one, elected apart, deletes what is past its retention; and one
    prices the GPU time of pools priced by the GPU hour, interval by interval."""
    async with gauges.refreshing(dsn), cleaning.cleaning(dsn, settings=cleaner), gpu_costs.allocating(dsn):
        yield
