"""
Counting the deadlocks PostgreSQL detected in the test database, and making it detect them fast.

`pg_stat_database.deadlocks` is per database and cumulative; a backend reports its count when it
flushes its statistics, at the latest when it exits. So a count is read only after the
connections that ran the work are closed and gone (`settled`). With `deadlock_timeout` lowered
to a few milliseconds, a lock cycle is found and counted at once instead of after a second.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import AsyncIterator

import asyncpg

from tests.support import waiting


async def count(conn: asyncpg.Connection) -> int:
    """Deadlocks detected in this connection's database so far (a fresh statistics snapshot)."""
    await conn.execute("SELECT pg_stat_clear_snapshot()")
    return int(await conn.fetchval("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()"))


@contextlib.asynccontextmanager
async def fast_detection(conn: asyncpg.Connection, *, deadlock_timeout: str = "5ms") -> AsyncIterator[None]:
    """`deadlock_timeout` of this database lowered for connections opened inside the block."""
    statement = await conn.fetchval(
        "SELECT format('ALTER DATABASE %I SET deadlock_timeout = %L', current_database(), $1::text)", deadlock_timeout
    )
    await conn.execute(statement)
    try:
        yield
    finally:
        await conn.execute(
            "DO $$ BEGIN EXECUTE format('ALTER DATABASE %I RESET deadlock_timeout', current_database()); END $$"
        )


def tagged(url: str) -> tuple[str, str]:
    """`url` with a unique application_name, and that name (to wait for its connections to go)."""
    name = f"lock-order-{secrets.token_hex(4)}"
    return f"{url}{'&' if '?' in url else '?'}application_name={name}", name


async def settled(conn: asyncpg.Connection, *, application_name: str, timeout_s: float = 10.0) -> None:
    """Wait until every connection named `application_name` has exited (its statistics flushed)."""

    async def gone() -> bool:
        return not await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", application_name
        )

    await waiting.until(gone, timeout_s=timeout_s)
