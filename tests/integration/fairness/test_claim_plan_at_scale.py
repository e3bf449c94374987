"""The claim's cost does not grow with the backlog: on 1,000,000 waiting jobs every statement
of a claim (the plan function's own statements included) follows an index, never a
sequential scan of extraction_jobs.

auto_explain logs the plan of each statement the claim runs, nested ones too, to this
session; the test reads them from the connection's log messages.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import asyncpg
import pytest

from lading.db import jobs, registry
from lading.ids import PoolName, TenantName, WorkerId
from tests.support import factories

POOL = PoolName(factories.POOL)
BACKLOG = 1_000_000
TENANTS = 5
SUSPENDED_EVERY = 5
"""One job in this many belongs to a suspended batch."""


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


async def _fill(conn: asyncpg.Connection) -> None:
    await factories.seed(conn)
    for n in range(TENANTS):
        await registry.upsert_tenant(
            conn, name=TenantName(f"t{n}"), namespaces=[f"t{n}"], weight=1 + n % 2, max_queued_jobs=None,
            max_in_flight=1000, spec={"dailyTokenBudget": 10**9},
        )
    # Tenant t0 has most of the backlog; jobs are due oldest-id first; one in five is suspended.
    await conn.execute(
        """
        INSERT INTO extraction_jobs (id, tenant, batch_id, ordinal, document_key, request_hash, content_sha256,
                                     pool, schema, validation_policy, priority, max_attempts, deadline_at,
                                     available_at, suspended)
        SELECT g, CASE WHEN g % 10 < 6 THEN 't0' ELSE 't' || (g % 10 - 5) END, g / 10000, g, 'doc-' || g, 'h', 's',
               $1, 'invoice.v1', 'invoice-strict-v1', (g % 3)::smallint, 5,
               clock_timestamp() + interval '1 day', clock_timestamp() - make_interval(secs => ($2 - g) / 1000.0),
               g % $3 = 0
          FROM generate_series(1, $2) AS g
        """,
        POOL, BACKLOG, SUSPENDED_EVERY,
    )
    await conn.execute(
        "INSERT INTO job_documents (job_id, text, bytes) SELECT g, 'text', 4 FROM generate_series(1, 20000) g"
    )
    # What acceptance does for each batch: register the tenant's queue in the pool.
    await conn.execute(
        "INSERT INTO tenant_queues (pool, tenant) SELECT DISTINCT pool, tenant FROM extraction_jobs"
    )
    await conn.execute("ANALYZE extraction_jobs")
    await conn.execute("ANALYZE job_documents")


@pytest.mark.slow
async def test_every_claim_statement_uses_an_index_on_a_million_job_backlog(db: asyncpg.Connection) -> None:
    await _fill(db)
    plans: list[dict[str, Any]] = []

    def collect(_conn: object, message: asyncpg.PostgresLogMessage) -> None:
        text = message.message
        if "plan:" in text:
            body = json.loads(text.split("plan:", 1)[1])
            plans.append(body)

    db.add_log_listener(collect)
    try:
        await db.execute("LOAD 'auto_explain'")
        for setting, value in (
            ("auto_explain.log_min_duration", "0"), ("auto_explain.log_nested_statements", "on"),
            ("auto_explain.log_format", "json"), ("client_min_messages", "log"),
        ):
            await db.execute("SELECT set_config($1, $2, false)", setting, value)
        claimed = []
        # Enough claims for cached statements to switch to generic plans too.
        for _ in range(8):
            claimed += await jobs.claim_batch(db, pool=POOL, worker_id=WorkerId("w"), limit=50, lease_ttl_s=60)
    finally:
        await db.execute("SELECT set_config('client_min_messages', 'notice', false)")
        db.remove_log_listener(collect)
    assert len(claimed) == 400
    assert {j.tenant for j in claimed} == {f"t{n}" for n in range(TENANTS)}
    assert await db.fetchval("SELECT count(*) FROM extraction_jobs WHERE state = 'RUNNING' AND suspended") == 0

    scans = [
        node for p in plans for node in _nodes(p["Plan"]) if node.get("Relation Name") == "extraction_jobs"
    ]
    queries = [p["Query Text"] for p in plans]
    assert any("lading_claim_plan" in q for q in queries) and any("FOR NO KEY UPDATE" in q for q in queries)
    assert scans, "no plan read extraction_jobs"
    assert [n for n in scans if n["Node Type"] == "Seq Scan"] == []
    assert {n["Node Type"] for n in scans} <= {"Index Scan", "Index Only Scan", "ModifyTable"}, scans
    indexes = {n["Index Name"] for n in scans if n["Node Type"] != "ModifyTable"}
    # The contender probe and the claim follow the per-tenant index; the cap check counts RUNNING jobs.
    assert "extraction_jobs_fair_claimable" in indexes
    assert "extraction_jobs_running_by_tenant" in indexes
    # The scans of the claim index stop at the last rank a due job can have: jobs whose retries
    # are due much later are never read. (lading_claim_rank is inlined since migration 0032: the
    # condition bounds its body, the due time plus make_interval(300 s per class), at now + 600 s.)
    fair = [n for n in scans if n.get("Index Name") == "extraction_jobs_fair_claimable"]
    assert all(
        "make_interval" in n["Index Cond"] and "'00:10:00'::interval" in n["Index Cond"] for n in fair
    ), [n["Index Cond"] for n in fair]
    assert indexes <= {
        "extraction_jobs_fair_claimable", "extraction_jobs_running_by_tenant", "extraction_jobs_pkey",
    }, indexes
