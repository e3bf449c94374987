"""
Repository of the GPU time of vLLM pools priced by the GPU hour (`spec.pricing.gpuHourPrice`) and of
its allocation to attempts (docs/cost.md, migration 0026).

    operator     record_gpu_replicas   a sample (pool, now, ready replicas, GPUs each) per observation
    allocator    close_due             each pool's intervals of 60 s that are over, one transaction each

An interval [T, T+60 s) closes once a sample at or after its end exists (the operator saw the
replicas through it; it samples every reconcile, 15 s by default) or, should no sample come (no
operator), once it ended `STALE_S` ago: the last sample then holds. Its GPU time is the step
function of the samples (each holds until the next) integrated over the interval, times the GPUs
per replica; its cost that time at the pool's `gpuHourPrice` (`lading.costing.interval_cost`),
split among the attempts pending in it by their tokens (`lading.costing.split_interval`). Each share
is added to its attempt, job, batch sum and tenant spend (the interval's UTC day) in the same
transaction that records the interval and moves the pool's cursor past it, under the cursor's row
lock: an interval is charged exactly once, whatever crashes or replicas. An interval without tokens
is idle: its cost is recorded on the pool (`pool_gpu_intervals`) and charged to no tenant.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
from collections.abc import Mapping

import asyncpg

from lading import costing, failpoints
from lading.db import queries
from lading.ids import PoolName, TenantName
from lading.models import specs

INTERVAL = dt.timedelta(seconds=costing.INTERVAL_S)

STALE_S = 600.0
"""An interval with no sample at or after its end closes this long after it ended, the last sample
holding (the operator is down, or the pool was deleted): its attempts are not left unpriced."""

MAX_INTERVALS_PER_POOL = 120
"""Most intervals one `close_due` closes per pool (two hours of backlog per round)."""


async def record_gpu_replicas(
        conn: asyncpg.Connection, *, pool: str, spec: specs.InferencePoolSpec, ready_replicas: int
) -> None:
    """The operator saw `ready_replicas` ready replicas of pool `pool`'s vLLM Deployment now. Recorded
    only for a vLLM pool priced by the GPU hour (nothing else reads it)."""
    if spec.provider != "vllm" or spec.pricing is None or spec.pricing.gpu_hour_price is None:
        return
    gpus = (spec.vllm or specs.VllmSettings()).gpus
    await conn.execute(queries.sql("pool_gpu_sample_insert"), pool, max(0, ready_replicas), gpus)


@dataclasses.dataclass(frozen=True)
class ClosedInterval:
    """One interval closed: what it cost and what each tenant was charged of it."""

    pool: PoolName
    starts_at: dt.datetime
    currency: str
    gpu_seconds: decimal.Decimal
    cost: decimal.Decimal
    charged: decimal.Decimal
    attempts: int
    tokens: int
    by_tenant: Mapping[TenantName, decimal.Decimal]

    @property
    def idle(self) -> decimal.Decimal:
        """What no tenant was charged: the whole cost of an interval without tokens, else 0."""
        return self.cost - self.charged


def _seconds(delta: dt.timedelta) -> decimal.Decimal:
    return decimal.Decimal(delta.days * 86_400 + delta.seconds) + decimal.Decimal(delta.microseconds).scaleb(-6)


def gpu_seconds(
        samples: list[tuple[dt.datetime, int, int]], *, start: dt.datetime, end: dt.datetime
) -> decimal.Decimal:
    """GPU-seconds in [start, end) of the step function `samples` ((at, ready replicas, GPUs each) in
    time order, each holding until the next): before the first sample, none."""
    total = decimal.Decimal(0)
    for i, (at, replicas, gpus) in enumerate(samples):
        since = max(at, start)
        until = min(samples[i + 1][0] if i + 1 < len(samples) else end, end)
        if until > since:
            total += _seconds(until - since) * replicas * gpus
    return total


async def close_next(conn: asyncpg.Connection, *, pool: PoolName, pricing: costing.Pricing) -> ClosedInterval | None:
    """Close pool `pool`'s next interval if it is due, in one transaction; None when none is due."""
    if pricing.gpu_hour_price is None:
        raise ValueError(f"InferencePool {pool} is not priced by the GPU hour")
    await conn.execute(queries.sql("pool_gpu_cursor_start"), pool)
    async with conn.transaction():
        row = await conn.fetchrow(queries.sql("pool_gpu_cursor_lock"), pool)
        if row is None:
            return None
        start: dt.datetime = row["closed_until"]
        end = start + INTERVAL
        latest: dt.datetime | None = row["latest_sample_at"]
        now: dt.datetime = row["now"]
        if end > now or not ((latest is not None and latest >= end) or (now - end).total_seconds() >= STALE_S):
            return None
        samples = [
            (r["at"], r["ready_replicas"], r["gpus"])
            for r in await conn.fetch(queries.sql("pool_gpu_samples_of_interval"), pool, start, end)
        ]
        seconds = gpu_seconds(samples, start=start, end=end)
        cost = costing.interval_cost(gpu_seconds=seconds, gpu_hour_price=pricing.gpu_hour_price)
        pending = [
            r for r in await conn.fetch(queries.sql("attempt_gpu_pending_of_pool"), pool, end)
            if r["currency"] == pricing.currency
        ]
        tokens = [int(r["tokens"]) for r in pending]
        shares = costing.split_interval(cost, tokens)
        charged = sum(shares, decimal.Decimal(0))
        if seconds == 0 and not pending:
            inserted = True  # nothing to record: scaled to zero and nothing ran
        else:
            inserted = await conn.fetchval(
                queries.sql("pool_gpu_interval_insert"),
                pool, start, pricing.currency, seconds, cost, charged, len(pending), sum(tokens),
            ) is not None  # fmt: skip
        if not inserted:
            raise RuntimeError(f"interval {start.isoformat()} of {pool} was closed twice")  # the cursor lock forbids
        by_tenant: dict[TenantName, decimal.Decimal] = {}
        if pending:
            rows = await conn.fetch(
                queries.sql("pool_gpu_interval_charge"),
                [r["job_id"] for r in pending], [r["fence"] for r in pending], shares,
                pricing.currency, start.astimezone(dt.UTC).date(),
            )  # fmt: skip
            by_tenant = {TenantName(r["tenant"]): r["amount"] for r in rows}
        await failpoints.ahit("gpu_time.after_charge_before_close")  # a crash here rolls it all back
        await conn.execute(queries.sql("pool_gpu_samples_prune"), pool, end)
        await conn.execute(queries.sql("pool_gpu_cursor_advance"), pool, start, end)
    return ClosedInterval(
        pool=pool, starts_at=start, currency=pricing.currency, gpu_seconds=seconds, cost=cost, charged=charged,
        attempts=len(pending), tokens=sum(tokens), by_tenant=by_tenant,
    )  # fmt: skip


