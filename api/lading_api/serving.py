"""
Running the intake: its two connection pools and the HTTP server, as one context.

    async with serving.serving(database_url=url, port=0) as server:
        server.base_url     # http://127.0.0.1:PORT

Two pools, so no request waits for a connection another request holds while it waits itself: the
`guards` pool holds the open transaction of each batch POST's Idempotency-Key record, the `db` pool
does the work (tokens, acceptance with the records of document POSTs, reads). Leaving stops
accepting connections, lets requests in flight finish (up to the shutdown grace), then closes the
pools.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import AsyncIterator

import aiohttp.web
import asyncpg

from lading.db import pool as dbpool
from lading.documents import fetching
from lading_api import app, kube_auth, openapi
from lading_api.settings import ApiSettings

SERVER_SETTINGS = {"application_name": "lading-api", "jit": "off"}


@dataclasses.dataclass(frozen=True)
class RunningApi:
    host: str
    port: int

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"


async def _pool(dsn: str, size: int) -> asyncpg.Pool:
    """No connection is opened up front: the intake starts (and answers 503) while the database is down."""
    created = await asyncpg.create_pool(
        dsn, min_size=0, max_size=size, init=dbpool.init_connection, server_settings=SERVER_SETTINGS,
        reset=dbpool.keep_session,  # a POST waited for the reset's round trip: nothing needs it
    )  # fmt: skip
    assert created is not None
    return created



@contextlib.asynccontextmanager
async def serving(
        *,
        database_url: str,
        host: str = "127.0.0.1",
        port: int = 0,
        settings: ApiSettings | None = None,
        kube: kube_auth.KubeSettings | None = None,
) -> AsyncIterator[RunningApi]:
    """Serve the intake while the block runs (port 0: any free port, see `.port`)."""
    settings = settings or ApiSettings()
    reviewer = None if kube is None else kube_auth.KubeReviewer(kube)
    db = await _pool(database_url, settings.pool_max_size)
    try:
        guards = await _pool(database_url, settings.pool_max_size)
        try:
            handlers = app.Intake(
                db=db, guards=guards, dsn=database_url, settings=settings,
                documents=fetching.settings_from_env(os.environ), openapi=openapi.document(), kube=reviewer,
            )  # fmt: skip
            runner = aiohttp.web.AppRunner(
                app.make_app(handlers, max_body_bytes=settings.max_body_bytes),
                access_log=None,
                handler_cancellation=False,  # a client that gives up never cancels an acceptance mid-way
                shutdown_timeout=settings.shutdown_grace_s,
            )
            await runner.setup()
            try:
                site = aiohttp.web.TCPSite(runner, host, port)
                await site.start()
                bound = [address for address in runner.addresses if isinstance(address, tuple)]
                yield RunningApi(host=host, port=int(bound[0][1]) if bound else port)
            finally:
                await runner.cleanup()
        finally:
            await guards.close()
    finally:
        await db.close()
        if reviewer is not None:
            await reviewer.close()
