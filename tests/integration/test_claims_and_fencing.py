"""Claims are exclusive; a superseded or expired owner can never commit."""

from __future__ import annotations

import asyncio
import collections

import asyncpg
from lading_worker import reaping

from lading import accepting
from lading.db import jobs, pool
from lading.ids import PoolName, WorkerId
from lading.jobs import transitions
from lading.settings import AttemptSettings, ReaperSettings
from tests.support import factories, waiting

POOL = PoolName(factories.POOL)


async def test_concurrent_claimers_never_own_the_same_job(db: asyncpg.Connection, database_url: str) -> None:
    await factories.seed(db)
    await accepting.accept_batch(db, factories.batch_request(count=1000))
    claims: collections.Counter[int] = collections.Counter()

    async def claimer(n: int) -> None:
        conn = await pool.connect(database_url)
        try:
            while True:
                got = await jobs.claim_batch(conn, pool=POOL, worker_id=WorkerId(f"w{n}"), limit=7, lease_ttl_s=60)
                if not got:
                    return
                claims.update(j.id for j in got)
        finally:
            await conn.close()

    await asyncio.gather(*(claimer(n) for n in range(12)))
    assert len(claims) == 1000
    assert set(claims.values()) == {1}
    row = await db.fetchrow(
        "SELECT count(*) FILTER (WHERE state = 'RUNNING') AS running, max(fence) AS fence, max(attempt) AS attempt,"
        " (SELECT count(*) FROM job_attempts) AS attempts FROM extraction_jobs"
    )
    assert row is not None
    assert (row["running"], row["fence"], row["attempt"], row["attempts"]) == (1000, 1, 1, 1000)


async def _expire_leases(db: asyncpg.Connection) -> None:
    """Fast-forward: the database clock decides leases, so move the lease, not the clock."""
    await db.execute(
        "UPDATE extraction_jobs SET lease_until = clock_timestamp() - interval '1 second' WHERE state = 'RUNNING'"
    )


async def test_an_owner_whose_lease_expired_cannot_commit_and_the_new_owner_result_stands(
        db: asyncpg.Connection, dbpool: asyncpg.Pool
) -> None:
    await factories.seed(db)
    await accepting.accept_batch(db, factories.batch_request(count=1))
    [first] = await jobs.claim_batch(db, pool=POOL, worker_id=WorkerId("zombie"), limit=1, lease_ttl_s=60)
    await _expire_leases(db)
    # The zombie's heartbeat is refused once the lease ran out.
    refused = await jobs.heartbeat_many(db, [(first.id, first.fence)], worker_id=WorkerId("zombie"), lease_ttl_s=60)
    assert refused == set()
    reaper = reaping.Reaper(dbpool, settings=ReaperSettings(), attempt=AttemptSettings(backoff_base_s=0.001))
    assert (await reaper.run_once()).rescued == 1
    await waiting.until(
        lambda: _claimable(db), timeout_s=5
    )
    [second] = await jobs.claim_batch(db, pool=POOL, worker_id=WorkerId("live"), limit=1, lease_ttl_s=60)
    assert second.id == first.id and second.fence > first.fence and second.attempt == 2

    new = transitions.succeed(second.id, second.fence, result={"by": "live"}, validation={"passed": True})
    assert await jobs.finish_many(db, [new], worker_id=WorkerId("live")) == {second.id}
    late = transitions.succeed(first.id, first.fence, result={"by": "zombie"}, validation={"passed": True})
    assert await jobs.finish_many(db, [late], worker_id=WorkerId("zombie")) == set()

    assert await db.fetchval("SELECT result->>'by' FROM results WHERE job_id = $1", first.id) == "live"
    assert await db.fetchval("SELECT count(*) FROM stale_completions") == 1
    outcomes = await db.fetch("SELECT fence, outcome FROM job_attempts WHERE job_id = $1 ORDER BY fence", first.id)
    assert [(r["fence"], r["outcome"]) for r in outcomes] == [(first.fence, "lease-expired"), (second.fence, "ok")]
    assert await db.fetchval(
        "SELECT count(*) FROM outbox_events WHERE type = 'extraction.completed.v1' AND aggregate_id = $1", first.id
    ) == 1


async def _claimable(db: asyncpg.Connection) -> bool:
    return bool(
        await db.fetchval(
            "SELECT count(*) FROM extraction_jobs WHERE state = 'RETRY_SCHEDULED' AND available_at <= clock_timestamp()"
        )
    )


async def test_a_superseded_fence_cannot_commit_even_with_a_fresh_lease(db: asyncpg.Connection) -> None:
    await factories.seed(db)
    await accepting.accept_batch(db, factories.batch_request(count=1))
    [job] = await jobs.claim_batch(db, pool=POOL, worker_id=WorkerId("w"), limit=1, lease_ttl_s=60)
    wrong_fence = transitions.succeed(job.id, job.fence - 1, result={}, validation={})  # type: ignore[arg-type]
    assert await jobs.finish_many(db, [wrong_fence], worker_id=WorkerId("w")) == set()
    assert await db.fetchval("SELECT state FROM extraction_jobs WHERE id = $1", job.id) == "RUNNING"


async def test_finish_many_applies_the_live_and_discards_the_stale_in_one_statement(db: asyncpg.Connection) -> None:
    await factories.seed(db)
    await accepting.accept_batch(db, factories.batch_request(count=4))
    claimed = await jobs.claim_batch(db, pool=POOL, worker_id=WorkerId("w"), limit=4, lease_ttl_s=60)
    await db.execute("UPDATE extraction_jobs SET lease_until = clock_timestamp() - interval '1 s' WHERE id = $1",
                     claimed[0].id)
    finishes = [transitions.succeed(j.id, j.fence, result={"n": j.id}, validation={"passed": True}) for j in claimed]
    applied = await jobs.finish_many(db, finishes, worker_id=WorkerId("w"))
    assert applied == {j.id for j in claimed[1:]}
    assert await db.fetchval("SELECT count(*) FROM results") == 3
    assert await db.fetchval("SELECT count(*) FROM outbox_events WHERE type = 'extraction.completed.v1'") == 3


async def test_heartbeat_extends_only_leases_still_owned(db: asyncpg.Connection) -> None:
    await factories.seed(db)
    await accepting.accept_batch(db, factories.batch_request(count=2))
    a, b = await jobs.claim_batch(db, pool=POOL, worker_id=WorkerId("w"), limit=2, lease_ttl_s=5)
    await jobs.cancel(db, job_id=b.id, reason="batch deleted")
    before = await db.fetchval("SELECT lease_until FROM extraction_jobs WHERE id = $1", a.id)
    leases = [(a.id, a.fence), (b.id, b.fence)]
    assert await jobs.heartbeat_many(db, leases, worker_id=WorkerId("w"), lease_ttl_s=600) == {a.id}
    after = await db.fetchval("SELECT lease_until FROM extraction_jobs WHERE id = $1", a.id)
    assert after > before
