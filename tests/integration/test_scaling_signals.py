"""
The scaler's signals read from real PostgreSQL rows (lading.db.registry.pool_signals), and what they cost.

Rows get their states the way production gives them: acceptance, claims and finishes through the
core, model calls through the real limiter. Only time is faked, by moving a row's timestamp back.
The cost test fills the tables like a long-running installation and checks the plans: no scan of
the job, attempt or permit history, whatever its size.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import asyncpg
import pytest
from lading_operator import headroom, rendering
from lading_operator import scaling as deciding

from lading import accepting, ids, limiting
from lading.db import jobs, queries, registry
from lading.models import specs
from tests.support import factories

POOL = ids.PoolName(factories.POOL)
OTHER = ids.PoolName("lading-system/other")
WORKER = ids.WorkerId("w1")
LIMITS = limiting.Limits(requests_per_minute=10_000, tokens_per_minute=10**9, max_concurrency=100)


async def test_an_unknown_pool_has_no_load(db: asyncpg.Connection) -> None:
    load = await registry.pool_signals(db, pool=ids.PoolName("nowhere/none"))
    assert (load.eligible_backlog, load.in_flight, load.oldest_eligible_age_s) == (0, 0, None)
    assert (load.paused, load.paused_until, load.cooldown_until) == (False, None, None)
    assert (load.recent_attempts, load.mean_latency_s, load.mean_tokens_per_attempt) == (0, None, None)


async def test_backlog_counts_what_a_claim_could_take_now(db: asyncpg.Connection) -> None:
    await factories.seed(db)
    await factories.seed(db, tenant="globex", pool=OTHER)
    batch = await accepting.accept_batch(db, factories.batch_request(name="b1", count=12))
    await accepting.accept_batch(db, factories.batch_request(name="g1", count=5, tenant="globex", pool=OTHER))
    suspended = await accepting.accept_batch(db, factories.batch_request(name="b2", count=4))
    await db.execute("UPDATE extraction_jobs SET suspended = true WHERE batch_id = $1", suspended.batch_id)
    claimed = await jobs.claim_batch(db, pool=POOL, worker_id=WORKER, limit=3, lease_ttl_s=600)
    assert len(claimed) == 3
    waiting = [j for j in batch.job_ids if j not in {c.id for c in claimed}]
    # Not eligible: retry not yet due, deadline passed, attempts spent.
    await db.execute("UPDATE extraction_jobs SET available_at = now() + interval '1 hour' WHERE id = $1", waiting[0])
    await db.execute("UPDATE extraction_jobs SET deadline_at = now() - interval '1 second' WHERE id = $1", waiting[1])
    await db.execute("UPDATE extraction_jobs SET attempt = max_attempts WHERE id = $1", waiting[2])
    # The oldest eligible job has waited 300 s.
    await db.execute("UPDATE extraction_jobs SET available_at = now() - interval '300 seconds' WHERE id = $1",
                     waiting[3])

    load = await registry.pool_signals(db, pool=POOL)
    assert load.eligible_backlog == 12 - 3 - 3
    assert load.in_flight == 3
    assert load.oldest_eligible_age_s is not None and 300 <= load.oldest_eligible_age_s < 310
    other = await registry.pool_signals(db, pool=OTHER)
    assert (other.eligible_backlog, other.in_flight) == (5, 0)


async def test_pause_and_429_cooldown_come_from_the_pool_row(db: asyncpg.Connection, dbpool: asyncpg.Pool) -> None:
    await factories.seed(db)
    await registry.pause_pool(db, name=POOL, seconds=90, reason="the endpoint refused the API key")
    limiter = limiting.PoolLimiter(dbpool, pool=POOL, limits=LIMITS)
    try:
        await limiter.cool_down(30)
    finally:
        await limiter.close()

    load = await registry.pool_signals(db, pool=POOL)
    assert load.paused is False
    assert load.paused_reason == "the endpoint refused the API key"
    assert load.paused_until is not None and load.cooldown_until is not None
    assert 85 < (load.paused_until - load.at).total_seconds() <= 90
    assert 25 < (load.cooldown_until - load.at).total_seconds() <= 30
    room = headroom.external_headroom(
        now=load.at, paused_until=load.paused_until, paused_reason=load.paused_reason,
        cooldown_until=load.cooldown_until,
    )
    assert room.exhausted and room.reason.startswith("pool paused for")
    without_pause = headroom.external_headroom(now=load.at, cooldown_until=load.cooldown_until)
    assert without_pause.exhausted and without_pause.reason.startswith("429 cooldown")


async def test_latency_and_tokens_of_recent_calls_come_from_the_limiter(
        db: asyncpg.Connection, dbpool: asyncpg.Pool
) -> None:
    await factories.seed(db)
    await factories.seed(db, tenant="globex", pool=OTHER)
    limiter = limiting.PoolLimiter(dbpool, pool=POOL, limits=LIMITS)
    other = limiting.PoolLimiter(dbpool, pool=OTHER, limits=LIMITS)
    try:
        await _calls(db, limiter, other)
    finally:
        await limiter.close()
        await other.close()

    load = await registry.pool_signals(db, pool=POOL, window_s=120)
    assert load.recent_attempts == 3
    assert load.mean_latency_s == pytest.approx(4.0, abs=0.05)
    assert load.mean_tokens_per_attempt == pytest.approx(2000.0)
    assert (await registry.pool_signals(db, pool=OTHER)).mean_tokens_per_attempt == pytest.approx(50_000.0)


async def _calls(db: asyncpg.Connection, limiter: limiting.PoolLimiter, other: limiting.PoolLimiter) -> None:
    permits = [await limiter.acquire(job_id=ids.JobId(i), fence=1, tokens=2000) for i in range(4)]
    await limiter.release(permits[0], tokens_used=1000)
    await limiter.release(permits[1], tokens_used=3000)
    await limiter.release(permits[2], tokens_used=None)    # no usage reported: the reservation counts
    # permits[3] is still in flight: no latency yet.
    await other.release(await other.acquire(job_id=ids.JobId(99), fence=1, tokens=50_000), tokens_used=50_000)
    # Calls took 2, 4 and 6 seconds.
    for permit, seconds in zip(permits[:3], (2, 4, 6), strict=True):
        await db.execute(
            "UPDATE limiter_permits SET acquired_at = released_at - make_interval(secs => $2) WHERE id = $1",
            permit.id, float(seconds),
        )
    # A call older than the window does not count.
    old = await limiter.acquire(job_id=ids.JobId(7), fence=1, tokens=10)
    await limiter.release(old, tokens_used=10)
    await db.execute("UPDATE limiter_permits SET acquired_at = now() - interval '200 seconds' WHERE id = $1", old.id)


async def test_signals_feed_the_decision(db: asyncpg.Connection) -> None:
    """From rows to replicas: the reading and the deciding agree on units and names."""
    await factories.seed(db)
    await accepting.accept_batch(db, factories.batch_request(name="b1", count=300))
    await db.execute("UPDATE extraction_jobs SET available_at = now() - interval '240 seconds' WHERE pool = $1", POOL)
    load = await registry.pool_signals(db, pool=POOL)
    spec = specs.InferencePoolSpec.model_validate({
        "provider": "builtin",
        "limits": {"requestsPerMinute": 60_000, "tokensPerMinute": 10**9, "maxConcurrency": 1000},
        "workers": {"maxReplicas": 10, "concurrency": 32},
    })
    decision, _ = deciding.decide(
        spec,
        deciding.Signals(
            now=load.at, current_replicas=1, eligible_backlog=load.eligible_backlog,
            oldest_eligible_age_s=load.oldest_eligible_age_s, in_flight=load.in_flight,
            mean_latency_s=load.mean_latency_s, mean_tokens_per_attempt=load.mean_tokens_per_attempt,
            cooldown_until=load.cooldown_until,
        ),
        deciding.ScaleState(),
    )
    # 300 jobs 240 s old against a 120 s target: urgency 2, 5 req/s, 50 calls at the assumed 10 s.
    assert decision.replicas == 2
    assert decision.reason.startswith("backlog 300, oldest 24")


async def test_keda_trigger_queries_run_and_agree_with_the_signals(db: asyncpg.Connection) -> None:
    """The SQL the ScaledObject gives KEDA's postgresql scaler, run as KEDA would: plain text, no parameters."""
    await factories.seed(db)
    await accepting.accept_batch(db, factories.batch_request(name="b1", count=40))
    await jobs.claim_batch(db, pool=POOL, worker_id=WORKER, limit=5, lease_ttl_s=600)
    await db.execute(
        "UPDATE extraction_jobs SET available_at = now() - interval '200 seconds' "
        "WHERE id = (SELECT min(id) FROM extraction_jobs WHERE state = 'READY')"
    )
    await db.execute(
        "UPDATE extraction_jobs SET suspended = true "
        "WHERE id IN (SELECT id FROM extraction_jobs WHERE state = 'READY' ORDER BY id DESC LIMIT 3)"
    )
    namespace, name = POOL.split("/")
    pool = specs.InferencePool.model_validate(
        {"metadata": {"name": name, "namespace": namespace}, "spec": {"provider": "builtin"}}
    )
    load = await registry.pool_signals(db, pool=POOL)
    backlog_sql, oldest_sql = rendering.keda_backlog_query(pool), rendering.keda_oldest_age_query(pool)
    assert await db.fetchval(backlog_sql) == load.in_flight + load.eligible_backlog == 5 + 32
    oldest = await db.fetchval(oldest_sql)
    assert load.oldest_eligible_age_s is not None and 200 <= oldest < 210
    assert abs(float(oldest) - load.oldest_eligible_age_s) < 5
    empty = specs.InferencePool.model_validate(
        {"metadata": {"name": "idle", "namespace": namespace}, "spec": {"provider": "builtin"}}
    )
    assert await db.fetchval(rendering.keda_backlog_query(empty)) == 0
    assert await db.fetchval(rendering.keda_oldest_age_query(empty)) == 0


