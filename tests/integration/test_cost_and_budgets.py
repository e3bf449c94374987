"""Cost per attempt, job, batch and tenant, and money budgets, on real PostgreSQL (docs/cost.md).

Costs go through the real write path (`jobs.finish_many`, the group commit) and are read back
through the repositories status and reports use; sums are exact decimals, never floats.
"""

from __future__ import annotations

import asyncio
import collections
import datetime as dt
import decimal
import os
import signal
import sys

import asyncpg
import pytest
from lading_worker import reaping

from lading import accepting, applying, costing, failpoints, metrics, reasons
from lading.db import fairness, gpu_time, jobs, registry, reuse, spend
from lading.db import pool as dbpool
from lading.ids import JobId, PoolName, TenantName, WorkerId
from lading.jobs import transitions
from lading.jobs.states import JobState
from lading.models import specs
from lading.settings import AttemptSettings, ReaperSettings
from lading_elected import gpu_costs
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



# --- vLLM pools priced by the GPU hour (lading.db.gpu_time, lading_elected.gpu_costs).

GPU_POOL = PoolName("lading-system/vllm")
GPU_SPEC = {"vllm": {"gpus": 2}, "pricing": {"currency": "EUR", "gpuHourPrice": "2.50"}}


async def _gpu_pool(conn: asyncpg.Connection) -> None:
    await registry.upsert_pool(conn, name=GPU_POOL, provider="vllm", model="m", spec=GPU_SPEC)


async def _past_minute(conn: asyncpg.Connection, minutes_ago: int) -> dt.datetime:
    """The start of the minute `minutes_ago` minutes before now (database time)."""
    start: dt.datetime = await conn.fetchval(
        "SELECT date_bin('60 seconds', clock_timestamp() - make_interval(mins => $1), timestamptz '2000-01-01Z')",
        minutes_ago,
    )
    return start


async def _sample(conn: asyncpg.Connection, at: dt.datetime, replicas: int, gpus: int = 2) -> None:
    await conn.execute("INSERT INTO pool_gpu_samples (pool, at, ready_replicas, gpus) VALUES ($1, $2, $3, $4)",
                       GPU_POOL, at, replicas, gpus)  # fmt: skip


async def _gpu_attempts(
        conn: asyncpg.Connection, tenant: str, tokens: list[tuple[int, int]], *, finished_at: dt.datetime
) -> list[jobs.ClaimedJob]:
    """Jobs of `tenant` on the GPU pool, claimed and finished with these (in, out) tokens and cost
    pending (as the worker records them for a pool priced by the GPU hour), at `finished_at`."""
    await accepting.accept_batch(
        conn, factories.batch_request(name=f"gpu-{tenant}", tenant=tenant, pool=GPU_POOL, count=len(tokens))
    )
    claimed = await jobs.claim_batch(conn, pool=GPU_POOL, worker_id=WORKER, limit=len(tokens), lease_ttl_s=600)
    mine = sorted((j for j in claimed if j.tenant == tenant), key=lambda j: j.id)
    assert len(mine) == len(tokens)
    pricing = costing.Pricing.from_stored(GPU_SPEC)
    assert pricing is not None
    finishes = [
        transitions.succeed(j.id, j.fence, result={}, validation={"passed": True}, usage=transitions.Usage(
            tokens_in=t_in, tokens_out=t_out,
            cost=pricing.cost(tokens_in=t_in, tokens_out=t_out), currency=pricing.currency,
        ))
        for j, (t_in, t_out) in zip(mine, tokens, strict=True)
    ]  # fmt: skip
    assert len(await jobs.finish_many(conn, finishes, worker_id=WORKER)) == len(tokens)
    await conn.execute("UPDATE job_attempts SET finished_at = $2 WHERE job_id = ANY($1::bigint[])",
                       [j.id for j in mine], finished_at)  # fmt: skip
    return mine


async def _attempt_costs(conn: asyncpg.Connection) -> dict[int, decimal.Decimal]:
    rows = await conn.fetch("SELECT job_id, cost FROM job_attempts WHERE cost IS NOT NULL")
    return {r["job_id"]: r["cost"] for r in rows}


