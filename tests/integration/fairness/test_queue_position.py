"""A batch's place in its pool's queue (`lading.db.queue`): the position the fair-share claim order
gives it, the ETA from the pool's throughput, and a priority change applied to its jobs in rounds."""

from __future__ import annotations

import asyncpg

from lading import accepting
from lading.db import jobs, queue, registry
from lading.ids import BatchId, PoolName, TenantName, WorkerId
from lading.jobs import transitions
from tests.support import factories

POOL = PoolName(factories.POOL)


async def _tenant(conn: asyncpg.Connection, name: str, *, weight: int) -> None:
    await registry.upsert_tenant(
        conn, name=TenantName(name), namespaces=[name], weight=weight, max_queued_jobs=None, max_in_flight=None,
        spec={},
    )  # fmt: skip


async def _enqueue(conn: asyncpg.Connection, tenant: str, name: str, count: int, priority: str = "normal") -> BatchId:
    request = factories.batch_request(name=name, count=count, tenant=tenant, priority=priority)
    return (await accepting.accept_batch(conn, request)).batch_id


async def test_position_matches_the_fair_share_claim_order_and_eta_follows_throughput(db: asyncpg.Connection) -> None:
    await factories.seed(db)
    await _tenant(db, "small", weight=1)
    await _tenant(db, "big", weight=2)
    await _enqueue(db, "small", "first", 10)
    second = await _enqueue(db, "small", "second", 5)
    await _enqueue(db, "big", "bulk", 100)

    where = await queue.position(db, pool=POOL, tenant=TenantName("small"), batch_id=second)
    # 10 jobs of "first" ahead inside the tenant; "big" (weight 2) is served 20 meanwhile.
    assert where.position == 30
    assert where.remaining_calls == 15 + 30
    assert where.calls_per_s == 0 and where.eta_s is None  # nothing measured yet: no guess

    # Not accepted yet: behind all of the tenant's eligible work.
    pending = await queue.position(db, pool=POOL, tenant=TenantName("small"), batch_id=None, documents=7)
    assert pending.position == 45 and pending.remaining_calls == 22 + 44

    # The claims agree: one job at a time, the second batch's first job comes after about `position` others.
    claimed_before = 0
    while True:
        [job] = await jobs.claim_batch(db, pool=POOL, worker_id=WorkerId("w"), limit=1, lease_ttl_s=60)
        if job.batch_id == second:
            break
        claimed_before += 1
        done = transitions.succeed(job.id, job.fence, result={}, validation={"passed": True},
                                   usage=transitions.Usage(tokens_in=1, tokens_out=1))  # fmt: skip
        await jobs.finish_many(db, [done], worker_id=WorkerId("w"))
    assert abs(claimed_before - 30) <= 2, claimed_before

    # 120 calls finished in the last 10 minutes: 0.2 per second.
    await db.execute(
        "INSERT INTO limiter_permits (pool, job_id, fence, acquired_at, tokens_reserved, expires_at, released_at) "
        "SELECT $1, g, 1, now() - interval '1 minute', 1, now(), now() FROM generate_series(1, 120) g",
        POOL,
    )
    running = await queue.position(db, pool=POOL, tenant=TenantName("small"), batch_id=second)
    assert running.position == 0  # its next job is next in line
    assert running.calls_per_s == 120 / queue.THROUGHPUT_WINDOW_S
    assert running.remaining_calls >= 5  # its four waiting jobs, the running one, and big's share meanwhile
    assert running.eta_s == -(-running.remaining_calls * queue.THROUGHPUT_WINDOW_S // 120)


async def test_priority_change_reaches_every_unfinished_job_in_bounded_rounds(db: asyncpg.Connection) -> None:
    await factories.seed(db)
    early = await _enqueue(db, factories.TENANT, "early", 5)
    late = await _enqueue(db, factories.TENANT, "late", 25, priority="low")
    [running] = await jobs.claim_batch(db, pool=POOL, worker_id=WorkerId("w"), limit=1, lease_ttl_s=60)
    assert running.batch_id == early
    assert await queue.priority(db, batch_id=late) == accepting.PRIORITIES["low"]

    changed = await queue.set_priority(db, batch_id=late, priority=accepting.PRIORITIES["high"], round_jobs=10)

    assert changed == 25
    assert await queue.priority(db, batch_id=late) == accepting.PRIORITIES["high"]
    assert await db.fetchval(
        "SELECT count(*) FROM extraction_jobs WHERE batch_id = $1 AND priority = 0", late
    ) == 25
    # The claim order follows at once: the high batch goes before the normal one accepted earlier.
    [next_job] = await jobs.claim_batch(db, pool=POOL, worker_id=WorkerId("w"), limit=1, lease_ttl_s=60)
    assert next_job.batch_id == late
    # Applied again (e.g. after a crash), nothing is left to change; the running job of the other batch
    # is re-ranked too when its batch changes.
    assert await queue.set_priority(db, batch_id=late, priority=0) == 0
    assert await queue.set_priority(db, batch_id=early, priority=2) == 5
    assert await db.fetchval("SELECT priority FROM extraction_jobs WHERE id = $1", running.id) == 2
