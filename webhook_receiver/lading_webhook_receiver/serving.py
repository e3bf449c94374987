"""
Running a receiver: the connection pool and the HTTP server, as one context.

    async with serving.receiving(database_url=url, secrets=["whsec_..."], port=0) as server:
        server.url          # http://127.0.0.1:PORT/webhooks/lading, where deliveries go
        server.counts()     # metrics.Counts: accepted, duplicate_delivery, duplicate_intent, rejected
        await server.ledger_count()   # ERP records booked (or ledger.count(conn) on any connection)

Entering starts listening and the inbox cleaner (cleaning.py); leaving stops accepting, lets
deliveries in flight finish (up to the shutdown grace), then closes the pool. `lading receiver`
and `lading run` both use this.

The receiver never applies its migrations itself: `migrate(url)` does, called by `lading migrate
--receiver` (the chart's migration Job) and by `lading run` for the database it owns. A receiver
that starts while some are pending listens, but answers deliveries and /readyz with 503 and the
pending versions, says so in its log, and looks again until they are applied
(`lading.schema.wait_until_current` over the receiver's set).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any

import aiohttp.web
import asyncpg

from lading import looping, schema
from lading.db import migrating
from lading.db import pool as dbpool
from lading.webhooks import signing
from lading_webhook_receiver import adapters, app, cleaning, inbox, ledger, metrics, settings

logger = logging.getLogger(__name__)

SERVER_SETTINGS = {"application_name": "lading-receiver"}


@dataclasses.dataclass(frozen=True)
class RunningReceiver:
    host: str
    port: int
    observed: metrics.ReceiverMetrics
    """The receiver's counters (also served at /metrics)."""
    pool: asyncpg.Pool
    committer: inbox.GroupCommitter | None = None
    """The group committer recording deliveries (`queued`: deliveries waiting for the next group)."""

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def url(self) -> str:
        """Where a DeliveryEndpoint should point."""
        return self.base_url + settings.PATH

    def counts(self) -> metrics.Counts:
        return self.observed.counts()

    async def ledger_count(self) -> int:
        """ERP records in the ledger (through the receiver's own pool)."""
        async with self.pool.acquire() as conn:
            return await ledger.count(conn)


async def migrate(database_url: str) -> migrating.MigrateResult:
    """Apply the receiver's migrations to its database (idempotent, safe concurrently)."""
    conn = await asyncpg.connect(database_url, server_settings=SERVER_SETTINGS)
    try:
        return await migrating.migrate(conn, app.MIGRATIONS)
    finally:
        await conn.close()


@contextlib.asynccontextmanager
async def receiving(
        *,
        database_url: str,
        secrets: Sequence[str],
        host: str = "127.0.0.1",
        port: int = 0,
        config: settings.ReceiverSettings | None = None,
        adapter: adapters.ErpAdapter[Any] | None = None,
) -> AsyncIterator[RunningReceiver]:
    """Serve deliveries while the block runs (port 0: any free port, see `.port`)."""
    config = config or settings.ReceiverSettings()
    keys = signing.parse_keys(secrets)  # SecretFormatError never holds a secret
    erp = adapter if adapter is not None else adapters.by_name(config.adapter)
    pending = await schema.pending_versions(database_url, source=app.MIGRATIONS)
    pool = await asyncpg.create_pool(
        database_url,
        min_size=config.pool_min_size,
        max_size=config.pool_max_size,
        init=dbpool.init_connection,
        server_settings=SERVER_SETTINGS,
    )
    assert pool is not None
    try:
        observe = metrics.ReceiverMetrics()
        handlers = app.Receiver(pool=pool, keys=keys, adapter=erp, config=config, observe=observe)
        if pending:
            handlers.waiting_for = schema.describe(pending, migrator=app.MIGRATOR)
        runner = aiohttp.web.AppRunner(
            app.make_app(handlers),
            access_log=None,
            handler_cancellation=False,  # a client that gives up never cancels a transaction mid-way
            shutdown_timeout=config.shutdown_grace_s,
        )
        await runner.setup()
        try:
            site = aiohttp.web.TCPSite(runner, host, port)
            await site.start()
            bound = [address for address in runner.addresses if isinstance(address, tuple)]
            async with _until_current(database_url, handlers), _cleaning(pool, config, observe, handlers):
                yield RunningReceiver(host=host, port=int(bound[0][1]) if bound else port, observed=observe, pool=pool,
                                      committer=handlers.committer)
        finally:
            await runner.cleanup()
    finally:
        await pool.close()


@contextlib.asynccontextmanager
async def _cleaning(
        pool: asyncpg.Pool, config: settings.ReceiverSettings, observe: metrics.ReceiverMetrics, handlers: app.Receiver
) -> AsyncIterator[None]:
    """The inbox cleaner (cleaning.py) runs while the block runs, once the schema is current."""
    cleaner = cleaning.InboxCleaner(pool, config=config, observe=observe,
                                    schema_current=lambda: handlers.waiting_for is None)  # fmt: skip
    stop = asyncio.Event()
    [task] = looping.spawn([("inbox cleaner", cleaner.run_forever(stop))])
    try:
        yield
    finally:
        stop.set()
        outcome: object = (await asyncio.gather(task, return_exceptions=True))[0]
        if isinstance(outcome, BaseException) and not isinstance(outcome, asyncio.CancelledError):
            logger.error("the inbox cleaner failed: %s", type(outcome).__name__)


@contextlib.asynccontextmanager
async def _until_current(database_url: str, handlers: app.Receiver) -> AsyncIterator[None]:
    """While the block runs, wait for the receiver's pending migrations (if any) and open the door
    to deliveries once they are applied."""
    if handlers.waiting_for is None:
        yield
        return
    stop = asyncio.Event()

    async def wait() -> None:
        if await schema.wait_until_current(
            database_url, stop=stop, what="receiver", source=app.MIGRATIONS, migrator=app.MIGRATOR,
            waiting="listens and answers 503 migrations-pending",
        ):
            handlers.waiting_for = None

    waiting = looping.spawn([("receiver schema wait", wait())])
    try:
        yield
    finally:
        stop.set()
        for failed in await asyncio.gather(*waiting, return_exceptions=True):
            if isinstance(failed, BaseException) and not isinstance(failed, asyncio.CancelledError):
                logger.error("waiting for the receiver's migrations failed: %s", type(failed).__name__)