async def test_a_gpu_interval_is_split_exactly_among_its_tenants_attempts_by_tokens(db: asyncpg.Connection) -> None:
    await factories.seed(db)
    await _gpu_pool(db)
    for tenant in ("acme", "beta", "gamma"):
        await _tenant(db, tenant)
    start = await _past_minute(db, 5)
    # 3 replicas for the first 20 s, 1 for the next 40 s (2 GPUs each): 3*2*20 + 1*2*40 = 200 GPU-s;
    # at 2.50 per GPU hour: 200 * 2.5 / 3600 = 0.138888...: 0.138888889 (half even, 10^-9).
    await _sample(db, start - dt.timedelta(seconds=30), 3)
    await _sample(db, start + dt.timedelta(seconds=20), 1)
    await _sample(db, start + dt.timedelta(seconds=65), 1)  # the operator saw the interval through
    at = start + dt.timedelta(seconds=30)
    acme = await _gpu_attempts(db, "acme", [(100, 0), (0, 233)], finished_at=at)
    beta = await _gpu_attempts(db, "beta", [(317, 0)], finished_at=at)
    gamma = await _gpu_attempts(db, "gamma", [(1, 0)], finished_at=at)
    assert await db.fetchval("SELECT count(*) FROM job_attempts WHERE cost IS NULL AND cost_currency = 'EUR'") == 4
    assert await db.fetchval("SELECT count(*) FROM extraction_jobs WHERE cost_currency IS NOT NULL") == 0

    closed = await gpu_time.close_due(db)

    # The minute of the first sample (30 s of 3 replicas before `start`: idle), then the one with the attempts.
    assert [c.starts_at for c in closed] == [start - dt.timedelta(seconds=60), start]
    idle, interval = closed
    assert (idle.gpu_seconds, idle.cost, idle.idle, idle.attempts) == (
        decimal.Decimal(180), decimal.Decimal("0.125000000"), idle.cost, 0
    )
    cost = decimal.Decimal("0.138888889")
    assert (interval.gpu_seconds, interval.cost, interval.charged, interval.idle) == (
        decimal.Decimal(200), cost, cost, decimal.Decimal(0)
    )
    assert (interval.attempts, interval.tokens) == (4, 651)
    # 138888889 units of 10^-9 split 100:233:317:1 of 651 tokens, each rounded down: 21334698,
    # 49709848, 67630995, 213346 (remainders 502, 89, 68, 643 of 651); the 2 units left over go one
    # each to the largest remainders (the 4th and the 1st).
    expected = [decimal.Decimal(x) for x in ("0.021334699", "0.049709848", "0.067630995", "0.000213347")]
    assert costing.split_interval(cost, [100, 233, 317, 1]) == expected
    by_job = await _attempt_costs(db)
    order = [acme[0].id, acme[1].id, beta[0].id, gamma[0].id]
    assert [by_job[j] for j in order] == expected
    assert sum(by_job.values()) == cost  # to the last unit of 10^-9
    spent = {r["tenant"]: r["amount"] for r in await db.fetch("SELECT tenant, amount FROM tenant_spend")}
    assert spent == {"acme": expected[0] + expected[1], "beta": expected[2], "gamma": expected[3]}
    assert interval.by_tenant == spent
    day = await db.fetchval("SELECT DISTINCT day FROM tenant_spend")
    assert day == start.astimezone(dt.UTC).date()
    job_sums = {r["id"]: r["cost"] for r in await db.fetch("SELECT id, cost FROM extraction_jobs WHERE pool = $1",
                                                           GPU_POOL)}  # fmt: skip
    assert [job_sums[j] for j in order] == expected
    batch_sum = await db.fetchval("SELECT sum(amount) FROM batch_costs WHERE currency = 'EUR'")
    assert batch_sum == cost
    # Closed once: nothing more is due, and a second round charges nothing.
    assert await gpu_time.close_due(db) == []
    assert sum((await _attempt_costs(db)).values()) == cost


async def test_an_interval_without_attempts_is_idle_and_charged_to_no_tenant(db: asyncpg.Connection) -> None:
    await factories.seed(db)
    await _gpu_pool(db)
    start = await _past_minute(db, 4)
    await _sample(db, start, 1)
    await _sample(db, start + dt.timedelta(seconds=61), 0)  # seen through the interval, then scaled to zero
    closed = await gpu_time.close_due(db)
    # The first interval: 1 replica x 2 GPUs x 60 s = 120 GPU-s = 0.083333333; the next one (0 GPU-s
    # after the first second) and later ones up to the last sample are due too.
    first = closed[0]
    assert (first.starts_at, first.gpu_seconds, first.cost, first.charged) == (
        start, decimal.Decimal(120), decimal.Decimal("0.083333333"), decimal.Decimal(0)
    )
    assert first.idle == first.cost and first.by_tenant == {}
    assert await db.fetchval("SELECT count(*) FROM tenant_spend") == 0
    report = await gpu_time.pool_intervals(db, pool=GPU_POOL, since=start)
    assert [(r.starts_at, r.idle) for r in report][:1] == [(start, decimal.Decimal("0.083333333"))]


