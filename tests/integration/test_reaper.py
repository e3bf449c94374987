"""The reaper: expired leases are retried within the attempt budget, deadlines end jobs."""

from __future__ import annotations

import asyncpg
from lading_worker import reaping

from lading import accepting
from lading.db import jobs
from lading.ids import PoolName, WorkerId
from lading.settings import AttemptSettings, ReaperSettings
from tests.support import factories

POOL = PoolName(factories.POOL)
FAST = AttemptSettings(backoff_base_s=0.001, backoff_cap_s=0.001, timeout_s=1.0, max_attempts=2)


async def _claim_and_abandon(db: asyncpg.Connection) -> jobs.ClaimedJob:
    [job] = await jobs.claim_batch(db, pool=POOL, worker_id=WorkerId("dead"), limit=1, lease_ttl_s=60)
    await db.execute(
        "UPDATE extraction_jobs SET lease_until = clock_timestamp() - interval '1 s' WHERE id = $1", job.id
    )
    await db.execute("UPDATE extraction_jobs SET available_at = clock_timestamp() WHERE state = 'RETRY_SCHEDULED'")
    return job


async def test_expired_leases_are_retried_until_the_attempt_budget_is_spent(
        db: asyncpg.Connection, dbpool: asyncpg.Pool
) -> None:
    await factories.seed(db)
    await accepting.accept_batch(db, factories.batch_request(count=1, max_attempts=2))
    reaper = reaping.Reaper(dbpool, settings=ReaperSettings(), attempt=FAST)

    first = await _claim_and_abandon(db)
    assert await reaper.run_once() == reaping.ReapResult(rescued=1)
    row = await jobs.get(db, job_id=first.id)
    assert row is not None
    assert (row["state"], row["fence"], row["attempt"]) == ("RETRY_SCHEDULED", first.fence + 1, 1)

    await db.execute("UPDATE extraction_jobs SET available_at = clock_timestamp() WHERE id = $1", first.id)
    second = await _claim_and_abandon(db)
    assert second.attempt == 2
    assert await reaper.run_once() == reaping.ReapResult(failed=1)
    row = await jobs.get(db, job_id=first.id)
    assert row is not None
    assert (row["state"], row["attempt"], row["last_error_class"]) == ("FAILED_TERMINAL", 2, "ATTEMPTS_EXHAUSTED")
    assert await db.fetchval("SELECT count(*) FROM outbox_events WHERE type = 'extraction.failed.v1'") == 1
    outcomes = await db.fetch("SELECT outcome FROM job_attempts WHERE job_id = $1 ORDER BY fence", first.id)
    assert [r["outcome"] for r in outcomes] == ["lease-expired", "lease-expired"]


async def test_a_lease_expiring_after_the_deadline_fails_the_job(db: asyncpg.Connection, dbpool: asyncpg.Pool) -> None:
    await factories.seed(db)
    await accepting.accept_batch(db, factories.batch_request(count=1, max_attempts=5))
    job = await _claim_and_abandon(db)
    await db.execute("UPDATE extraction_jobs SET deadline_at = clock_timestamp() + interval '0.5 s' WHERE id = $1",
                     job.id)
    reaper = reaping.Reaper(dbpool, settings=ReaperSettings(), attempt=FAST)
    assert await reaper.run_once() == reaping.ReapResult(failed=1)
    assert await db.fetchval("SELECT last_error_class FROM extraction_jobs WHERE id = $1", job.id) == (
        "DEADLINE_EXHAUSTED"
    )


async def test_waiting_jobs_past_their_deadline_fail_without_running(
        db: asyncpg.Connection, dbpool: asyncpg.Pool
) -> None:
    await factories.seed(db)
    await accepting.accept_batch(db, factories.batch_request(count=3))
    await db.execute("UPDATE extraction_jobs SET deadline_at = clock_timestamp() WHERE id IN (1, 2)")
    reaper = reaping.Reaper(dbpool, settings=ReaperSettings(), attempt=FAST)
    assert await reaper.run_once() == reaping.ReapResult(expired=2)
    rows = await db.fetch("SELECT id, state, attempt, last_error_class FROM extraction_jobs ORDER BY id")
    assert [(r["state"], r["attempt"], r["last_error_class"]) for r in rows] == [
        ("FAILED_TERMINAL", 0, "DEADLINE_EXCEEDED"),
        ("FAILED_TERMINAL", 0, "DEADLINE_EXCEEDED"),
        ("READY", 0, None),
    ]
    assert await jobs.claim_batch(db, pool=POOL, worker_id=WorkerId("w"), limit=10, lease_ttl_s=5) != []


async def test_a_live_lease_is_never_reaped(db: asyncpg.Connection, dbpool: asyncpg.Pool) -> None:
    await factories.seed(db)
    await accepting.accept_batch(db, factories.batch_request(count=1))
    await jobs.claim_batch(db, pool=POOL, worker_id=WorkerId("w"), limit=1, lease_ttl_s=60)
    reaper = reaping.Reaper(dbpool, settings=ReaperSettings(), attempt=FAST)
    assert await reaper.run_once() == reaping.ReapResult()
    assert await db.fetchval("SELECT state FROM extraction_jobs") == "RUNNING"