async def close_due(conn: asyncpg.Connection, *, limit: int = MAX_INTERVALS_PER_POOL) -> list[ClosedInterval]:
    """Close every due interval of every pool priced by the GPU hour (at most `limit` per pool), oldest
    first, each in its own transaction."""
    closed: list[ClosedInterval] = []
    for row in await conn.fetch(queries.sql("pool_gpu_priced_list")):
        pricing = costing.Pricing.from_stored(row["spec"])
        if pricing is None or pricing.gpu_hour_price is None:
            continue
        for _ in range(limit):
            interval = await close_next(conn, pool=PoolName(row["name"]), pricing=pricing)
            if interval is None:
                break
            closed.append(interval)
    return closed


@dataclasses.dataclass(frozen=True)
class IntervalReport:
    starts_at: dt.datetime
    currency: str
    gpu_seconds: decimal.Decimal
    cost: decimal.Decimal
    charged: decimal.Decimal
    idle: decimal.Decimal
    attempts: int
    tokens: int


async def pool_intervals(
        conn: asyncpg.Connection, *, pool: PoolName, since: dt.datetime, limit: int = 1440
) -> list[IntervalReport]:
    """Pool `pool`'s closed intervals that had GPU time or attempts since `since`, oldest first."""
    rows = await conn.fetch(queries.sql("pool_gpu_interval_report"), pool, since, limit)
    return [
        IntervalReport(
            starts_at=r["starts_at"], currency=r["currency"], gpu_seconds=r["gpu_seconds"], cost=r["cost"],
            charged=r["charged"], idle=r["idle"], attempts=r["attempts"], tokens=r["tokens"],
        )
        for r in rows
    ]
