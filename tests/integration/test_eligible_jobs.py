"""
"Eligible job" is written once (`job_eligible`, lading/db/sql/jobs.sql), and every reader agrees:
the claim, the gauge, the scaler, KEDA's triggers, `lading status` and the operator's batch view.

Each kind of ineligible job is made the way production leaves it (suspended, deferred, past its
deadline, out of attempts), plus one eligible job that has waited 300 s; then each reader is asked.
"""

from __future__ import annotations

import asyncpg
from lading_operator import rendering

from lading import accepting, ids, metrics
from lading.db import batches, fairness, jobs, registry
from lading.models import specs
from lading_elected import gauges
from tests.support import factories

POOL = ids.PoolName(factories.POOL)

async def test_every_reader_counts_the_same_eligible_jobs(db: asyncpg.Connection) -> None:
    await factories.seed(db)
    batch = await accepting.accept_batch(db, factories.batch_request(name="b1", count=6))
    first, deferred, expired, spent, suspended, oldest = batch.job_ids
    await db.execute("UPDATE extraction_jobs SET available_at = now() + interval '1 hour' WHERE id = $1", deferred)
    await db.execute("UPDATE extraction_jobs SET deadline_at = now() - interval '1 second' WHERE id = $1", expired)
    await db.execute("UPDATE extraction_jobs SET attempt = max_attempts WHERE id = $1", spent)
    await db.execute("UPDATE extraction_jobs SET suspended = true WHERE id = $1", suspended)
    await db.execute("UPDATE extraction_jobs SET available_at = now() - interval '300 seconds' WHERE id = $1", oldest)
    eligible = 2  # `first` and `oldest`

    load = await registry.pool_signals(db, pool=POOL)
    assert load.eligible_backlog == eligible
    assert load.oldest_eligible_age_s is not None and 300 <= load.oldest_eligible_age_s < 330

    namespace, name = POOL.split("/")
    pool = specs.InferencePool.model_validate(
        {"metadata": {"name": name, "namespace": namespace}, "spec": {"provider": "builtin"}}
    )
    assert await db.fetchval(rendering.keda_backlog_query(pool)) == eligible
    assert 300 <= await db.fetchval(rendering.keda_oldest_age_query(pool)) < 330

    [status] = await registry.pool_status(db)
    assert status.backlog == eligible
    assert status.oldest_age_s is not None and 300 <= status.oldest_age_s < 330

    [share] = await fairness.shares_of_pool(db, pool=POOL)
    assert share.due == eligible

    seen = await batches.get_observed(db, tenant=factories.TENANT, idempotency_key=f"{factories.TENANT}/b1/uid-b1")
    assert seen is not None and seen.oldest_eligible_s is not None and 300 <= seen.oldest_eligible_s < 330

    async with db.transaction(isolation="repeatable_read", readonly=True):
        ages = await jobs.oldest_eligible_age_by_pool(db)
    assert set(ages) == {POOL} and 300 <= ages[POOL] < 330

    await gauges.refresh(db)
    assert 300 <= metrics.OLDEST_ELIGIBLE_AGE.labels(POOL)._value.get() < 330

    claimed = await jobs.claim_batch(db, pool=POOL, worker_id=ids.WorkerId("w1"), limit=10, lease_ttl_s=600)
    assert sorted(c.id for c in claimed) == sorted([first, oldest])

async def test_with_nothing_eligible_the_gauge_shows_no_pool(db: asyncpg.Connection) -> None:
    await factories.seed(db)
    batch = await accepting.accept_batch(db, factories.batch_request(name="b1", count=2))
    await db.execute("UPDATE extraction_jobs SET suspended = true WHERE batch_id = $1", batch.batch_id)
    assert await jobs.oldest_eligible_age_by_pool(db) == {}
    assert (await registry.pool_signals(db, pool=POOL)).eligible_backlog == 0
