"""Cost per attempt, job, batch and tenant, and money budgets, on real PostgreSQL (docs/cost.md).

Costs go through the real write path (`jobs.finish_many`, the group commit) and are read back
through the repositories status and reports use; sums are exact decimals, never floats.
"""

from __future__ import annotations

import collections
import decimal

import asyncpg
import pytest

from lading import accepting, applying, reasons
from lading.db import fairness, jobs, registry, spend
from lading.ids import PoolName, TenantName, WorkerId
from lading.jobs import transitions
from lading.models import specs
from tests.support import factories

POOL = PoolName(factories.POOL)
WORKER = WorkerId("w")


async def _tenant(conn: asyncpg.Connection, name: str, *, budget: dict[str, str] | None = None) -> None:
    await registry.upsert_tenant(
        conn, name=TenantName(name), namespaces=[name], weight=1, max_queued_jobs=None, max_in_flight=None,
        spec={} if budget is None else {"budget": budget},
    )  # fmt: skip


def _paid(job: jobs.ClaimedJob, cost: str, *, currency: str = "EUR") -> transitions.Finish:
    return transitions.succeed(
        job.id, job.fence, result={}, validation={"passed": True},
        usage=transitions.Usage(tokens_in=10, tokens_out=2, cost=decimal.Decimal(cost), currency=currency),
    )  # fmt: skip


async def _claim_all(conn: asyncpg.Connection, count: int) -> list[jobs.ClaimedJob]:
    claimed: list[jobs.ClaimedJob] = []
    while len(claimed) < count:
        got = await jobs.claim_batch(conn, pool=POOL, worker_id=WORKER, limit=1000, lease_ttl_s=600)
        assert got, f"only {len(claimed)} of {count} jobs could be claimed"
        claimed += got
    return claimed


async def test_thousands_of_attempt_costs_sum_exactly_per_job_batch_and_tenant(db: asyncpg.Connection) -> None:
    await factories.seed(db)
    await _tenant(db, "acme", budget={"currency": "EUR", "monthly": "100000"})
    n = 3000
    accepted = await accepting.accept_batch(db, factories.batch_request(name="big", count=n, tenant="acme"))
    claimed = await _claim_all(db, n)
    # Tenths, hundredths and sub-micro amounts: binary floats cannot hold these exactly, and their float
    # sum drifts from the decimal one, so an implementation that went through float would be caught.
    costs = [decimal.Decimal(f"0.{i % 10}") + decimal.Decimal(i) / 10**9 for i in range(n)]
    expected = sum(costs, decimal.Decimal(0))
    assert decimal.Decimal(sum(float(c) for c in costs)) != expected  # a float path would be caught
    for start in range(0, n, 500):
        group = [_paid(job, str(cost)) for job, cost in zip(claimed[start:start + 500], costs[start:start + 500],
                                                            strict=True)]  # fmt: skip
        assert len(await jobs.finish_many(db, group, worker_id=WORKER)) == len(group)

    batch_cost = await spend.batch_cost(db, batch_id=accepted.batch_id)
    assert batch_cost == spend.Cost(amount=expected, currency="EUR")
    assert await db.fetchval("SELECT sum(cost) FROM job_attempts WHERE cost_currency = 'EUR'") == expected
    budget = await fairness.tenant_budget(db, tenant=TenantName("acme"))
    assert budget is not None and budget.money is not None
    assert (budget.money.spent_today, budget.money.spent_this_month) == (expected, expected)
    by_job = {job.id: cost for job, cost in zip(claimed, costs, strict=True)}
    sample = claimed[1234]
    shown = await spend.job_costs(db, job_id=sample.id)
    assert shown.total == spend.Cost(by_job[sample.id], "EUR")
    assert shown.by_fence == {sample.fence: spend.Cost(by_job[sample.id], "EUR")}
    assert spend.Cost(decimal.Decimal("0.000000120"), "EUR").to_json() == {"amount": "0.000000120", "currency": "EUR"}