async def test_window_must_be_positive(db: asyncpg.Connection) -> None:
    with pytest.raises(ValueError, match="window_s must be positive"):
        await registry.pool_signals(db, pool=POOL, window_s=0)


async def test_inside_a_caller_transaction_the_callers_snapshot_is_used(db: asyncpg.Connection) -> None:
    await factories.seed(db)
    async with db.transaction(isolation="repeatable_read", readonly=True):
        load = await registry.pool_signals(db, pool=POOL)
    assert load.eligible_backlog == 0


# --- cost

HISTORY_JOBS = 200_000
"""A long-running installation: finished jobs (and their attempts and permits) of another pool."""


def _plan_nodes(plan: Any) -> Iterator[dict[str, Any]]:
    if isinstance(plan, dict):
        if "Node Type" in plan:
            yield plan
        for value in plan.values():
            yield from _plan_nodes(value)
    elif isinstance(plan, list):
        for item in plan:
            yield from _plan_nodes(item)


async def _fill_history(db: asyncpg.Connection) -> None:
    await db.execute(
        """
        INSERT INTO extraction_jobs (tenant, batch_id, ordinal, document_key, request_hash, content_sha256,
                                     pool, schema, validation_policy, state, attempt, fence, max_attempts,
                                     deadline_at, finished_at, available_at)
        SELECT 'acme', 1 + g / 1000, g, 'doc-' || g, 'h', 's',
               CASE WHEN g % 10 = 0 THEN $1 ELSE $2 END, 'invoice.v1', 'invoice-strict-v1', 'SUCCEEDED', 1, 1, 5,
               now() + interval '1 day', now() - make_interval(secs => g % 3600), now() - interval '2 hours'
          FROM generate_series(1, $3) g
        """,
        POOL, OTHER, HISTORY_JOBS,
    )
    await db.execute(
        """
        INSERT INTO job_attempts (job_id, fence, attempt, worker_id, started_at, finished_at, outcome,
                                  tokens_in, tokens_out, latency_ms)
        SELECT id, 1, 1, 'w', now() - interval '1 hour', finished_at, 'ok', 1000, 200, 3000 FROM extraction_jobs
        """
    )
    await db.execute(
        """
        INSERT INTO limiter_permits (pool, job_id, fence, acquired_at, tokens_reserved, tokens_used, expires_at,
                                     released_at)
        SELECT CASE WHEN g % 10 = 0 THEN $1 ELSE $2 END, g, 1, now() - make_interval(secs => g % 110), 2000, 1200,
               now() + interval '1 minute', now() - make_interval(secs => g % 110) + interval '3 seconds'
          FROM generate_series(1, 20000) g
        """,
        POOL, OTHER,
    )
    # The pool's current work: a backlog and some running jobs.
    await db.execute(
        """
        INSERT INTO extraction_jobs (tenant, batch_id, ordinal, document_key, request_hash, content_sha256,
                                     pool, schema, validation_policy, state, max_attempts, deadline_at,
                                     lease_until, worker_id)
        SELECT 'acme', 999999, g, 'now-' || g, 'h', 's', $1, 'invoice.v1', 'invoice-strict-v1',
               CASE WHEN g <= 50 THEN 'RUNNING' ELSE 'READY' END, 5, now() + interval '1 day',
               CASE WHEN g <= 50 THEN now() + interval '1 minute' END, CASE WHEN g <= 50 THEN 'w' END
          FROM generate_series(1, 2000) g
        """,
        POOL,
    )
    await db.execute("ANALYZE extraction_jobs; ANALYZE job_attempts; ANALYZE limiter_permits; ANALYZE pools")