async def test_a_tenants_gpu_priced_spend_stops_its_claims_once_it_crosses_its_budget(db: asyncpg.Connection) -> None:
    await factories.seed(db)
    await _gpu_pool(db)
    await _tenant(db, "metered", budget={"currency": "EUR", "monthly": "0.10"})
    await _tenant(db, "other")
    start = await _past_minute(db, 3)
    await _sample(db, start, 3)
    await _sample(db, start + dt.timedelta(seconds=60), 3)  # 360 GPU-s: 0.25 EUR, all to one attempt
    await _gpu_attempts(db, "metered", [(500, 20)], finished_at=start + dt.timedelta(seconds=10))
    await accepting.accept_batch(
        db, factories.batch_request(name="more", tenant="metered", pool=GPU_POOL, count=3)
    )
    await accepting.accept_batch(db, factories.batch_request(name="theirs", tenant="other", pool=GPU_POOL, count=3))

    async def planned() -> set[str]:
        return {r["tenant"] for r in await db.fetch("SELECT tenant FROM lading_claim_plan($1, 100)", GPU_POOL)}

    assert await planned() == {"metered", "other"}  # the finished attempt's cost is still pending
    await gpu_time.close_due(db)
    budget = await fairness.tenant_budget(db, tenant=TenantName("metered"))
    assert budget is not None and budget.money is not None and budget.claims_stopped
    assert budget.money.spent_this_month == decimal.Decimal("0.250000000")
    assert await planned() == {"other"}  # its jobs wait; the other tenant's are claimed


_CRASHING_ALLOCATOR = """
import asyncio, sys
from lading.db import gpu_time
from lading.db import pool as dbpool

async def main():
    conn = await dbpool.connect(sys.argv[1])
    await gpu_time.close_due(conn)

asyncio.run(main())
"""


async def test_an_allocator_killed_mid_interval_charges_nothing_and_the_rerun_charges_once(
        db: asyncpg.Connection, database_url: str
) -> None:
    await factories.seed(db)
    await _gpu_pool(db)
    await _tenant(db, "acme")
    start = await _past_minute(db, 3)
    await _sample(db, start, 2)
    await _sample(db, start + dt.timedelta(seconds=60), 2)  # 240 GPU-s: 0.166666667
    await _gpu_attempts(db, "acme", [(10, 0), (30, 0)], finished_at=start + dt.timedelta(seconds=5))
    crashing = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _CRASHING_ALLOCATOR, database_url,
        env={**os.environ, failpoints.ENV_VAR: "gpu_time.after_charge_before_close=kill"},
    )  # fmt: skip
    assert await asyncio.wait_for(crashing.wait(), 60) == -signal.SIGKILL  # killed after charging, before commit
    assert await _attempt_costs(db) == {}
    assert await db.fetchval("SELECT count(*) FROM tenant_spend") == 0
    assert await db.fetchval("SELECT count(*) FROM pool_gpu_intervals") == 0

    closed = await gpu_time.close_due(db)  # the rerun (another replica, or the same after restart)
    assert [c.starts_at for c in closed] == [start]
    assert await gpu_time.close_due(db) == []  # and again: nothing due, nothing charged twice
    cost = decimal.Decimal("0.166666667")
    assert sum((await _attempt_costs(db)).values()) == cost
    assert await db.fetchval("SELECT sum(amount) FROM tenant_spend WHERE tenant = 'acme'") == cost
    assert await db.fetchval("SELECT sum(cost) FROM extraction_jobs WHERE pool = $1", GPU_POOL) == cost


PER_TOKEN_SPEC = {"pricing": {"currency": "EUR", "inputPerMillionTokens": "0.15", "outputPerMillionTokens": "0.60"}}


async def _reap(conn: asyncpg.Connection) -> dict[JobId, JobState]:
    async with conn.transaction():
        leases = await jobs.lock_expired_leases(conn, limit=100)
        return dict(await jobs.reap_many(conn, [
            jobs.Reap(lease.id, lease.fence, JobState.RETRY_SCHEDULED, 0.0, "LeaseExpired") for lease in leases
        ]))  # fmt: skip


async def _expire(conn: asyncpg.Connection, job_ids: list[int]) -> None:
    await conn.execute("UPDATE extraction_jobs SET lease_until = clock_timestamp() - interval '1 s'"
                       " WHERE id = ANY($1::bigint[])", job_ids)  # fmt: skip


