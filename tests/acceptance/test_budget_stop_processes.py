"""
Three real worker processes share a priced pool; one tenant has a daily money budget. Once its spend
reaches the budget no replica claims its jobs any more: they wait (never fail), the other tenant's
work goes on, and the overshoot stays within the stated bound (docs/cost.md):

    spend - budget  <  maxInFlight x (the most one attempt costs)

because every attempt is claimed while the spend is below the budget, and at most maxInFlight of the
tenant's attempts run at once, across all replicas.
"""

from __future__ import annotations

import dataclasses
import decimal
import pathlib

import asyncpg
import pytest

from lading import accepting
from lading.db import fairness, registry
from lading.ids import PoolName, TenantName
from lading_demo import generator
from tests.support import factories, processes, waiting

pytestmark = pytest.mark.slow

POOL = PoolName(factories.POOL)
MAX_IN_FLIGHT = 6
BUDGET = decimal.Decimal("12000")
"""USD; one priced prompt token costs 1 USD here, so the budget is about 30 attempts' prompts."""


async def _setup(db: asyncpg.Connection) -> None:
    await registry.upsert_pool(
        db, name=POOL, provider="builtin", model="lading-builtin",
        spec={"builtin": {"latencyMs": 150},
              "pricing": {"currency": "USD", "inputPerMillionTokens": "1000000", "outputPerMillionTokens": "0"}},
    )  # fmt: skip
    await registry.upsert_tenant(
        db, name=TenantName("metered"), namespaces=["metered"], weight=1, max_queued_jobs=None,
        max_in_flight=MAX_IN_FLIGHT, spec={"budget": {"currency": "USD", "daily": str(BUDGET)}},
    )  # fmt: skip
    await registry.upsert_tenant(
        db, name=TenantName("other"), namespaces=["other"], weight=1, max_queued_jobs=None, max_in_flight=None,
        spec={},
    )  # fmt: skip
    samples = generator.generate(200, seed=16)
    for tenant, documents in (("metered", samples[:160]), ("other", samples[160:])):
        request = factories.batch_request(name=tenant, tenant=tenant, count=0)
        documents_in = [accepting.DocumentInput(key=s.key, text=s.text) for s in documents]
        await accepting.accept_batch(db, dataclasses.replace(request, documents=documents_in))


async def test_three_workers_stop_claiming_a_tenant_whose_budget_is_spent_within_the_in_flight_bound(
        db: asyncpg.Connection, database_url: str, tmp_path: pathlib.Path
) -> None:
    await _setup(db)
    args = ["--poll-interval", "0.1", "--backoff-base", "0.05", "--concurrency", "8"]
    started = [
        await processes.start_worker(database_url, POOL, args=args, log=tmp_path / f"worker-{i}.log")
        for i in range(3)
    ]
    try:

        async def budget_spent_and_settled() -> bool:
            budget = await fairness.tenant_budget(db, tenant=TenantName("metered"))
            running = await db.fetchval("SELECT count(*) FROM extraction_jobs WHERE state = 'RUNNING'")
            other_open = await db.fetchval(
                "SELECT count(*) FROM extraction_jobs WHERE tenant = 'other' AND finished_at IS NULL"
                " AND state <> 'REVIEW_REQUIRED'"
            )
            return budget is not None and budget.claims_stopped and running == 0 and other_open == 0

        await waiting.until(budget_spent_and_settled, timeout_s=90)
        # Claims are stopped for the metered tenant (the plan every replica runs passes it over), while
        # its jobs wait: never attempted, still READY, none failed.
        assert await db.fetchval("SELECT count(*) FROM lading_claim_plan($1, 100)", POOL) == 0
        claimers = await db.fetchval("SELECT count(DISTINCT worker_id) FROM job_attempts")
    finally:
        for process in started:
            await processes.stop(process)

    waiting_jobs = await db.fetchval(
        "SELECT count(*) FROM extraction_jobs WHERE tenant = 'metered' AND state = 'READY' AND attempt = 0"
    )
    failed = await db.fetchval(
        "SELECT count(*) FROM extraction_jobs WHERE tenant = 'metered' AND state = 'FAILED_TERMINAL'"
        " AND last_error_class <> 'UNREADABLE_DOCUMENT'"
    )
    spent = await db.fetchval("SELECT sum(amount) FROM tenant_spend WHERE tenant = 'metered' AND currency = 'USD'")
    attempt_sum, most = await db.fetchrow(
        "SELECT sum(a.cost), max(a.cost) FROM job_attempts a JOIN extraction_jobs j ON j.id = a.job_id"
        " WHERE j.tenant = 'metered'"
    )
    assert claimers == 3, "every replica took part"
    assert waiting_jobs > 50 and failed == 0
    assert spent == attempt_sum  # the tenant's spend is exactly its attempts' costs
    assert spent >= BUDGET, "claims stop only once the budget is spent"
    assert spent - BUDGET < MAX_IN_FLIGHT * most, (spent, BUDGET, most)
    other_spent = await db.fetchval("SELECT coalesce(sum(amount), 0) FROM tenant_spend WHERE tenant = 'other'")
    assert other_spent > 0  # the other tenant was served and paid on the same pool