async def test_a_stale_attempt_is_paid_for_by_its_job_and_tenant_though_its_result_is_discarded(
        db: asyncpg.Connection,
) -> None:
    await factories.seed(db)
    await _tenant(db, "acme", budget={"currency": "EUR", "daily": "10"})
    accepted = await accepting.accept_batch(db, factories.batch_request(count=1, tenant="acme"))
    (job,) = await _claim_all(db, 1)
    await db.execute("UPDATE extraction_jobs SET lease_until = clock_timestamp() - interval '1 s' WHERE id = $1",
                     job.id)  # fmt: skip
    assert await jobs.finish_many(db, [_paid(job, "0.25")], worker_id=WORKER) == set()  # stale: not applied
    assert await db.fetchval("SELECT state FROM extraction_jobs WHERE id = $1", job.id) == "RUNNING"
    assert await spend.batch_cost(db, batch_id=accepted.batch_id) == spend.Cost(decimal.Decimal("0.25"), "EUR")
    budget = await fairness.tenant_budget(db, tenant=TenantName("acme"))
    assert budget is not None and budget.money is not None and budget.money.spent_today == decimal.Decimal("0.25")


async def test_unpriced_attempts_cost_nothing_recorded_and_a_batch_of_them_has_no_cost(db: asyncpg.Connection) -> None:
    await factories.seed(db)
    accepted = await accepting.accept_batch(db, factories.batch_request(count=2))
    claimed = await _claim_all(db, 2)
    done = [transitions.succeed(j.id, j.fence, result={}, validation={"passed": True}) for j in claimed]
    await jobs.finish_many(db, done, worker_id=WORKER)
    assert await spend.batch_cost(db, batch_id=accepted.batch_id) is None
    assert await db.fetchval("SELECT count(*) FROM job_attempts WHERE cost IS NOT NULL") == 0
    assert (await spend.job_costs(db, job_id=claimed[0].id)).total is None


async def _spend(conn: asyncpg.Connection, tenant: str, amount: str) -> None:
    """Spend `amount` of `tenant` through the real path: claim one of its jobs and finish it at that
    cost (the other tenants' jobs claimed with it are given back)."""
    claimed = await jobs.claim_batch(conn, pool=POOL, worker_id=WORKER, limit=50, lease_ttl_s=600)
    mine = [j for j in claimed if j.tenant == tenant][:1]
    assert mine, f"{tenant} could not claim"
    others = [j for j in claimed if j is not mine[0]]
    await jobs.release_many(conn, [(j.id, j.fence) for j in others], worker_id=WORKER)
    await jobs.finish_many(conn, [_paid(mine[0], amount)], worker_id=WORKER)


async def _planned(conn: asyncpg.Connection) -> set[str]:
    return {r["tenant"] for r in await conn.fetch("SELECT tenant FROM lading_claim_plan($1, 100)", POOL)}


async def test_a_spent_money_budget_stops_only_that_tenants_claims_until_raised_or_the_period_ends(
        db: asyncpg.Connection,
) -> None:
    await factories.seed(db)
    await _tenant(db, "metered", budget={"currency": "EUR", "monthly": "1.00", "daily": "0.60"})
    await _tenant(db, "other")
    await accepting.accept_batch(db, factories.batch_request(name="m", count=10, tenant="metered"))
    await accepting.accept_batch(db, factories.batch_request(name="o", count=10, tenant="other"))
    metered = TenantName("metered")
    assert await _planned(db) == {"metered", "other"}

    await _spend(db, "metered", "0.59")
    assert await _planned(db) == {"metered", "other"}  # below the daily amount: still a contender
    await _spend(db, "metered", "0.01")  # exactly the daily amount: spent
    budget = await fairness.tenant_budget(db, tenant=metered)
    assert budget is not None and budget.money is not None
    assert (budget.money.daily_spent, budget.money.monthly_spent, budget.claims_stopped) == (True, False, True)
    assert budget.money.resets_at == budget.money.day_resets_at
    assert await _planned(db) == {"other"}
    assert await fairness.budgets_exhausted(db) == {metered: True}  # the gauge the alert rule watches
    rest = await jobs.claim_batch(db, pool=POOL, worker_id=WORKER, limit=50, lease_ttl_s=600)
    assert {j.tenant for j in rest} == {"other"}
    states = collections.Counter(
        r["state"] for r in await db.fetch("SELECT state FROM extraction_jobs WHERE tenant = 'metered'")
    )
    assert states["READY"] + states["RETRY_SCHEDULED"] == 8 and states["SUCCEEDED"] == 2  # waiting, never failed

    # Last month's spend counts for neither period: claims resume.
    await db.execute("UPDATE tenant_spend SET day = day - 40")
    assert "metered" in await _planned(db)

    # The month's amount alone (no daily one) stops claims until the first of next month.
    await _tenant(db, "metered", budget={"currency": "EUR", "monthly": "1.00"})
    await _spend(db, "metered", "0.70")
    assert "metered" in await _planned(db)
    await _spend(db, "metered", "0.30")
    budget = await fairness.tenant_budget(db, tenant=metered)
    assert budget is not None and budget.money is not None and budget.claims_stopped
    assert (budget.money.daily_spent, budget.money.monthly_spent) == (False, True)
    assert budget.money.resets_at == budget.money.month_resets_at
    assert (budget.money.month_resets_at.day, budget.money.month_resets_at.hour) == (1, 0)
    assert "metered" not in await _planned(db)

    # Raising the budget resumes claims at once.
    await _tenant(db, "metered", budget={"currency": "EUR", "monthly": "50"})
    assert not await fairness.tenant_budget_exhausted(db, metered)
    assert "metered" in await _planned(db)


