"""Claims share a pool fairly among tenants: weights, in-flight caps, aging, budgets, suspension.

Several connections stand for several worker replicas: the scheduling state is in the
database, so what one replica claims counts against what the others may claim.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses

import asyncpg

from lading import accepting
from lading.db import batches, fairness, jobs, pool, registry
from lading.ids import PoolName, TenantName, WorkerId
from lading.jobs import transitions
from tests.support import factories

POOL = PoolName(factories.POOL)
WORKER = WorkerId("w")


async def _tenant(
        conn: asyncpg.Connection, name: str, *, weight: int = 1, max_in_flight: int | None = None,
        budget: int | None = None,
) -> None:
    await registry.upsert_tenant(
        conn, name=TenantName(name), namespaces=[name], weight=weight, max_queued_jobs=None,
        max_in_flight=max_in_flight, spec={} if budget is None else {"dailyTokenBudget": budget},
    )


async def _seed(conn: asyncpg.Connection, tenants: dict[str, int], **options: int | None) -> None:
    await factories.seed(conn)
    for name, weight in tenants.items():
        await _tenant(conn, name, weight=weight, **options)


async def _enqueue(conn: asyncpg.Connection, tenant: str, count: int, *, name: str = "b1",
                   priority: str = "normal") -> accepting.AcceptResult:
    return await accepting.accept_batch(
        conn, factories.batch_request(name=name, count=count, tenant=tenant, priority=priority)
    )


def _done(job: jobs.ClaimedJob, *, tokens: int | None = None) -> transitions.Finish:
    return transitions.succeed(
        job.id, job.fence, result={}, validation={"passed": True},
        usage=transitions.Usage(tokens_in=tokens, tokens_out=0 if tokens is not None else None),
    )


async def test_three_tenants_weighted_1_1_2_share_claims_within_ten_percent_across_replicas(
        db: asyncpg.Connection, database_url: str
) -> None:
    weights = {"small-a": 1, "small-b": 1, "big": 2}
    await _seed(db, weights)
    for tenant in weights:
        await _enqueue(db, tenant, 1500)
    got: collections.Counter[str] = collections.Counter()
    rounds = 60

    async def replica(n: int) -> None:
        conn = await pool.connect(database_url)
        try:
            for r in range(rounds):
                # Replicas claim for different amounts of free capacity, like real claimers do.
                claimed = await jobs.claim_batch(
                    conn, pool=POOL, worker_id=WorkerId(f"r{n}"), limit=1 + (n + r) % 5, lease_ttl_s=60
                )
                got.update(j.tenant for j in claimed)
                await jobs.finish_many(conn, [_done(j) for j in claimed], worker_id=WorkerId(f"r{n}"))
        finally:
            await conn.close()

    await asyncio.gather(*(replica(n) for n in range(4)))
    total = sum(got.values())
    assert total > 500, got
    weight_sum = sum(weights.values())
    for tenant, weight in weights.items():
        expected = total * weight / weight_sum
        assert abs(got[tenant] - expected) <= 0.10 * expected, (tenant, got, expected)
    # Every tenant still had work: the shares were measured under contention.
    counts = await db.fetch(
        "SELECT tenant, count(*) FROM extraction_jobs WHERE state = 'READY' GROUP BY tenant"
    )
    assert {r["tenant"] for r in counts} == set(weights)


async def test_one_claim_batch_is_split_by_weight(db: asyncpg.Connection) -> None:
    await _seed(db, {"a": 1, "b": 1, "c": 2})
    for tenant in ("a", "b", "c"):
        await _enqueue(db, tenant, 100)
    claimed = await jobs.claim_batch(db, pool=POOL, worker_id=WORKER, limit=40, lease_ttl_s=60)
    assert collections.Counter(j.tenant for j in claimed) == {"a": 10, "b": 10, "c": 20}


async def test_a_tenant_at_its_in_flight_cap_gets_no_more_while_others_proceed(
        db: asyncpg.Connection, database_url: str
) -> None:
    await factories.seed(db)
    await _tenant(db, "capped", max_in_flight=3)
    await _tenant(db, "free")
    await _enqueue(db, "capped", 200)
    await _enqueue(db, "free", 200)
    owned: dict[WorkerId, list[jobs.ClaimedJob]] = collections.defaultdict(list)

    async def replica(n: int) -> None:
        conn = await pool.connect(database_url)
        worker = WorkerId(f"r{n}")
        try:
            for _ in range(6):
                owned[worker] += await jobs.claim_batch(conn, pool=POOL, worker_id=worker, limit=4, lease_ttl_s=60)
        finally:
            await conn.close()

    await asyncio.gather(*(replica(n) for n in range(8)))
    running = dict(await db.fetch(
        "SELECT tenant, count(*) FROM extraction_jobs WHERE state = 'RUNNING' GROUP BY tenant"
    ))
    assert running["capped"] == 3
    assert running["free"] == 200 - await db.fetchval(
        "SELECT count(*) FROM extraction_jobs WHERE tenant = 'free' AND state = 'READY'"
    )
    assert running["free"] > 100
    # Finishing one capped attempt frees exactly one slot.
    worker, done = next((w, j) for w, js in owned.items() for j in js if j.tenant == "capped")
    assert await jobs.finish_many(db, [_done(done)], worker_id=worker) == {done.id}
    again = await jobs.claim_batch(db, pool=POOL, worker_id=WORKER, limit=10, lease_ttl_s=60)
    assert collections.Counter(j.tenant for j in again)["capped"] == 1


async def _claim_and_finish(conn: asyncpg.Connection, *, limit: int) -> list[jobs.ClaimedJob]:
    claimed = await jobs.claim_batch(conn, pool=POOL, worker_id=WORKER, limit=limit, lease_ttl_s=60)
    await jobs.finish_many(conn, [_done(j) for j in claimed], worker_id=WORKER)
    return claimed


async def _low_jobs_claimed_under_high_load(conn: asyncpg.Connection, *, low_waited_s: int) -> int:
    """5 low jobs that have waited `low_waited_s`, and a constant high-priority load: every round
    3 new high jobs arrive and 2 jobs are claimed, so high work never runs out."""
    await factories.seed(conn)
    low = await _enqueue(conn, factories.TENANT, 5, name="low", priority="low")
    await _enqueue(conn, factories.TENANT, 20, name="high-seed", priority="high")
    # Fast-forward: the database clock decides, so move the jobs' due time, not the clock.
    await conn.execute(
        "UPDATE extraction_jobs SET available_at = available_at - make_interval(secs => $2) WHERE batch_id = $1",
        low.batch_id, low_waited_s,
    )
    low_claimed = 0
    for r in range(40):
        await _enqueue(conn, factories.TENANT, 3, name=f"high-{r}", priority="high")
        claimed = await _claim_and_finish(conn, limit=2)
        low_claimed += sum(1 for j in claimed if j.batch_id == low.batch_id)
    # The high load never ran dry: whatever low jobs got, they did not get it from idle capacity.
    assert await conn.fetchval("SELECT count(*) FROM extraction_jobs WHERE priority = 0 AND state = 'READY'") > 20
    return low_claimed


async def test_low_priority_jobs_keep_progressing_under_a_constant_high_priority_load(db: asyncpg.Connection) -> None:
    # Two aging steps and a minute: the low jobs now rank ahead of high jobs that just arrived.
    assert await _low_jobs_claimed_under_high_load(db, low_waited_s=2 * int(jobs.CLAIM_AGING_S) + 60) == 5


async def test_low_priority_jobs_that_have_not_aged_enough_wait_for_high_ones(db: asyncpg.Connection) -> None:
    """The control for the test above: one aging step is not enough to pass `high` work."""
    assert await _low_jobs_claimed_under_high_load(db, low_waited_s=int(jobs.CLAIM_AGING_S)) == 0


async def test_the_aging_step_in_the_claim_index_is_the_documented_one(db: asyncpg.Connection) -> None:
    step = await db.fetchval("SELECT lading_claim_rank(now(), 1::smallint) - now()")
    assert step.total_seconds() == jobs.CLAIM_AGING_S


async def test_within_a_tenant_priority_goes_first_then_age(db: asyncpg.Connection) -> None:
    await factories.seed(db)
    normal = await _enqueue(db, factories.TENANT, 2, name="normal", priority="normal")
    low = await _enqueue(db, factories.TENANT, 2, name="low", priority="low")
    high = await _enqueue(db, factories.TENANT, 2, name="high", priority="high")
    rounds = [
        {j.batch_id for j in await jobs.claim_batch(db, pool=POOL, worker_id=WORKER, limit=2, lease_ttl_s=60)}
        for _ in range(3)
    ]
    # Accepted last, the high jobs go first; the low ones, accepted before them, go last.
    assert rounds == [{high.batch_id}, {normal.batch_id}, {low.batch_id}]


async def test_a_spent_daily_token_budget_stops_claims_without_failing_jobs_until_raised_or_reset(
        db: asyncpg.Connection,
) -> None:
    await factories.seed(db)
    await _tenant(db, "metered", budget=100)
    await _tenant(db, "other")
    await _enqueue(db, "metered", 10)
    await _enqueue(db, "other", 10)
    metered = TenantName("metered")
    first = await jobs.claim_batch(db, pool=POOL, worker_id=WORKER, limit=4, lease_ttl_s=60)
    assert collections.Counter(j.tenant for j in first) == {"metered": 2, "other": 2}
    await jobs.finish_many(db, [_done(j, tokens=60) for j in first], worker_id=WORKER)
    budget = await fairness.tenant_budget(db, tenant=metered)
    assert budget is not None and (budget.budget, budget.used, budget.exhausted) == (100, 120, True)
    assert await fairness.tenant_budget_exhausted(db, metered)

    rest = await jobs.claim_batch(db, pool=POOL, worker_id=WORKER, limit=20, lease_ttl_s=60)
    assert {j.tenant for j in rest} == {"other"} and len(rest) == 8
    assert await db.fetchval(
        "SELECT count(*) FROM extraction_jobs WHERE tenant = 'metered' AND state = 'READY'"
    ) == 8  # waiting, not failed

    await _tenant(db, "metered", budget=1000)  # raised
    assert not await fairness.tenant_budget_exhausted(db, metered)
    resumed = await jobs.claim_batch(db, pool=POOL, worker_id=WORKER, limit=3, lease_ttl_s=60)
    assert [j.tenant for j in resumed] == ["metered"] * 3
    await jobs.finish_many(db, [_done(j, tokens=400) for j in resumed], worker_id=WORKER)
    assert await fairness.tenant_budget_exhausted(db, metered)
    assert await jobs.claim_batch(db, pool=POOL, worker_id=WORKER, limit=3, lease_ttl_s=60) == []

    # A new UTC day: what was spent belongs to yesterday.
    await db.execute("UPDATE tenant_usage SET day = day - 1")
    assert not await fairness.tenant_budget_exhausted(db, metered)
    assert len(await jobs.claim_batch(db, pool=POOL, worker_id=WORKER, limit=3, lease_ttl_s=60)) == 3


async def test_suspended_batches_are_skipped_and_resume_where_they_were(db: asyncpg.Connection) -> None:
    await factories.seed(db)
    paused = await _enqueue(db, factories.TENANT, 5, name="paused")
    other = await _enqueue(db, factories.TENANT, 3, name="other")
    assert await batches.set_suspended(db, batch_id=paused.batch_id, suspended=True) == 5
    claimed = await jobs.claim_batch(db, pool=POOL, worker_id=WORKER, limit=10, lease_ttl_s=60)
    assert {j.batch_id for j in claimed} == {other.batch_id} and len(claimed) == 3
    assert await jobs.claim_batch(db, pool=POOL, worker_id=WORKER, limit=10, lease_ttl_s=60) == []
    assert await batches.set_suspended(db, batch_id=paused.batch_id, suspended=False) == 5
    resumed = await jobs.claim_batch(db, pool=POOL, worker_id=WORKER, limit=10, lease_ttl_s=60)
    assert {j.batch_id for j in resumed} == {paused.batch_id} and len(resumed) == 5


async def test_a_batch_accepted_suspended_is_never_claimed(db: asyncpg.Connection) -> None:
    await factories.seed(db)
    request = factories.batch_request(name="held", count=4)
    held = await accepting.accept_batch(db, dataclasses.replace(request, suspended=True))
    assert await jobs.claim_batch(db, pool=POOL, worker_id=WORKER, limit=10, lease_ttl_s=60) == []
    assert await db.fetchval("SELECT count(*) FROM extraction_jobs WHERE suspended") == 4
    assert await batches.set_suspended(db, batch_id=held.batch_id, suspended=False) == 4
    assert len(await jobs.claim_batch(db, pool=POOL, worker_id=WORKER, limit=10, lease_ttl_s=60)) == 4


async def test_a_tenant_back_from_idle_banks_no_credit(db: asyncpg.Connection) -> None:
    await _seed(db, {"busy": 1, "returning": 1})
    await _enqueue(db, "busy", 300)
    for _ in range(20):
        await _claim_and_finish(db, limit=10)
    await _enqueue(db, "returning", 300)
    got: collections.Counter[str] = collections.Counter()
    for _ in range(10):
        got.update(j.tenant for j in await _claim_and_finish(db, limit=10))
    # Without the lift, "returning" would take every one of these 100 claims (200 behind).
    assert got["busy"] >= 35, got


async def test_fair_share_state_is_reported(db: asyncpg.Connection) -> None:
    await _seed(db, {"a": 1, "c": 2}, max_in_flight=50)
    await _enqueue(db, "a", 10)
    await _enqueue(db, "c", 10)
    await jobs.claim_batch(db, pool=POOL, worker_id=WORKER, limit=6, lease_ttl_s=60)
    shares = {s.tenant: s for s in await fairness.shares_of_pool(db, pool=POOL)}
    assert (shares[TenantName("a")].served, shares[TenantName("a")].in_flight, shares[TenantName("a")].due) == (2, 2, 8)
    assert (shares[TenantName("c")].served, shares[TenantName("c")].in_flight, shares[TenantName("c")].due) == (4, 4, 6)
    assert shares[TenantName("c")].vtime == shares[TenantName("a")].vtime
