"""What a claim and a group commit cost the database does not grow with the jobs already done
(migration 0049, job_finish_many's `closed`), on the statistics a freshly loaded backlog leaves:
every job READY, no attempt row yet (the worker's own tables are analyzed only by autovacuum).

The claim plan's contenders' probe reads the claim index, never the table from its first page
(where the finished jobs lie); the commit closes its attempts by primary key, never by reading
every attempt row; one trigger reads each update's rows for the outbox, the deliveries and the
queue counters; and the claim's result-reuse resolution keeps one plan (migration 0050) even on a
worker's connection, which plans every statement for its arguments.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import asyncpg

from lading import accepting
from lading.db import jobs, queries
from lading.db import reuse as reuse_db
from lading.ids import JobId, PoolName, WorkerId
from lading.jobs import transitions
from tests.support import factories

POOL = PoolName(factories.POOL)
WORKER = WorkerId("w")
REUSE_KEY = ("m", "p", "j")
"""What a worker calling model `m` marks claimed jobs with and resolves them for (lading.reuse.Producer)."""
Plan = dict[str, Any]


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


def _succeed(job: jobs.ClaimedJob) -> transitions.Finish:
    return transitions.succeed(job.id, job.fence, result={"total": "1.00"}, validation={"passed": True})


async def _resolve(db: asyncpg.Connection, claimed: list[jobs.ClaimedJob]) -> dict[JobId, reuse_db.Decision]:
    return await reuse_db.resolve(
        db, [(j.id, j.fence) for j in claimed], worker_id=WORKER, model=REUSE_KEY[0], prompt_version=REUSE_KEY[1],
        judging=REUSE_KEY[2], wait_margin_s=60,
    )  # fmt: skip


async def _backlog_analyzed_fresh(db: asyncpg.Connection, *, count: int) -> None:
    """`count` READY jobs, analyzed as they are (no attempt row, no finished job)."""
    await factories.seed(db)
    await accepting.accept_batch(db, factories.batch_request(count=count))
    await db.execute("ANALYZE")


async def _claim_plans(db: asyncpg.Connection, *, resolve: bool = False) -> tuple[list[jobs.ClaimedJob], list[Plan]]:
    """One claim of 10 jobs (and with `resolve` their resolution, `reuse_db.resolve`) and the plans
    of every statement it ran, nested ones included."""
    plans: list[dict[str, Any]] = []

    def collect(_conn: object, message: asyncpg.PostgresLogMessage) -> None:
        if "plan:" in message.message:
            plans.append(json.loads(message.message.split("plan:", 1)[1]))

    db.add_log_listener(collect)
    try:
        await db.execute("LOAD 'auto_explain'")
        for setting, value in (
            ("auto_explain.log_min_duration", "0"), ("auto_explain.log_nested_statements", "on"),
            ("auto_explain.log_format", "json"), ("client_min_messages", "log"),
        ):  # fmt: skip
            await db.execute("SELECT set_config($1, $2, false)", setting, value)
        key = REUSE_KEY if resolve else None
        claimed = await jobs.claim_batch(db, pool=POOL, worker_id=WORKER, limit=10, lease_ttl_s=60, reuse_key_of=key)
        if resolve:
            await _resolve(db, claimed)
    finally:
        await db.execute("SELECT set_config('client_min_messages', 'notice', false)")
        await db.execute("SELECT set_config('auto_explain.log_min_duration', '-1', false)")
        db.remove_log_listener(collect)
    return claimed, plans


async def test_a_claim_never_reads_the_finished_jobs_on_a_fresh_backlogs_statistics(db: asyncpg.Connection) -> None:
    await _backlog_analyzed_fresh(db, count=1_500)
    for _ in range(14):
        claimed = await jobs.claim_batch(db, pool=POOL, worker_id=WORKER, limit=100, lease_ttl_s=60)
        assert len(await jobs.finish_many(db, [_succeed(j) for j in claimed], worker_id=WORKER)) == 100
    claimed, plans = await _claim_plans(db)
    assert len(claimed) == 10
    assert any("FROM tenant_queues q" in p["Query Text"] for p in plans), [p["Query Text"][:80] for p in plans]
    scans = [n for p in plans for n in _nodes(p["Plan"]) if n.get("Relation Name") == "extraction_jobs"]
    # Before migration 0049 the contenders' probe was a sequential scan that read the 1,400
    # finished jobs before the first waiting one, at every claim.
    assert [n for n in scans if n["Node Type"] == "Seq Scan"] == []
    probes = [n for n in scans if n.get("Index Name") == "extraction_jobs_fair_claimable"]
    assert len(probes) >= 2, scans  # the contenders' probe and the claim's own pick


async def test_the_commit_closes_its_attempts_by_key_whatever_the_attempt_rows(db: asyncpg.Connection) -> None:
    await _backlog_analyzed_fresh(db, count=4_000)
    claimed: list[jobs.ClaimedJob] = []
    for _ in range(40):
        claimed += await jobs.claim_batch(db, pool=POOL, worker_id=WORKER, limit=100, lease_ttl_s=60)
    group = claimed[-200:]
    # The statement exactly as finish_many sends it, planned for these arguments (as a worker's
    # connection plans it: dbpool.CUSTOM_PLANS), not run.
    n = len(group)
    args = [
        [j.id for j in group], [j.fence for j in group], ["SUCCEEDED"] * n, [None] * n, ["ok"] * n, [None] * n,
        [None] * n, [1] * n, [1] * n, [1] * n, ['{"total": "1.00"}'] * n, ['{"passed": true}'] * n, [None] * n,
        [False] * n, WORKER, [None] * n, [None] * n,
    ]  # fmt: skip
    await db.execute("SET plan_cache_mode = force_custom_plan")
    [plan] = json.loads(await db.fetchval("EXPLAIN (FORMAT JSON) " + queries.sql("job_finish_many"), *args))
    attempts = [n for n in _nodes(plan["Plan"]) if n.get("Relation Name") == "job_attempts"]
    # Before, on these statistics (no attempt row when analyzed), the commit hashed every open
    # attempt row of the table: a sequential scan of job_attempts (4,000 rows) per commit. (On a
    # table of a few dozen pages that scan is the cheaper plan, and is still chosen.)
    assert [n["Node Type"] for n in attempts if n["Node Type"] == "Seq Scan"] == []
    assert any(n["Node Type"] == "Tid Scan" for n in attempts), [n["Node Type"] for n in attempts]
    # And it closes exactly the group's attempts.
    assert await jobs.finish_many(db, [_succeed(j) for j in group], worker_id=WORKER) == {j.id for j in group}
    closed = await db.fetch("SELECT job_id FROM job_attempts WHERE finished_at IS NOT NULL ORDER BY job_id")
    assert [r["job_id"] for r in closed] == sorted(j.id for j in group)


async def test_one_trigger_reads_each_update_of_the_jobs(db: asyncpg.Connection) -> None:
    triggers = await db.fetch(
        "SELECT tgname FROM pg_trigger WHERE tgrelid = 'extraction_jobs'::regclass AND NOT tgisinternal"
        " AND tgtype & 16 <> 0"  # TRIGGER_TYPE_UPDATE
    )
    assert [r["tgname"] for r in triggers] == ["extraction_jobs_updated"]
    # A claim moves jobs between two counted states and settles none: no event, no counter row.
    await factories.seed(db)
    await accepting.accept_batch(db, factories.batch_request(count=3))
    events = await db.fetchval("SELECT count(*) FROM outbox_events")
    counters = await db.fetchval("SELECT count(*) FROM tenant_queued")
    claimed = await jobs.claim_batch(db, pool=POOL, worker_id=WORKER, limit=3, lease_ttl_s=60)
    assert await db.fetchval("SELECT count(*) FROM outbox_events") == events
    assert await db.fetchval("SELECT count(*) FROM tenant_queued") == counters
    # A commit of one success, one review and one retry: two events, and the two settled jobs
    # leave the tenant's queue (jobs and bytes).
    queued_before = await db.fetchrow("SELECT sum(jobs) AS jobs, sum(bytes) AS bytes FROM tenant_queued")
    first, second, third = sorted(claimed, key=lambda j: j.id)
    finishes = [
        _succeed(first),
        transitions.needs_review(second.id, second.fence, result={"total": "1.00"}, validation={"passed": False}),
        transitions.retry(third.id, third.fence, outcome="transient", error_class="TIMEOUT", error="t", retry_in_s=60),
    ]
    assert len(await jobs.finish_many(db, finishes, worker_id=WORKER)) == 3
    rows = await db.fetch(
        "SELECT aggregate_id, type, payload ->> 'state' AS state FROM outbox_events WHERE aggregate_type = 'job'"
        " AND type <> 'extraction.accepted.v1' ORDER BY aggregate_id"
    )  # fmt: skip
    assert [(r["aggregate_id"], r["type"], r["state"]) for r in rows] == [
        (first.id, "extraction.completed.v1", "SUCCEEDED"),
        (second.id, "extraction.review_required.v1", "REVIEW_REQUIRED"),
    ]
    settled_bytes = await db.fetchval(
        "SELECT sum(bytes) FROM job_documents WHERE job_id = ANY($1::bigint[])", [first.id, second.id]
    )
    queued_after = await db.fetchrow("SELECT sum(jobs) AS jobs, sum(bytes) AS bytes FROM tenant_queued")
    assert (queued_after["jobs"], queued_after["bytes"]) == (
        queued_before["jobs"] - 2, queued_before["bytes"] - settled_bytes,
    )  # fmt: skip


async def test_a_workers_resolution_keeps_one_plan_that_reads_by_index(db: asyncpg.Connection) -> None:
    # A worker's session plans each statement for its arguments (dbpool.CUSTOM_PLANS); the
    # resolution's own statement is planned once (migration 0050) and reads every table by index.
    await _backlog_analyzed_fresh(db, count=1_000)
    await db.execute("SET plan_cache_mode = force_custom_plan")
    for _ in range(6):  # past the five custom plans; every document distinct, so every job leads
        claimed = await jobs.claim_batch(
            db, pool=POOL, worker_id=WORKER, limit=100, lease_ttl_s=60, reuse_key_of=REUSE_KEY
        )
        assert {d.kind for d in (await _resolve(db, claimed)).values()} == {reuse_db.Kind.LEAD}
        assert len(await jobs.finish_many(db, [_succeed(j) for j in claimed], worker_id=WORKER)) == 100
    claimed, plans = await _claim_plans(db, resolve=True)
    [resolution] = [p for p in plans if "FROM unnest(p_jobs, p_fences)" in p["Query Text"]]
    nodes = list(_nodes(resolution["Plan"]))
    scans = [n for n in nodes if n["Node Type"] == "Seq Scan"]
    assert [n for n in scans if n["Relation Name"] in ("extraction_jobs", "results")] == []
    # A generic plan refers to the function's arguments as parameters; a custom one has their values.
    conditions = " ".join(str(n.get(k, "")) for n in nodes for k in ("Index Cond", "Filter", "Function Call"))
    assert "$1" in conditions or "$2" in conditions, conditions
