"""
What the scaler needs to know about a pool, read from PostgreSQL (`pool_scaling_load` and
`pool_scaling_attempt_stats` in `sql/pools.sql`).

    pool_signals(conn, pool=..., window_s=...) -> PoolLoad
        backlog and oldest eligible age   the claim index: eligibility is `job_eligible`, the claim's own
        calls in flight                   the leases index (RUNNING jobs)
        429 cooldown                      pools.cooldown_until (set by the limiter on a 429)
        pause                             pools.paused / paused_until (a refused key, a spent quota)
        mean latency, tokens per call     the limiter's permit log (lading.limiting): calls of the
                                          last `window_s` seconds that finished

Every read is bounded by the work still to do or by the last minutes, never by the history of the
pool: the operator runs it every few seconds for every pool. The limiter prunes permits two
minutes after they were taken, so the statistics cover at most that; a pool without a limiter
(the builtin provider) or without a finished call in the window reports None, and the scaler then
assumes a latency (`lading_operator.scaling.LATENCY_DEFAULT_S`).

The decision itself lives in `lading_operator.scaling`; this module only measures.
"""

from __future__ import annotations

import dataclasses
import datetime as dt

import asyncpg

from lading.db import queries
from lading.ids import PoolName

WINDOW_S_DEFAULT = 120.0
"""Calls of the last two minutes (all the limiter keeps) describe the model as it is now."""


@dataclasses.dataclass(frozen=True)
class PoolLoad:
    """One pool's load as the database sees it, at `at` (the database clock)."""

    pool: PoolName
    at: dt.datetime
    eligible_backlog: int
    """Jobs a claim could take now (`job_eligible`, lading/db/sql/jobs.sql): waiting, not suspended, due,
    inside deadline and attempt budget."""
    oldest_eligible_at: dt.datetime | None
    oldest_eligible_age_s: float | None
    in_flight: int
    """Jobs RUNNING (a claimed attempt, lease held)."""
    cooldown_until: dt.datetime | None
    """No call to the provider before this time: it answered 429 (lading.limiting). May be past."""
    paused: bool
    """Paused by spec (InferencePool spec.paused)."""
    paused_until: dt.datetime | None
    paused_reason: str | None
    recent_attempts: int
    """Finished model calls of the window that the statistics below are computed from."""
    mean_latency_s: float | None
    mean_tokens_per_attempt: float | None


async def pool_signals(
        conn: asyncpg.Connection,
        *,
        pool: PoolName,
        window_s: float = WINDOW_S_DEFAULT,
) -> PoolLoad:
    """Read pool `pool`'s load; both queries run in one read-only snapshot so their figures agree."""
    if window_s <= 0:
        raise ValueError(f"window_s must be positive, not {window_s}")
    if conn.is_in_transaction():  # the caller's snapshot, whatever it is
        load, stats = await _read(conn, pool=pool, window_s=window_s)
    else:
        async with conn.transaction(isolation="repeatable_read", readonly=True):
            load, stats = await _read(conn, pool=pool, window_s=window_s)
    assert load is not None and stats is not None  # aggregates always return one row
    return PoolLoad(
        pool=pool,
        at=load["at"],
        eligible_backlog=load["backlog"],
        oldest_eligible_at=load["oldest_available_at"],
        oldest_eligible_age_s=load["oldest_age_s"],
        in_flight=load["in_flight"],
        cooldown_until=load["cooldown_until"],
        paused=load["paused"],
        paused_until=load["paused_until"],
        paused_reason=load["paused_reason"],
        recent_attempts=stats["attempts"],
        mean_latency_s=stats["mean_latency_s"],
        mean_tokens_per_attempt=stats["mean_tokens"],
    )


async def _read(
        conn: asyncpg.Connection,
        *,
        pool: PoolName,
        window_s: float,
) -> tuple[asyncpg.Record, asyncpg.Record]:
    load = await conn.fetchrow(queries.sql("pool_scaling_load"), pool)
    stats = await conn.fetchrow(queries.sql("pool_scaling_attempt_stats"), pool, float(window_s))
    return load, stats