def _quota(budget: dict[str, str] | None) -> specs.TenantQuota:
    spec: dict[str, object] = {"namespaces": ["acme"]}
    if budget is not None:
        spec["budget"] = budget
    return specs.TenantQuota.model_validate({"metadata": {"name": "acme"}, "spec": spec})


def _pool(name: str, currency: str | None) -> specs.InferencePool:
    spec: dict[str, object] = {"provider": "builtin"}
    if currency is not None:
        spec["pricing"] = {"currency": currency, "inputPerMillionTokens": "0.15", "outputPerMillionTokens": "0.60"}
    return specs.InferencePool.model_validate({"metadata": {"name": name, "namespace": "acme"}, "spec": spec})


def _batch(pool: str) -> specs.ExtractionBatch:
    return specs.ExtractionBatch.model_validate({
        "metadata": {"name": f"b-{pool}", "namespace": "acme", "uid": f"u-{pool}"},
        "spec": {"schema": "invoice.v1", "inferencePoolRef": {"name": pool}, "documents": [{"key": "k", "text": "t"}]},
    })  # fmt: skip


async def test_a_pool_priced_in_another_currency_than_the_budget_is_refused_at_admission(
        db: asyncpg.Connection,
) -> None:
    await applying.apply_tenant_quota(db, _quota({"currency": "EUR", "monthly": "500.00"}))
    for name, currency in (("usd", "USD"), ("eur", "EUR"), ("free", None)):
        await applying.apply_inference_pool(db, _pool(name, currency))
    with pytest.raises(applying.AdmissionRejected) as refused:
        await applying.admit_batch(db, _batch("usd"))
    assert refused.value.reason == reasons.CURRENCY_MISMATCH
    assert "priced in USD" in str(refused.value) and "budgets in EUR" in str(refused.value)
    assert await db.fetchval("SELECT count(*) FROM batches") == 0  # nothing half-applied
    assert (await applying.admit_batch(db, _batch("eur"))).result.created
    assert (await applying.admit_batch(db, _batch("free"))).result.created  # unpriced: nothing to count

    # Without a budget, any currency is admitted.
    await applying.apply_tenant_quota(db, _quota(None))
    assert (await applying.admit_batch(db, _batch("usd"))).result.created


async def test_a_priced_pools_currency_cannot_change_and_nothing_is_applied(db: asyncpg.Connection) -> None:
    await applying.apply_inference_pool(db, _pool("p", "USD"))
    with pytest.raises(applying.PricingCurrencyChanged, match="priced in USD; a priced pool's currency cannot"):
        await applying.apply_inference_pool(db, _pool("p", "EUR"))
    stored = await registry.get_pool(db, name=PoolName("acme/p"))
    assert stored is not None and stored.spec["pricing"]["currency"] == "USD"
    await applying.apply_inference_pool(db, _pool("p", "USD"))  # same currency, new prices: fine