@pytest.mark.slow
async def test_signals_read_no_history(db: asyncpg.Connection) -> None:
    await factories.seed(db)
    await factories.seed(db, tenant="globex", pool=OTHER)
    await _fill_history(db)
    history_tables = {"extraction_jobs", "job_attempts", "limiter_permits"}
    for name, args in (("pool_scaling_load", (POOL,)), ("pool_scaling_attempt_stats", (POOL, 120.0))):
        raw = await db.fetchval(f"EXPLAIN (FORMAT JSON) {queries.sql(name)}", *args)
        nodes = list(_plan_nodes(json.loads(raw)))
        scanned = {n.get("Relation Name"): n["Node Type"] for n in nodes if "Relation Name" in n}
        seq = {rel for rel, node in scanned.items() if node == "Seq Scan" and rel in history_tables}
        assert not seq, f"{name} scans {seq}: {scanned}"

    load = await registry.pool_signals(db, pool=POOL)
    assert (load.eligible_backlog, load.in_flight) == (1950, 50)
    assert load.recent_attempts == 2000
    assert load.mean_latency_s == pytest.approx(3.0)
    assert load.mean_tokens_per_attempt == pytest.approx(1200.0)

    started = time.perf_counter()
    rounds = 20
    for _ in range(rounds):
        await registry.pool_signals(db, pool=POOL)
    per_call_ms = (time.perf_counter() - started) / rounds * 1000
    print(f"pool_signals: {per_call_ms:.1f} ms per call with {HISTORY_JOBS} finished jobs in the tables")
    assert per_call_ms < 100