async def test_a_reused_attempt_on_a_priced_pool_costs_zero_in_its_currency_and_null_unpriced(
        db: asyncpg.Connection,
) -> None:
    await factories.seed(db)
    await registry.upsert_pool(db, name=POOL, provider="builtin", model="lading-builtin", spec=PER_TOKEN_SPEC)
    accepted = await accepting.accept_batch(db, factories.batch_request(name="reusing", count=2))
    source, reusing = sorted(await _claim_all(db, 2), key=lambda j: j.id)
    await jobs.finish_many(db, [_paid(source, "0.003")], worker_id=WORKER)
    taken = transitions.reused(reusing.id, reusing.fence, source=source.id, result={}, validation={"passed": True})
    assert await reuse.finish_reused_many(db, [taken], worker_id=WORKER) == {reusing.id}
    assert await db.fetchrow("SELECT cost, cost_currency FROM job_attempts WHERE job_id = $1", reusing.id) == (0, "EUR")
    assert (await spend.job_costs(db, job_id=reusing.id)).total == spend.Cost(decimal.Decimal(0), "EUR")
    assert await spend.batch_cost(db, batch_id=accepted.batch_id) == spend.Cost(decimal.Decimal("0.003"), "EUR")

    # A batch of reused jobs only costs 0, not nothing; on an unpriced pool the attempt costs NULL.
    only = await accepting.accept_batch(db, factories.batch_request(name="only-reused", count=1))
    (job,) = await _claim_all(db, 1)
    taken = transitions.reused(job.id, job.fence, source=source.id, result={}, validation={"passed": True})
    await reuse.finish_reused_many(db, [taken], worker_id=WORKER)
    assert await spend.batch_cost(db, batch_id=only.batch_id) == spend.Cost(decimal.Decimal(0), "EUR")
    await registry.upsert_pool(db, name=POOL, provider="builtin", model="lading-builtin", spec={})
    await accepting.accept_batch(db, factories.batch_request(name="unpriced", count=1))
    (job,) = await _claim_all(db, 1)
    taken = transitions.reused(job.id, job.fence, source=source.id, result={}, validation={"passed": True})
    await reuse.finish_reused_many(db, [taken], worker_id=WORKER)
    assert await db.fetchrow("SELECT cost, cost_currency FROM job_attempts WHERE job_id = $1", job.id) == (None, None)


async def test_a_reaped_attempt_is_charged_its_noted_reservation_once(
        db: asyncpg.Connection, database_url: str
) -> None:
    await factories.seed(db)
    await registry.upsert_pool(db, name=POOL, provider="builtin", model="lading-builtin", spec=PER_TOKEN_SPEC)
    await _tenant(db, "acme", budget={"currency": "EUR", "monthly": "100"})
    accepted = await accepting.accept_batch(db, factories.batch_request(count=2))
    noted, silent = sorted(await _claim_all(db, 2), key=lambda j: j.id)
    assert await spend.note_reservation(db, noted.id, noted.fence, 1000, 500)
    await _expire(db, [noted.id, silent.id])
    counted = metrics.COST.labels("acme", POOL, "EUR")
    before = counted._value.get()
    pool = await dbpool.create_pool(database_url, max_size=2)
    try:
        reaper = reaping.Reaper(pool, settings=ReaperSettings(), attempt=AttemptSettings())
        assert (await reaper.run_once()).rescued == 2
    finally:
        await pool.close()
    reservation = decimal.Decimal("1000") * decimal.Decimal("0.15") / 10**6 + 500 * decimal.Decimal("0.60") / 10**6
    assert counted._value.get() - before == pytest.approx(float(reservation))
    assert await db.fetchrow("SELECT cost, cost_currency FROM job_attempts WHERE job_id = $1", noted.id) == (
        reservation, "EUR"
    )
    # Nothing noted: nothing was sent, it costs 0.
    assert await db.fetchval("SELECT cost FROM job_attempts WHERE job_id = $1", silent.id) == 0
    budget = await fairness.tenant_budget(db, tenant=TenantName("acme"))
    assert budget is not None and budget.money is not None and budget.money.spent_today == reservation
    assert await spend.batch_cost(db, batch_id=accepted.batch_id) == spend.Cost(reservation, "EUR")
    # The dead worker's finish arriving after all (it was only paused) is stale and not charged again.
    assert await jobs.finish_many(db, [_paid(noted, "0.5")], worker_id=WORKER) == set()
    budget = await fairness.tenant_budget(db, tenant=TenantName("acme"))
    assert budget is not None and budget.money is not None and budget.money.spent_today == reservation
    assert (await spend.job_costs(db, job_id=noted.id)).total == spend.Cost(reservation, "EUR")


