"""
The GPU-time allocator: ONE elected process closes the 60 s intervals of vLLM pools priced by the
GPU hour (docs/cost.md), pricing their attempts after the fact.

An attempt of such a pool finishes with its cost pending: what it cost is its share (by tokens) of
the pool's GPU time in the interval it finished in, known only when that interval is over. Every
worker runs an `Allocator`; the one holding the allocator's advisory lock (`lading_elected.election`,
its own key, apart from the gauges' and the cleaner's) calls `lading.db.gpu_time.close_due` every
`interval_s`. Each interval is one transaction that moves the pool's cursor past it under the
cursor's row lock, so two allocators (an election handover) or a crash mid-way cannot charge an
interval twice: a rerun finds the cursor past it, or the whole transaction rolled back.

`lading_cost_total` gains each tenant's share after the interval's commit (a process that dies in
between loses only the metric's increment; the database's sums are exact and complete);
`lading_gpu_cost_total{kind}` counts what went to attempts and what stayed idle.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator

from lading import costing, metrics
from lading.db import gpu_time
from lading_elected import election

logger = logging.getLogger(__name__)

ELECTION_LOCK_KEY = 0x6C6164696E6747  # "ladingG": the GPU-time allocator's election


@dataclasses.dataclass(frozen=True)
class AllocatorSettings:
    interval_s: float = 10.0
    """How often the elected allocator looks for intervals that are over: an attempt's cost reaches
    its job and tenant at most this long after its interval can close."""


@contextlib.asynccontextmanager
async def allocating(database_url: str, *, settings: AllocatorSettings | None = None) -> AsyncIterator[Allocator]:
    """Run an allocator (election included) for the body of an `async with`; stopped on exit."""
    allocator = Allocator(database_url, settings=settings)
    async with election.running(allocator, name="gpu cost allocator"):
        yield allocator


class Allocator:
    """Runs the election and the allocation loop for one process; `leader` tells whether it is elected."""

    def __init__(self, database_url: str, *, settings: AllocatorSettings | None = None) -> None:
        self.settings = settings or AllocatorSettings()
        self._election = election.Election(
            database_url, key=ELECTION_LOCK_KEY, what="allocate the GPU time of pools priced by the GPU hour"
        )

    @property
    def leader(self) -> bool:
        return self._election.leader

    async def resign(self) -> None:
        """Give up the election (closing its connection releases the lock)."""
        await self._election.resign()

    async def run_forever(self, stop: asyncio.Event) -> None:
        await election.run_elected(
            stop, run_once=self.run_once, resign=self.resign,
            interval_s=lambda: self.settings.interval_s, what="GPU-time allocation",
        )  # fmt: skip

    async def run_once(self) -> list[gpu_time.ClosedInterval]:
        """Try to be (or stay) the leader; close every interval that is due if so."""
        conn = await self._election.stand()
        if conn is None:
            return []
        closed = await gpu_time.close_due(conn)
        for interval in closed:
            count(interval)
        if closed:
            logger.info("Closed %d GPU-time intervals", len(closed))
        return closed


def count(interval: gpu_time.ClosedInterval) -> None:
    """The metrics of an interval just closed (after its commit)."""
    for tenant, amount in interval.by_tenant.items():
        costing.count_cost(tenant=tenant, pool=interval.pool, currency=interval.currency, amount=amount)
    if interval.charged:
        metrics.GPU_COST.labels(interval.pool, interval.currency, "charged").inc(float(interval.charged))
    if interval.idle:
        metrics.GPU_COST.labels(interval.pool, interval.currency, "idle").inc(float(interval.idle))
    metrics.GPU_INTERVALS_CLOSED.labels(interval.pool).inc()
