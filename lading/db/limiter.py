"""
Repository of the distributed admission limiter (`sql/limiter.sql`; tables limiter_permits,
limiter_seconds, limiter_estimates and limiter_waiters, the pool's cooldown in pools; functions
of migrations 0011, 0014, 0028, 0033 and 0040).

What the limiter decides from these answers, and why, is `lading.limiting`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import asyncpg

from lading.db import queries
from lading.ids import JobId, PoolName


@dataclasses.dataclass(frozen=True)
class Grant:
    """One ask for permits: those granted (a prefix of what was asked), and the pool's counts."""

    permit_ids: tuple[int, ...]
    cooling: bool
    """The pool cools down after a 429: nothing was granted."""
    cooldown_left_s: float
    requests: int
    """Requests counted in the window, the granted ones included."""
    tokens: int
    in_flight: int
    last_second: int
    """Requests granted in the current second (pacing)."""
    window_frees_in_s: float | None
    second_frees_in_s: float | None
    meanwhile: tuple[tuple[int, int], ...] = ()
    """(position in the asked list, permit) of the asked attempts that a release in another replica
    granted a permit while they waited: `permit_ids` went to a prefix of the others."""


async def try_acquire_many(
        conn: asyncpg.Connection,
        *,
        pool: PoolName,
        asked: Sequence[tuple[JobId, int, int]],
        requests_per_minute: int,
        tokens_per_minute: int,
        max_concurrency: int,
        permit_ttl_s: float,
        window_s: float,
        per_second: int,
) -> Grant:
    """Ask once for permits of (job, fence, tokens), in order. `asyncpg.NoDataFoundError` when the pool is
    not registered."""
    row = await conn.fetchrow(
        queries.sql("limiter_try_acquire"),
        pool, [j for j, _, _ in asked], [f for _, f, _ in asked], [t for _, _, t in asked],
        requests_per_minute, tokens_per_minute, max_concurrency, permit_ttl_s, window_s, per_second,
    )  # fmt: skip
    assert row is not None
    return _grant(row)


async def acquire_recording(
        conn: asyncpg.Connection,
        *,
        pool: PoolName,
        asked: Sequence[tuple[JobId, int, int]],
        listener: int,
        record: Sequence[bool],
        waited_s: Sequence[float],
        requests_per_minute: int,
        tokens_per_minute: int,
        max_concurrency: int,
        permit_ttl_s: float,
        window_s: float,
        per_second: int,
) -> tuple[Grant, int]:
    """`try_acquire_many`, and, when the next asked permit is refused for concurrency alone, record the
    attempts not granted whose `record` is set as waiting in the replica listening as backend pid
    `listener`, since `waited_s` ago. An asked attempt granted a permit by another replica's release
    while it waited is in `Grant.meanwhile`. Returns the grant and how many attempts were recorded."""
    row = await conn.fetchrow(
        queries.sql("limiter_acquire_recording"),
        pool, [j for j, _, _ in asked], [f for _, f, _ in asked], [t for _, _, t in asked],
        requests_per_minute, tokens_per_minute, max_concurrency, permit_ttl_s, window_s, per_second,
        listener, list(record), list(waited_s),
    )  # fmt: skip
    assert row is not None
    return _grant(row), int(row["recorded"] or 0)


async def release_and_grant(
        conn: asyncpg.Connection,
        *,
        permit_id: int,
        tokens_used: int | None,
        pool: PoolName,
        asked: Sequence[tuple[JobId, int, int]],
        listener: int | None,
        waited_s: Sequence[float] | None,
        requests_per_minute: int,
        tokens_per_minute: int,
        max_concurrency: int,
        permit_ttl_s: float,
        window_s: float,
        per_second: int,
) -> tuple[Grant | None, int | None]:
    """Release a permit and, in the same transaction, ask for the `asked` permits (this replica's own
    waiting attempts, waiting for `waited_s`: the grant; `waited_s` None when none of them was
    recorded as waiting, so that no other replica can have granted one a permit meanwhile); or, with
    none asked, grant the slot to the longest-waiting recorded attempt of another replica than
    `listener`'s and NOTIFY it the permit (the pid of the replica granted). When nothing was
    granted, every replica is woken (NOTIFY with the pool's name).
    `asyncpg.NoDataFoundError` (nothing released) when the pool is not registered."""
    row = await conn.fetchrow(
        queries.sql("limiter_release_grant"),
        permit_id, tokens_used,
        pool, [j for j, _, _ in asked], [f for _, f, _ in asked], [t for _, _, t in asked],
        requests_per_minute, tokens_per_minute, max_concurrency, permit_ttl_s, window_s, per_second, listener,
        None if waited_s is None else list(waited_s),
    )  # fmt: skip
    assert row is not None
    return (_grant(row) if asked else None), row["handed_to"]


