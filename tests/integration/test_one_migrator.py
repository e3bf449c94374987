"""Only `lading migrate` changes the schema: a worker started against a database with pending
migrations applies none, reports not-ready with the reason and says why in its log, and starts
once `lading migrate` has run; the shared wait gives up when stopped."""

from __future__ import annotations

import asyncio
import pathlib
import secrets
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator

import aiohttp
import asyncpg
import pytest

from lading import health, schema
from lading.db import migrating
from lading.db import pool as dbpool
from tests.support import processes, waiting

LADING = [sys.executable, "-c", "from lading_cli.main import main; raise SystemExit(main())"]


@pytest.fixture
async def empty_database(admin_url: str) -> AsyncIterator[str]:
    name = f"lading_unmigrated_{secrets.token_hex(4)}"
    admin = await asyncpg.connect(admin_url)
    await admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield admin_url.rsplit("/", 1)[0] + f"/{name}"
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _readyz(port: int) -> tuple[int, str] | None:
    try:
        async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/readyz") as response:
            return response.status, await response.text()
    except aiohttp.ClientConnectionError:
        return None


async def _has_schema(dsn: str) -> bool:
    conn = await asyncpg.connect(dsn)
    try:
        return bool(await conn.fetchval("SELECT to_regclass('schema_migrations') IS NOT NULL"))
    finally:
        await conn.close()


@pytest.mark.slow
async def test_a_worker_waits_for_lading_migrate_and_says_why(empty_database: str, tmp_path: pathlib.Path) -> None:
    log = tmp_path / "worker.log"
    port = _free_port()
    worker = await processes.start_worker(
        empty_database, "lading-system/none", args=["--http", f"127.0.0.1:{port}"], log=log
    )
    try:
        await waiting.until(lambda: _log_says(log, "worker does not start yet: migrations pending: 0001"))
        answer = await _readyz(port)
        assert answer is not None
        status, body = answer
        assert status == 503 and body.startswith("migrations pending: 0001") and "lading migrate" in body
        assert not await _has_schema(empty_database), "the worker applied migrations"
        assert worker.returncode is None

        done = await asyncio.to_thread(
            subprocess.run, [*LADING, "migrate", "--database-url", empty_database],
            env=processes.environment(), capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        await waiting.until(lambda: _log_says(log, "worker: migrations applied; starting"))
        # Past the wait, it looks up its pool (none is registered here, so it then stops).
        await waiting.until(lambda: _log_says(log, "InferencePool lading-system/none is not registered"))
        assert (await health.readiness(empty_database)).ready
    finally:
        if worker.returncode is None:
            worker.send_signal(signal.SIGTERM)
        await processes.stop(worker)


async def _log_says(log: pathlib.Path, text: str) -> bool:
    return await asyncio.to_thread(lambda: log.exists() and text in log.read_text(errors="replace"))


async def test_the_wait_ends_once_migrations_are_applied(empty_database: str) -> None:
    stop = asyncio.Event()
    waiter = asyncio.create_task(schema.wait_until_current(empty_database, stop=stop, what="relay", poll_s=0.05))
    await waiting.until(lambda: _pending_seen(empty_database))
    assert not waiter.done()
    conn = await dbpool.connect(empty_database)
    try:
        await migrating.migrate(conn)
    finally:
        await conn.close()
    assert await asyncio.wait_for(waiter, 30) is True
    assert await schema.pending_versions(empty_database) == []


async def _pending_seen(dsn: str) -> bool:
    return bool(await schema.pending_versions(dsn))


async def test_the_wait_gives_up_when_stopped_and_applies_nothing(empty_database: str) -> None:
    stop = asyncio.Event()
    waiter = asyncio.create_task(schema.wait_until_current(empty_database, stop=stop, what="operator", poll_s=0.05))
    await asyncio.sleep(0)  # let it start looking
    stop.set()
    assert await asyncio.wait_for(waiter, 30) is False
    assert not await _has_schema(empty_database)


async def test_the_wait_backs_off_while_the_database_is_unreachable(caplog: pytest.LogCaptureFixture) -> None:
    stop = asyncio.Event()
    dsn = "postgresql://postgres@127.0.0.1:1/none"
    waiter = asyncio.create_task(schema.wait_until_current(dsn, stop=stop, what="worker", poll_s=0.01))

    async def said_so() -> bool:
        return any("worker waits for the database" in r.getMessage() for r in caplog.records)

    await waiting.until(said_so)
    stop.set()
    assert await asyncio.wait_for(waiter, 30) is False


SERVICES = {
    "operator": [*LADING, "operator", "--kubeconfig", "/nonexistent/kubeconfig", "--pool-namespaces", "acme"],
    "relay": [*LADING, "relay", "--amqp-url", "amqp://guest:guest@127.0.0.1:1/"],
    "worker": [sys.executable, "-m", "lading_worker", "--pool", "lading-system/none"],
}


@pytest.mark.parametrize("service", sorted(SERVICES))
async def test_sigterm_while_waiting_for_migrations_is_a_graceful_stop(
    service: str, empty_database: str, tmp_path: pathlib.Path
) -> None:
    """/readyz answers before the long-running part starts: a SIGTERM from then on (a rollout, a
    test) must end the process with status 0, never the default signal death."""
    port = _free_port()
    log = tmp_path / f"{service}.log"
    with log.open("ab") as handle:
        process = await asyncio.create_subprocess_exec(
            *SERVICES[service], "--database-url", empty_database, "--http", f"127.0.0.1:{port}",
            env=processes.environment(), stdout=handle, stderr=handle,
        )  # fmt: skip
    try:

        async def waiting_for_migrations() -> bool:
            answer = await _readyz(port)
            return answer is not None and answer[0] == 503

        await waiting.until(waiting_for_migrations)
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 30) == 0, log.read_text(errors="replace")[-3000:]
    finally:
        await processes.stop(process)
