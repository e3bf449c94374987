"""
Connection pools with the codecs every repository expects (jsonb <-> Python objects).

The jsonb codec uses PostgreSQL's binary format (a version byte, then UTF-8 JSON) so
that the COPY fast path of acceptance can carry jsonb columns too.
"""

from __future__ import annotations

from typing import Any

import asyncpg
import orjson

_JSONB_VERSION = b"\x01"


def _encode_jsonb(value: Any) -> bytes:
    # orjson: several times faster than the json module, which shows at thousands of
    # results and verdicts per second; it emits UTF-8 directly (NaN/Infinity, which jsonb
    # cannot store, become null).
    return _JSONB_VERSION + orjson.dumps(value)


def _decode_jsonb(data: bytes) -> Any:
    return orjson.loads(data[1:])


async def init_connection(conn: asyncpg.Connection) -> None:
    """Decode jsonb into Python objects and encode Python objects into it."""
    await conn.set_type_codec(
        "jsonb", encoder=_encode_jsonb, decoder=_decode_jsonb, schema="pg_catalog", format="binary"
    )


async def connect(dsn: str) -> asyncpg.Connection:
    conn = await asyncpg.connect(dsn)
    await init_connection(conn)
    return conn


async def keep_session(_: asyncpg.Connection) -> None:
    """A pool's `reset`: a connection goes back to its pool without asyncpg's reset query (which
    releases session advisory locks, closes cursors, UNLISTENs and resets settings, in one more
    round trip per acquire: per attempt where a limiter grants and releases permits).

    Only for pools whose users leave no session state behind: settings only SET LOCAL, advisory
    locks only transaction-level, cursors only inside transactions, and every LISTEN removed
    (`remove_listener` sends the UNLISTEN) before its connection is released. Session-level locks
    (`lading_elected`) and migrations use connections of their own. asyncpg still rolls back a
    transaction left open before this is called."""


async def create_pool(
        dsn: str,
        *,
        min_size: int = 1,
        max_size: int = 10,
        reset_sessions: bool = True,
) -> asyncpg.Pool:
    """`reset_sessions` False: `keep_session` instead of asyncpg's reset query (see there when
    that is safe)."""
    pool = await asyncpg.create_pool(
        dsn, min_size=min_size, max_size=max_size, init=init_connection,
        reset=None if reset_sessions else keep_session,
    )  # fmt: skip
    assert pool is not None
    return pool