async def forget_waiters(conn: asyncpg.Connection, *, pool: PoolName, listener: int) -> None:
    """Forget the waiting attempts the replica listening as backend pid `listener` recorded."""
    await conn.execute(queries.sql("limiter_waiters_forget"), pool, listener)


def _grant(row: asyncpg.Record) -> Grant:
    return Grant(
        permit_ids=tuple(row["permit_ids"] or ()),
        cooling=row["cooling"],
        cooldown_left_s=row["cooldown_left_s"],
        requests=row["requests"],
        tokens=row["tokens"],
        in_flight=row["in_flight"],
        last_second=row["last_second"],
        window_frees_in_s=row["window_frees_in_s"],
        second_frees_in_s=row["second_frees_in_s"],
        meanwhile=tuple(zip(row["meanwhile_at"] or (), row["meanwhile_permits"] or (), strict=True))
        if "meanwhile_at" in row else (),
    )


async def release(conn: asyncpg.Connection, *, permit_id: int, tokens_used: int | None) -> None:
    """Free a permit; `tokens_used` replaces its reservation in the window (None keeps it). Wakes every
    process's waiting askers at commit (NOTIFY lading_limiter)."""
    await conn.execute(queries.sql("limiter_release"), permit_id, tokens_used)


async def cool_down(conn: asyncpg.Connection, *, pool: PoolName, seconds: float) -> float | None:
    """Cool the pool down for `seconds` (never shortening a longer cooldown); how long it now cools down,
    or None when the pool is not registered."""
    left = await conn.fetchval(queries.sql("limiter_cooldown"), pool, seconds)
    return None if left is None else float(left)


async def observe(
        conn: asyncpg.Connection,
        *,
        pool: PoolName,
        remaining_requests: int | None,
        requests_reset_s: float | None,
        remaining_tokens: int | None,
        tokens_reset_s: float | None,
        requests_per_minute: int,
        tokens_per_minute: int,
        window_s: float,
) -> tuple[int, int]:
    """Tighten the window to the provider's rate-limit headers where they show less room; the (requests,
    tokens) added."""
    row = await conn.fetchrow(
        queries.sql("limiter_observe"),
        pool, remaining_requests, requests_reset_s, remaining_tokens, tokens_reset_s,
        requests_per_minute, tokens_per_minute, window_s,
    )  # fmt: skip
    assert row is not None
    return int(row["requests_added"]), int(row["tokens_added"])


async def prune_permits(conn: asyncpg.Connection, *, pool: PoolName) -> None:
    """Delete the pool's permits that no longer count (out of every window, released or expired)."""
    await conn.execute(queries.sql("limiter_prune"), pool)


async def prune_seconds(conn: asyncpg.Connection, *, pool: PoolName) -> None:
    """Delete the pool's rollup seconds that left every window."""
    await conn.execute(queries.sql("limiter_prune_seconds"), pool)


async def usage(conn: asyncpg.Connection, *, pool: PoolName, window_s: float) -> tuple[int, int, int]:
    """(requests, tokens, in flight) of the pool over the last `window_s` seconds."""
    row = await conn.fetchrow(queries.sql("limiter_usage"), pool, window_s)
    assert row is not None
    return int(row["requests"]), int(row["tokens"]), int(row["in_flight"])


async def estimates(conn: asyncpg.Connection, *, pool: PoolName) -> dict[str, tuple[float, int]]:
    """What the pool's provider was seen to count for a prompt: schema -> (factor, answers learned from)."""
    rows = await conn.fetch(queries.sql("limiter_estimates_of_pool"), pool)
    return {row["schema"]: (float(row["factor"]), int(row["samples"])) for row in rows}


async def record_estimate(
        conn: asyncpg.Connection, *, pool: PoolName, schema: str, factor: float, samples: int
) -> None:
    """Record the factor learned for the pool and schema from `samples` answers (the latest view wins)."""
    await conn.execute(queries.sql("limiter_estimate_upsert"), pool, schema, factor, samples)
