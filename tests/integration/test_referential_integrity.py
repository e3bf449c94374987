"""
The per-job tables carry no foreign keys (they cost a lookup per row on the hot paths); the
references hold by construction. This checks that, after every kind of write the system makes.
"""

from __future__ import annotations

import asyncpg
from lading_worker import reaping

from lading import accepting
from lading.db import jobs
from lading.ids import PoolName, WorkerId
from lading.jobs import transitions
from lading.settings import AttemptSettings, ReaperSettings
from tests.support import factories

ORPHANS = {
    "jobs without a batch": "SELECT count(*) FROM extraction_jobs j WHERE NOT EXISTS "
    "(SELECT 1 FROM batches b WHERE b.id = j.batch_id)",
    "documents without a job": "SELECT count(*) FROM job_documents d WHERE NOT EXISTS "
    "(SELECT 1 FROM extraction_jobs j WHERE j.id = d.job_id)",
    "jobs without a document": "SELECT count(*) FROM extraction_jobs j WHERE NOT EXISTS "
    "(SELECT 1 FROM job_documents d WHERE d.job_id = j.id)",
    "attempts without a job": "SELECT count(*) FROM job_attempts a WHERE NOT EXISTS "
    "(SELECT 1 FROM extraction_jobs j WHERE j.id = a.job_id)",
    "results without a job": "SELECT count(*) FROM results r WHERE NOT EXISTS "
    "(SELECT 1 FROM extraction_jobs j WHERE j.id = r.job_id)",
    "claims without an attempt row": "SELECT count(*) FROM extraction_jobs j WHERE j.attempt > 0 AND NOT EXISTS "
    "(SELECT 1 FROM job_attempts a WHERE a.job_id = j.id AND a.fence = (SELECT max(fence) FROM job_attempts "
    "WHERE job_id = j.id))",
}


async def test_every_write_path_leaves_no_orphan_rows(db: asyncpg.Connection, dbpool: asyncpg.Pool) -> None:
    await factories.seed(db)
    await accepting.accept_batch(db, factories.batch_request(name="a", count=20))
    second = await accepting.accept_batch(db, factories.batch_request(name="b", count=5))
    pool, worker = PoolName(factories.POOL), WorkerId("w")
    claimed = await jobs.claim_batch(db, pool=pool, worker_id=worker, limit=12, lease_ttl_s=60)
    finishes = [
        transitions.succeed(j.id, j.fence, result={"n": 1}, validation={"passed": True}) for j in claimed[:4]
    ] + [
        transitions.retry(j.id, j.fence, outcome="transient", error_class="X", error="y", retry_in_s=0)
        for j in claimed[4:8]
    ]
    await jobs.finish_many(db, finishes, worker_id=worker)
    await db.execute(
        "UPDATE extraction_jobs SET lease_until = clock_timestamp() - interval '1 s' WHERE state = 'RUNNING'"
    )
    await reaping.Reaper(dbpool, settings=ReaperSettings(), attempt=AttemptSettings()).run_once()
    await jobs.cancel_batch(db, batch_id=second.batch_id, reason="deleted")
    await jobs.claim_batch(db, pool=pool, worker_id=worker, limit=50, lease_ttl_s=60)
    for what, query in ORPHANS.items():
        assert await db.fetchval(query) == 0, what
