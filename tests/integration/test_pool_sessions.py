"""
`lading.db.pool.create_pool(reset_sessions=False)`: a connection goes back to its pool without
asyncpg's reset query (the worker's pool: one round trip less per limiter acquire and release),
yet a transaction left open is still rolled back and a LISTEN removed with `remove_listener` is
gone from the session.
"""

from __future__ import annotations

import asyncpg
import pytest

from lading.db import pool


async def _released_and_reacquired(db: asyncpg.Pool, work: str) -> asyncpg.pool.PoolConnectionProxy:
    async with db.acquire() as conn:
        pid = conn.get_server_pid()
        await conn.execute(work)
    conn = await db.acquire()
    assert conn.get_server_pid() == pid, "a pool of one connection hands out the same session"
    return conn


@pytest.mark.parametrize("reset_sessions", [True, False])
async def test_session_setting_survives_release_only_without_reset(database_url: str, reset_sessions: bool) -> None:
    db = await pool.create_pool(database_url, min_size=1, max_size=1, reset_sessions=reset_sessions)
    try:
        conn = await _released_and_reacquired(db, "SET application_name = 'left-behind'")
        try:
            name = await conn.fetchval("SHOW application_name")
        finally:
            await db.release(conn)
    finally:
        await db.close()
    assert (name == "left-behind") is not reset_sessions


async def test_open_transaction_is_rolled_back_without_reset(database_url: str) -> None:
    db = await pool.create_pool(database_url, min_size=1, max_size=1, reset_sessions=False)
    try:
        async with db.acquire() as conn:
            await conn.execute("BEGIN; CREATE TEMP TABLE pool_sessions_probe (x int)")
            await conn.execute("INSERT INTO pool_sessions_probe VALUES (1)")
        async with db.acquire() as conn:
            assert await conn.fetchval("SELECT pg_current_xact_id_if_assigned() IS NULL")
            assert await conn.fetchval("SELECT to_regclass('pg_temp.pool_sessions_probe') IS NULL")
    finally:
        await db.close()


async def test_removed_listener_leaves_no_listen_behind(database_url: str) -> None:
    db = await pool.create_pool(database_url, min_size=1, max_size=1, reset_sessions=False)

    def heard(*_: object) -> None:
        pass

    try:
        async with db.acquire() as conn:
            await conn.add_listener("pool_sessions_probe", heard)
            assert await conn.fetchval("SELECT count(*) FROM pg_listening_channels()") == 1
            await conn.remove_listener("pool_sessions_probe", heard)
        async with db.acquire() as conn:
            assert await conn.fetchval("SELECT count(*) FROM pg_listening_channels()") == 0
    finally:
        await db.close()
