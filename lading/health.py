"""
The HTTP face every long-running Lading process shows its platform: Prometheus metrics and
the probes Kubernetes uses.

    GET /metrics   Prometheus text format (every metric in lading/metrics.py)
    GET /healthz   liveness: 200 while the process's event loop answers; deliberately not
                   tied to PostgreSQL, so a database outage never gets healthy pods killed.
                   A supervisor (`lading worker --processes N`) adds its own check: 200 while
                   every worker process runs, 503 naming how many do otherwise
    GET /readyz    readiness: 200 only when PostgreSQL answers within a deadline and no
                   migration is pending; 503 with the reason otherwise

The readiness check opens its own short connection each time (bounded by a timeout) so it
reports the database as the process would find it, not as a pooled connection remembers it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Callable

import aiohttp.web
import asyncpg
import prometheus_client

from lading import metrics, schema
from lading.db import migrating

READINESS_TIMEOUT_S = 2.0
"""A database slower than this to answer `SELECT 1` counts as unavailable."""


@dataclasses.dataclass(frozen=True)
class Readiness:
    ready: bool
    reason: str


async def readiness(dsn: str, *, timeout_s: float = READINESS_TIMEOUT_S) -> Readiness:
    try:
        async with asyncio.timeout(timeout_s):
            conn = await asyncpg.connect(dsn)
            try:
                pending = await migrating.pending(conn)
            finally:
                await conn.close()
    except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        return Readiness(False, f"database unavailable: {type(exc).__name__}")
    if pending:
        return Readiness(False, schema.describe(pending))
    return Readiness(True, "ok")


Liveness = Callable[[], tuple[bool, str]]
"""A process's own liveness check beyond its event loop: (alive, what to say)."""


def make_app(
        dsn: str,
        *,
        registry: prometheus_client.CollectorRegistry | None = None,
        liveness: Liveness | None = None,
) -> aiohttp.web.Application:
    """`registry`: what /metrics serves (default `metrics.REGISTRY`); `liveness`: /healthz's check."""
    served = registry if registry is not None else metrics.REGISTRY

    async def serve_metrics(_: aiohttp.web.Request) -> aiohttp.web.Response:
        body = prometheus_client.generate_latest(served)
        return aiohttp.web.Response(body=body, headers={"Content-Type": prometheus_client.CONTENT_TYPE_LATEST})

    async def healthz(_: aiohttp.web.Request) -> aiohttp.web.Response:
        if liveness is None:
            return aiohttp.web.Response(text="ok\n")
        alive, what = liveness()
        return aiohttp.web.Response(text=what + "\n", status=200 if alive else 503)

    async def readyz(_: aiohttp.web.Request) -> aiohttp.web.Response:
        state = await readiness(dsn)
        return aiohttp.web.Response(text=state.reason + "\n", status=200 if state.ready else 503)

    app = aiohttp.web.Application()
    app.router.add_get("/metrics", serve_metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    return app


def parse_listen(value: str) -> tuple[str, int]:
    """`HOST:PORT` (IPv6 hosts in brackets) -> (host, port); a clear ValueError otherwise."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"expected HOST:PORT, got {value!r}")
    return host.strip("[]"), int(port)


@contextlib.asynccontextmanager
async def serving(
        dsn: str,
        *,
        host: str,
        port: int,
        registry: prometheus_client.CollectorRegistry | None = None,
        liveness: Liveness | None = None,
) -> AsyncIterator[int]:
    """Serve the app while the block runs; yields the bound port (useful with port 0)."""
    runner = aiohttp.web.AppRunner(make_app(dsn, registry=registry, liveness=liveness), access_log=None)
    await runner.setup()
    site = aiohttp.web.TCPSite(runner, host, port)
    await site.start()
    try:
        bound = [address for address in runner.addresses if isinstance(address, tuple)]
        yield int(bound[0][1]) if bound else port
    finally:
        await runner.cleanup()
