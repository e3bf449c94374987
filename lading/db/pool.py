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


CUSTOM_PLANS = {"plan_cache_mode": "force_custom_plan"}
"""Session settings of a connection that plans every execution of a prepared statement for its own
arguments. By default PostgreSQL plans a statement's first five executions that way, then keeps one
generic plan, made for no particular arguments on the table sizes of that moment, whenever it looks
no costlier; only an ANALYZE (or DDL, TRUNCATE) of a table it reads makes it plan again. The
worker's claim (job_claim_batch, its lookup of a job's previous attempt) and group commit
(job_finish_many, its `closed`) read job_attempts, which grows from empty on a new or emptied
database: a generic plan made while it held no row or a few hundred scans all of it once per
claimed job, or once per committed attempt, for as long as the plan lives (with autovacuum off,
the session's life). Planned per call, both see the table's current size and their arrays' real
lengths. (Planning a commit of 200 attempts took about 0.8 ms; running it, about 50. The claim, which
migration 0043 lets other connections keep one plan for, is planned at each call on a worker's: in
`compare`'s `--processes 2` runs, alternating, the CPU per job was the same within noise.)"""


async def create_pool(
        dsn: str,
        *,
        min_size: int = 1,
        max_size: int = 10,
        reset_sessions: bool = True,
        custom_plans: bool = False,
) -> asyncpg.Pool:
    """`reset_sessions` False: `keep_session` instead of asyncpg's reset query (see there when
    that is safe). `custom_plans`: each connection plans every execution for its arguments
    (`CUSTOM_PLANS`); a session setting, so the reset query keeps it."""
    pool = await asyncpg.create_pool(
        dsn, min_size=min_size, max_size=max_size, init=init_connection,
        reset=None if reset_sessions else keep_session,
        server_settings=dict(CUSTOM_PLANS) if custom_plans else None,
    )  # fmt: skip
    assert pool is not None
    return pool
