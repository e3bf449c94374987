"""
The worker's connections plan every execution of the claim (job_claim_batch) and the group commit
(job_finish_many) for its own arguments (`lading.db.pool.create_pool(custom_plans=True)`, as
`lading_worker.running.run_worker` opens them). By default PostgreSQL switches a prepared statement
to one generic plan after five executions and keeps it until an ANALYZE: made while job_attempts was
empty or nearly, such a plan read all of job_attempts once per claimed job, or once per committed
attempt, for the rest of the run.
"""

from __future__ import annotations

import asyncpg

from lading import accepting
from lading.db import jobs, pool, queries
from lading.ids import WorkerId
from lading.jobs import transitions
from tests.support import factories

WORKER = WorkerId("w")
GROUPS = 8
GROUP_SIZE = 30


async def _commit_groups(conn: asyncpg.Connection) -> dict[str, tuple[int, int]]:
    """Claim and commit GROUPS groups on one session; its (generic, custom) plan counts per statement."""
    for _ in range(GROUPS):
        claimed = await jobs.claim_batch(conn, pool=factories.POOL, worker_id=WORKER, limit=GROUP_SIZE, lease_ttl_s=60)
        assert len(claimed) == GROUP_SIZE
        finishes = [transitions.succeed(j.id, j.fence, result={}, validation={"passed": True}) for j in claimed]
        assert await jobs.finish_many(conn, finishes, worker_id=WORKER) == {j.id for j in claimed}
    counts = {}
    for name in ("job_claim_batch", "job_finish_many"):
        row = await conn.fetchrow(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE statement = $1", queries.sql(name)
        )
        assert row is not None
        counts[name] = (row["generic_plans"], row["custom_plans"])
    return counts


async def _plans_of_a_pool(database_url: str, *, custom_plans: bool) -> dict[str, tuple[int, int]]:
    db = await pool.create_pool(database_url, min_size=1, max_size=1, custom_plans=custom_plans)
    try:
        async with db.acquire() as conn:
            return await _commit_groups(conn)
    finally:
        await db.close()


async def test_the_group_commit_is_planned_for_each_call_on_a_worker_pool(
        db: asyncpg.Connection, database_url: str
) -> None:
    await factories.seed(db)
    await accepting.accept_batch(db, factories.batch_request(count=2 * GROUPS * GROUP_SIZE))
    await db.execute("ANALYZE")  # a loaded backlog; job_attempts analyzed while empty

    default = await _plans_of_a_pool(database_url, custom_plans=False)
    generic, _ = default["job_finish_many"]
    assert generic > 0, "PostgreSQL's default keeps a generic plan after five executions"

    worker = await _plans_of_a_pool(database_url, custom_plans=True)
    assert worker == {"job_claim_batch": (0, GROUPS), "job_finish_many": (0, GROUPS)}
