"""The claim is planned once per connection (migration 0043): after the first five claims PostgreSQL
runs one generic plan for it instead of planning every claim anew, and a claim that follows a
released attempt still reads that attempt's error class."""

from __future__ import annotations

import asyncpg

from lading import accepting
from lading.db import jobs
from lading.ids import PoolName, WorkerId
from tests.support import factories

POOL = PoolName(factories.POOL)


async def _claim_plans(db: asyncpg.Connection) -> asyncpg.Record:
    row = await db.fetchrow(
        "SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE statement LIKE $1",
        "%READY | RETRY_SCHEDULED -> RUNNING%",
    )
    assert row is not None
    return row


async def test_the_claim_runs_one_generic_plan_after_five_custom_ones(db: asyncpg.Connection) -> None:
    await factories.seed(db)
    await accepting.accept_batch(db, factories.batch_request(count=200))
    for _ in range(12):
        assert len(await jobs.claim_batch(db, pool=POOL, worker_id=WorkerId("w"), limit=10, lease_ttl_s=60)) == 10
    plans = await _claim_plans(db)
    assert (plans["custom_plans"], plans["generic_plans"]) == (5, 7)


async def test_a_claim_after_an_earlier_attempt_reads_how_it_ended(db: asyncpg.Connection) -> None:
    await factories.seed(db)
    await accepting.accept_batch(db, factories.batch_request(count=1))
    for _ in range(6):  # past the custom plans: the next claims run the generic plan
        [job] = await jobs.claim_batch(db, pool=POOL, worker_id=WorkerId("w"), limit=1, lease_ttl_s=60)
        assert job.previous_error_class == (None if job.fence == 1 else "GONE")
        await db.execute("UPDATE job_attempts SET finished_at = clock_timestamp(), outcome = 'transient',"
                         " error_class = 'GONE' WHERE job_id = $1 AND fence = $2", job.id, job.fence)
        await jobs.release_many(db, [(job.id, job.fence)], worker_id=WorkerId("w"))
    assert (await _claim_plans(db))["generic_plans"] >= 1