async def test_the_batches_running_cost_sums_equal_a_scan_of_their_jobs_after_a_mixed_workload(
        db: asyncpg.Connection,
) -> None:
    await factories.seed(db)
    await registry.upsert_pool(db, name=POOL, provider="builtin", model="lading-builtin", spec=PER_TOKEN_SPEC)
    await _gpu_pool(db)
    await _tenant(db, "beta")
    batches = [
        (await accepting.accept_batch(db, factories.batch_request(name=f"mixed-{i}", count=40))).batch_id
        for i in range(3)
    ]
    claimed = sorted(await _claim_all(db, 120), key=lambda j: j.id)
    paid, stale, reaped, reused_, retried = (claimed[0:60], claimed[60:70], claimed[70:85], claimed[85:100],
                                            claimed[100:120])  # fmt: skip
    await jobs.finish_many(db, [_paid(j, f"0.00{i % 7}1") for i, j in enumerate(paid)], worker_id=WORKER)
    await _expire(db, [j.id for j in stale])
    await jobs.finish_many(db, [_paid(j, "0.07") for j in stale], worker_id=WORKER)  # stale, still paid
    for j in reaped:
        await spend.note_reservation(db, j.id, j.fence, 700, 300)
    await _expire(db, [j.id for j in reaped])
    await _reap(db)
    await jobs.finish_many(db, [_paid(j, "0.9") for j in reaped], worker_id=WORKER)  # stale after reaping
    takes = [transitions.reused(j.id, j.fence, source=paid[0].id, result={}, validation={"passed": True})
             for j in reused_]  # fmt: skip
    await reuse.finish_reused_many(db, takes, worker_id=WORKER)
    retry_finishes = [
        transitions.retry(j.id, j.fence, outcome="transient", error_class="X", error="", retry_in_s=0.0,
                          usage=transitions.Usage(tokens_in=5, cost=decimal.Decimal("0.0002"), currency="EUR"))
        for j in retried
    ]  # fmt: skip
    await jobs.finish_many(db, retry_finishes, worker_id=WORKER)
    again = await _claim_all(db, 35)  # the reaped and the retried jobs, once more
    await jobs.finish_many(db, [_paid(j, "0.011") for j in again], worker_id=WORKER)
    start = await _past_minute(db, 3)
    await _sample(db, start, 2)
    await _sample(db, start + dt.timedelta(seconds=60), 2)
    await _gpu_attempts(db, "beta", [(40, 2), (13, 9)], finished_at=start + dt.timedelta(seconds=1))
    assert await gpu_time.close_due(db)

    scanned = {
        (r["batch_id"], r["currency"]): r["amount"]
        for r in await db.fetch("SELECT batch_id, cost_currency AS currency, sum(cost) AS amount FROM extraction_jobs"
                                " WHERE cost IS NOT NULL GROUP BY batch_id, cost_currency")
    }  # fmt: skip
    kept = {(r["batch_id"], r["currency"]): r["amount"] for r in await db.fetch("SELECT * FROM batch_costs")}
    assert kept == scanned
    assert len(kept) == 4 and all(amount > 0 for amount in kept.values())
    for batch_id in batches:
        assert await spend.batch_cost(db, batch_id=batch_id) == spend.Cost(scanned[(batch_id, "EUR")], "EUR")
    # And every attempt's cost is in exactly one job, and in the tenants' spend, once.
    attempts = await db.fetchval("SELECT sum(cost) FROM job_attempts")
    assert await db.fetchval("SELECT sum(cost) FROM extraction_jobs") == attempts
    assert await db.fetchval("SELECT sum(amount) FROM tenant_spend") == attempts


async def test_one_elected_allocator_closes_the_intervals_and_counts_the_tenants_cost(
        db: asyncpg.Connection, database_url: str
) -> None:
    await factories.seed(db)
    await _gpu_pool(db)
    await _tenant(db, "acme")
    start = await _past_minute(db, 3)
    await _sample(db, start, 1)
    await _sample(db, start + dt.timedelta(seconds=60), 1)  # 120 GPU-s: 0.083333333
    await _gpu_attempts(db, "acme", [(10, 5)], finished_at=start + dt.timedelta(seconds=2))
    counted = metrics.COST.labels("acme", GPU_POOL, "EUR")
    before = counted._value.get()
    first, second = gpu_costs.Allocator(database_url), gpu_costs.Allocator(database_url)
    try:
        closed = await first.run_once()
        assert first.leader and [c.starts_at for c in closed] == [start]
        assert await second.run_once() == [] and not second.leader  # the lock is held: it stands by
    finally:
        await first.resign()
        await second.resign()
    assert counted._value.get() - before == pytest.approx(0.083333333)
    assert await db.fetchval("SELECT sum(amount) FROM tenant_spend") == decimal.Decimal("0.083333333")
