"""
Multi-row writers lock their rows in ascending key order whatever order their input comes in
(docs/architecture.md, "Lock order").

How it is observed: another transaction holds the row with the highest key; the statement runs
with its input in descending order and blocks. If it locks in ascending order it blocks on that
last row already holding every lower one (a NOWAIT probe finds each of them locked); in input
order it would block on the first row holding nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
import pytest

from lading.db import deliveries, jobs, outbox
from lading.db import pool as dbpool
from lading.delivery.states import DeliveryState
from tests.integration.delivery import helpers
from tests.support import factories, waiting

Statement = Callable[[asyncpg.Connection], Awaitable[Any]]


async def _probe_locked(conn: asyncpg.Connection, select_for_update_nowait: str, key: Any) -> bool:
    try:
        async with conn.transaction():
            await conn.execute(select_for_update_nowait, key)
    except asyncpg.LockNotAvailableError:
        return True
    return False


async def _waiting_on_a_lock(observer: asyncpg.Connection, pid: int) -> bool:
    return bool(await observer.fetchval("SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $1", pid))


async def _assert_locks_ascending(
        database_url: str, *, probe: str, keys: list[Any], statement: Statement,
) -> None:
    """`probe`: `SELECT 1 FROM <table> WHERE <key> = $1 FOR UPDATE NOWAIT`; `keys` ascending."""
    blocker, runner, observer = [await dbpool.connect(database_url) for _ in range(3)]
    try:
        blocking = blocker.transaction()
        await blocking.start()
        await blocker.execute(probe, keys[-1])
        task = asyncio.create_task(statement(runner))
        try:
            pid = runner.get_server_pid()
            await waiting.until(lambda: _waiting_on_a_lock(observer, pid), timeout_s=10)
            held = [await _probe_locked(observer, probe, key) for key in keys[:-1]]
            assert held == [True] * (len(keys) - 1), "while waiting on the highest key, every lower one is held"
        finally:
            await blocking.rollback()
            await asyncio.wait_for(task, 10)
    finally:
        for conn in (blocker, runner, observer):
            with contextlib.suppress(Exception):
                await conn.close()


async def test_delivery_finish_many_locks_in_delivery_id_order(db: asyncpg.Connection, database_url: str) -> None:
    await helpers.register(db, "http://127.0.0.1:9/webhooks/lading")
    await helpers.succeed(db, count=5)
    claimed = sorted(
        await deliveries.claim(db, endpoints=[helpers.ENDPOINT], owner="d", limit=5, lease_ttl_s=600),
        key=lambda c: c.id,
    )
    finishes = [deliveries.Finish(c.id, c.fence, DeliveryState.DELIVERED, "delivered") for c in reversed(claimed)]
    await _assert_locks_ascending(
        database_url,
        probe="SELECT 1 FROM deliveries WHERE delivery_id = $1 FOR UPDATE NOWAIT",
        keys=[c.id for c in claimed],
        statement=lambda conn: deliveries.finish_many(conn, finishes, owner="d"),
    )
    assert await helpers.states(db) == {"DELIVERED": 5}


@pytest.mark.parametrize("mark", ["published", "released"])
async def test_outbox_marks_lock_in_id_order(db: asyncpg.Connection, database_url: str, mark: str) -> None:
    await db.execute(
        "INSERT INTO outbox_events (event_id, aggregate_type, aggregate_id, type, payload)"
        " SELECT gen_random_uuid(), 'job', i, 'extraction.completed.v1', '{}'::jsonb FROM generate_series(1, 5) i"
    )
    ids = sorted(e.id for e in await outbox.claim_batch(db, owner="r", limit=5, ttl_s=600))
    backwards = list(reversed(ids))

    async def statement(conn: asyncpg.Connection) -> int:
        if mark == "published":
            return await outbox.mark_published(conn, ids=backwards, owner="r")
        return await outbox.release(conn, ids=backwards, owner="r", after_s=0.0)

    await _assert_locks_ascending(
        database_url, probe="SELECT 1 FROM outbox_events WHERE id = $1 FOR UPDATE NOWAIT", keys=ids,
        statement=statement,
    )


async def test_job_release_many_locks_in_id_order(db: asyncpg.Connection, database_url: str) -> None:
    await helpers.accept(db, count=5)
    claimed = await jobs.claim_batch(db, pool=factories.POOL, worker_id=helpers.WORKER, limit=5, lease_ttl_s=600)
    leases = sorted((c.id, c.fence) for c in claimed)
    await _assert_locks_ascending(
        database_url, probe="SELECT 1 FROM extraction_jobs WHERE id = $1 FOR UPDATE NOWAIT",
        keys=[job_id for job_id, _ in leases],
        statement=lambda conn: jobs.release_many(conn, list(reversed(leases)), worker_id=helpers.WORKER),
    )
    assert await db.fetchval("SELECT count(*) FROM extraction_jobs WHERE state = 'RETRY_SCHEDULED'") == 5
