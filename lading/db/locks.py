"""
Lock waits and advisory locks (`sql/locks.sql`).

A transaction that may wait on another's row lock (acceptance waits for a concurrent
acceptance of the same idempotency key) bounds the wait here, so the caller can answer "in
progress, retry" instead of hanging. An election among processes (one gauge refresher across
every replica) is a session-level advisory lock, taken here without waiting.
"""

from __future__ import annotations

import asyncpg

from lading.db import queries


async def set_local_lock_timeout(conn: asyncpg.Connection, *, seconds: float) -> None:
    """Until the current transaction ends, a lock wait longer than `seconds` fails the statement
    with `asyncpg.LockNotAvailableError`. Whole milliseconds, as PostgreSQL counts them."""
    await conn.execute(queries.sql("lock_timeout_set_local"), f"{int(seconds * 1000)}ms")


async def try_session_lock(conn: asyncpg.Connection, *, key: int) -> bool:
    """Take the session-level advisory lock `key` if free; whether this session holds it now. Closing
    the session releases it."""
    return bool(await conn.fetchval(queries.sql("lock_try_session"), key))
