"""
Gauges read from PostgreSQL, refreshed by ONE elected process.

Counts of jobs by state, the oldest eligible job's age per pool, the review queue, the outbox
backlog and the deliveries waiting for a DeliveryEndpoint that does not exist are facts about
the database, not about a process. If every worker replica exported them, Prometheus would hold
N copies (and `sum()` would multiply them) while the database paid N times for the same
queries. So every process runs a `GaugeRefresher`, but only the one holding a session-level
advisory lock refreshes; the others export nothing for these gauges and retry the election each
interval. The lock lives on a dedicated connection: when that process dies or loses its
connection, PostgreSQL releases the lock and another replica takes over within one interval.

The values come from the repositories (`lading.db.jobs`, `outbox`, `registry`, `deliveries`);
this module runs no SQL of its own. Two processes run the refresher: every worker, and the
operator (so the gauges exist while the workers are scaled to zero); components do not import
each other, so it lives in this package, which both wire.

Label values come from the database but are bounded: pools, tenants (registered through CRs)
and the closed set of states. Series of pools or tenants that disappeared are removed at each
refresh, so nothing stale lingers.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator

import asyncpg

from lading import metrics
from lading.db import deliveries, fairness, jobs, outbox, registry
from lading_elected import election

ELECTION_LOCK_KEY = 0x6C6164696E67  # "lading": the advisory lock key of the gauge election


@dataclasses.dataclass(frozen=True)
class GaugeSettings:
    interval_s: float = 15.0
    """Refresh period: Prometheus scrapes every 15-30 s, so fresher values would not be seen."""


@contextlib.asynccontextmanager
async def refreshing(
        database_url: str,
        *,
        settings: GaugeSettings | None = None,
        stop: asyncio.Event | None = None,
) -> AsyncIterator[GaugeRefresher]:
    """Run a refresher (election included) for the body of an `async with`; stopped on exit, or
    earlier once `stop` is set."""
    refresher = GaugeRefresher(database_url, settings=settings)
    async with election.running(refresher, name="gauge refresher", stop=stop):
        yield refresher


class GaugeRefresher:
    """Runs the election and the refresh loop for one process; `leader` tells whether it is elected."""

    def __init__(self, database_url: str, *, settings: GaugeSettings | None = None) -> None:
        self.settings = settings or GaugeSettings()
        self._election = election.Election(database_url, key=ELECTION_LOCK_KEY, what="refresh database gauges")

    @property
    def leader(self) -> bool:
        return self._election.leader

    async def run_forever(self, stop: asyncio.Event) -> None:
        await election.run_elected(
            stop, run_once=self.run_once, resign=self._resign, interval_s=lambda: self.settings.interval_s,
            what="Gauge refresh",
        )

    async def run_once(self) -> bool:
        """Try to be (or stay) the leader; refresh the gauges if so. Returns whether it refreshed."""
        conn = await self._election.stand()
        if conn is None:
            _clear()
            return False
        await refresh(conn)
        return True

    async def _resign(self) -> None:
        _clear()
        await self._election.resign()


async def refresh(conn: asyncpg.Connection) -> None:
    """Read every database gauge in one repeatable-read snapshot and publish the values."""
    async with conn.transaction(isolation="repeatable_read", readonly=True):
        by_state = await jobs.count_unfinished_by_state(conn)
        oldest = await jobs.oldest_eligible_age_by_pool(conn)
        review = await jobs.review_queue_summary(conn)
        outbox_backlog = await outbox.backlog_summary(conn)
        pools = await registry.pool_flags(conn)
        no_endpoint = await deliveries.count_waiting_for_endpoint_by_tenant(conn)
        budgets = await fairness.budgets_exhausted(conn)
    _replace(metrics.JOBS_BY_STATE, {
        (pool, tenant, state.value): float(n) for (pool, tenant, state), n in by_state.items()
    })
    _replace(metrics.OLDEST_ELIGIBLE_AGE, {(pool,): age_s for pool, age_s in oldest.items()})
    _replace(metrics.POOL_PAUSED, {(p.pool,): float(p.paused) for p in pools})
    _replace(metrics.POOL_COOLING, {(p.pool,): float(p.cooling) for p in pools})
    _replace(metrics.DELIVERIES_WAITING_FOR_ENDPOINT, {(tenant,): float(n) for tenant, n in no_endpoint.items()})
    _replace(metrics.TENANT_BUDGET_EXHAUSTED, {(tenant,): float(spent) for tenant, spent in budgets.items()})
    metrics.REVIEW_QUEUE_SIZE.set(review.size)
    metrics.REVIEW_QUEUE_OLDEST_AGE.set(review.oldest_age_s)
    metrics.OUTBOX_UNPUBLISHED.set(outbox_backlog.unpublished)
    metrics.OUTBOX_BACKLOG_OLDEST_AGE.set(outbox_backlog.oldest_age_s)
    metrics.OUTBOX_SET_ASIDE.set(outbox_backlog.set_aside)
    metrics.GAUGE_REFRESHES.inc()


_published: dict[int, set[tuple[str, ...]]] = {}
"""Label sets this process has set, per gauge, so that vanished series can be removed."""


def _replace(gauge: metrics.LabelledGauge, values: dict[tuple[str, ...], float]) -> None:
    """Set the given series and remove the ones no longer present (a drained pool reads as absent)."""
    name = id(gauge)
    previous = _published.get(name, set())
    for labels in previous - set(values):
        with contextlib.suppress(KeyError):
            gauge.remove(*labels)
    for labels, value in values.items():
        gauge.labels(*labels).set(value)
    _published[name] = set(values)


def _clear() -> None:
    """A process that is not the leader exports none of the database gauges."""
    metrics.JOBS_BY_STATE.clear()
    metrics.OLDEST_ELIGIBLE_AGE.clear()
    metrics.POOL_PAUSED.clear()
    metrics.POOL_COOLING.clear()
    metrics.DELIVERIES_WAITING_FOR_ENDPOINT.clear()
    metrics.TENANT_BUDGET_EXHAUSTED.clear()
    _published.clear()
    for gauge in (metrics.REVIEW_QUEUE_SIZE, metrics.REVIEW_QUEUE_OLDEST_AGE, metrics.OUTBOX_UNPUBLISHED,
                  metrics.OUTBOX_BACKLOG_OLDEST_AGE):
        gauge.set(0)
