"""
The per-tenant queue counters (`tenant_queued`, migration 0025) equal the real count of jobs
READY, RUNNING or RETRY_SCHEDULED and their documents' bytes after a mixed workload: batch
acceptance (COPY), single documents (one by one and in groups), claims, commits, retries, the
reaper, cancellation, review, deletion and document changes, sequential and concurrent, across
tenants. Admission reads the counters (maxQueuedJobs, maxQueuedBytes).
"""

from __future__ import annotations

import asyncio
import pathlib
import random

import asyncpg
import pytest

from lading import applying, intake, reasons
from lading.db import jobs, registry
from lading.ids import PoolName, TenantName, WorkerId
from tests.integration.test_admission_rules import batch, seed

QUEUED = ("READY", "RUNNING", "RETRY_SCHEDULED")
STATES = ("READY", "RUNNING", "RETRY_SCHEDULED", "REVIEW_REQUIRED", "SUCCEEDED", "FAILED_TERMINAL", "CANCELLED")


async def real(db: asyncpg.Connection) -> dict[str, tuple[int, int]]:
    rows = await db.fetch(
        "SELECT j.tenant, count(*) AS jobs, coalesce(sum(d.bytes), 0) AS bytes FROM extraction_jobs j "
        "LEFT JOIN job_documents d ON d.job_id = j.id WHERE j.state = ANY($1) GROUP BY j.tenant", list(QUEUED)
    )
    return {r["tenant"]: (r["jobs"], r["bytes"]) for r in rows}


async def counted(db: asyncpg.Connection) -> dict[str, tuple[int, int]]:
    rows = await db.fetch("SELECT tenant, sum(jobs)::bigint AS jobs, sum(bytes)::bigint AS bytes FROM tenant_queued "
                          "GROUP BY tenant HAVING sum(jobs) <> 0 OR sum(bytes) <> 0")
    return {r["tenant"]: (r["jobs"], r["bytes"]) for r in rows}


async def move(conn: asyncpg.Connection, ids: list[int], state: str) -> None:
    """Jobs `ids` to `state` in one statement, with the columns each state requires."""
    await conn.execute(
        "UPDATE extraction_jobs SET state = $2, "
        "lease_until = CASE WHEN $2 = 'RUNNING' THEN now() + interval '1 minute' END, "
        "worker_id = CASE WHEN $2 = 'RUNNING' THEN 'w' END, "
        "finished_at = CASE WHEN $2 IN ('SUCCEEDED', 'FAILED_TERMINAL', 'CANCELLED') THEN now() END "
        "WHERE id = ANY($1)", ids, state,
    )  # fmt: skip


async def test_the_counters_equal_the_real_count_after_a_mixed_workload(
        db: asyncpg.Connection, dbpool: asyncpg.Pool) -> None:  # fmt: skip
    await seed(db)
    await registry.upsert_tenant(db, name=TenantName("globex"), namespaces=["globex"], weight=1, max_queued_jobs=None,
                                 max_in_flight=None, spec={})

    async def check() -> None:
        assert await counted(db) == await real(db)

    await applying.admit_batch(db, batch("march", texts=tuple(f"Invoice {i}" * (i + 1) for i in range(5))))
    await applying.admit_batch(db, batch("april", namespace="globex", texts=("a", "bb", "ccc")))
    await check()
    submitter = intake.GroupSubmitter(dbpool)
    docs = [intake.DocumentRequest.model_validate({"key": f"d{i}", "text": "x" * (i + 1), "inferencePoolRef": "cheap"})
            for i in range(20)]
    await asyncio.gather(*(submitter.submit(namespace="acme", request=d, idempotency_key=d.key,
                                            request_digest=intake.request_digest(d)) for d in docs))
    await check()
    claimed = await jobs.claim_batch(db, pool=PoolName("acme/cheap"), worker_id=WorkerId("w-1"), limit=6,
                                     lease_ttl_s=60)
    assert len(claimed) == 6
    await check()
    await move(db, [j.id for j in claimed[:2]], "SUCCEEDED")
    await move(db, [claimed[2].id], "REVIEW_REQUIRED")
    await move(db, [claimed[3].id], "RETRY_SCHEDULED")
    await check()
    april = await db.fetchval("SELECT id FROM batches WHERE name = 'april'")
    await jobs.cancel_batch(db, batch_id=april, reason="test")
    await check()
    assert await jobs.review_decide(db, job_id=claimed[2].id, approve=True, note="ok")
    await check()

    ids: list[int] = [r["id"] for r in await db.fetch("SELECT id FROM extraction_jobs")]
    rng = random.Random(15)

    async def worker(n: int) -> None:
        """Moves jobs of both tenants, in two statements per transaction; each session its own jobs
        (no deadlock between the workload's own row locks), every session the same tenants."""
        mine = ids[n::4]
        async with dbpool.acquire() as conn:
            await conn.execute("SELECT setseed($1)", n / 10)  # when the counters' rows are folded
            for _ in range(25):
                chosen = rng.sample(mine, k=min(len(mine), rng.randint(1, 6)))
                async with conn.transaction():
                    await move(conn, chosen[: len(chosen) // 2 + 1], rng.choice(STATES))
                    await move(conn, chosen[len(chosen) // 2 + 1:], rng.choice(STATES))

    # Concurrent sessions, and enough statements that the counters' rows get folded many times.
    await asyncio.gather(*(worker(n) for n in range(4)))
    assert await db.fetchval("SELECT count(*) FROM tenant_queued") < 100  # 200 statements' rows, folded
    await check()
    # Document bytes that change, documents and jobs deleted in any order, one statement for both.
    queued = await db.fetch("SELECT id FROM extraction_jobs WHERE state = ANY($1) ORDER BY id", list(QUEUED))
    assert len(queued) >= 4
    await db.execute("UPDATE job_documents SET bytes = bytes + 100 WHERE job_id = $1", queued[0]["id"])
    await check()
    await db.execute("DELETE FROM job_documents WHERE job_id = $1", queued[1]["id"])
    await check()
    await db.execute("DELETE FROM extraction_jobs WHERE id = $1", queued[2]["id"])
    await check()
    await db.execute("DELETE FROM extraction_jobs WHERE id = ANY($1)", [r["id"] for r in queued[3:]])
    await check()
    await db.execute("DELETE FROM job_documents")
    await db.execute("DELETE FROM extraction_jobs")
    await check()
    assert await counted(db) == {}


@pytest.mark.parametrize("quota", [{"maxQueuedJobs": 3}, {"maxQueuedBytes": 30}])
async def test_admission_reads_the_counters(db: asyncpg.Connection, quota: dict[str, int]) -> None:
    await seed(db, **quota)
    request = intake.DocumentRequest.model_validate({"key": "k", "text": "x" * 10, "inferencePoolRef": "cheap"})
    for i in range(3):
        await intake.submit_validated(db, namespace="acme", request=request, idempotency_key=f"k{i}",
                                      request_digest=f"d{i}")
    with pytest.raises(applying.AdmissionRejected) as refused:
        await intake.submit_validated(db, namespace="acme", request=request, idempotency_key="k3", request_digest="d3")
    assert refused.value.reason == reasons.QUOTA_EXCEEDED
    # The counters are what admission reads: a job that leaves the queue makes room at once.
    await move(db, [await db.fetchval("SELECT min(id) FROM extraction_jobs")], "CANCELLED")
    await intake.submit_validated(db, namespace="acme", request=request, idempotency_key="k3", request_digest="d3")


async def test_an_inline_batch_counts_itself_and_the_next_insert_is_counted_by_the_triggers(
        db: asyncpg.Connection) -> None:  # fmt: skip
    """Inline acceptance writes its own counter row (migration 0032) in UTF-8 bytes; the setting
    that skips the insert triggers ends with its transaction, so the same session's next
    insert is counted by them."""
    await seed(db)
    texts = ("Rechnung über 5 €", "ok", "日本語の請求書")
    await applying.admit_batch(db, batch("march", texts=texts))
    assert await counted(db) == await real(db) == {"acme": (3, sum(len(t.encode()) for t in texts))}
    assert await db.fetchval("SELECT current_setting('lading.queued_counted', true)") in ("", "off", None)
    request = intake.DocumentRequest.model_validate({"key": "k", "text": "ü" * 10, "inferencePoolRef": "cheap"})
    await intake.submit_validated(db, namespace="acme", request=request, idempotency_key="k", request_digest="d")
    assert await counted(db) == await real(db) == {"acme": (4, sum(len(t.encode()) for t in texts) + 20)}
    # A batch accepted again (the idempotent path) adds nothing.
    await applying.admit_batch(db, batch("march", texts=texts))
    assert await counted(db) == await real(db)
    # Inside a caller's larger transaction, what follows an inline acceptance is counted too.
    async with db.transaction():
        await applying.admit_batch(db, batch("april", texts=texts))
        await intake.submit_validated(db, namespace="acme", request=request, idempotency_key="k2",
                                      request_digest="d2")
    assert await counted(db) == await real(db) == {"acme": (8, 2 * sum(len(t.encode()) for t in texts) + 40)}
    # So is what follows a batch accepted again (the idempotent path writes nothing of its own).
    async with db.transaction():
        await applying.admit_batch(db, batch("april", texts=texts))
        await intake.submit_validated(db, namespace="acme", request=request, idempotency_key="k3",
                                      request_digest="d3")
    assert await counted(db) == await real(db) == {"acme": (9, 2 * sum(len(t.encode()) for t in texts) + 60)}


async def test_a_submitted_document_writes_one_counter_row_and_leaves_the_triggers_on(
        db: asyncpg.Connection, dbpool: asyncpg.Pool) -> None:  # fmt: skip
    """The intake's append statement counts its documents itself, jobs and bytes in one counter row
    (not one from each insert trigger), and sets the setting back: a later insert in the same
    transaction is counted by the triggers."""
    await seed(db)
    submitter = intake.GroupSubmitter(dbpool)
    rows_before = await db.fetchval("SELECT count(*) FROM tenant_queued")
    request = intake.DocumentRequest.model_validate({"key": "k", "text": "ü" * 10, "inferencePoolRef": "cheap"})
    await submitter.submit(namespace="acme", request=request, idempotency_key="k",
                           request_digest=intake.request_digest(request))
    assert await counted(db) == await real(db) == {"acme": (1, 20)}
    # One row, unless the one-in-32 fold ran and left one row anyway.
    assert await db.fetchval("SELECT count(*) FROM tenant_queued") - rows_before <= 1
    # A group of documents: one row for all of them.
    docs = [intake.DocumentRequest.model_validate({"key": f"g{i}", "text": "x" * (i + 1), "inferencePoolRef": "cheap"})
            for i in range(12)]
    await asyncio.gather(*(submitter.submit(namespace="acme", request=d, idempotency_key=d.key,
                                            request_digest=intake.request_digest(d)) for d in docs))
    assert await counted(db) == await real(db) == {"acme": (13, 20 + sum(range(1, 13)))}
    # In a caller's transaction, what follows a submission is counted by the triggers.
    async with db.transaction():
        await intake.submit_validated(db, namespace="acme", request=request, idempotency_key="k2",
                                      request_digest="d2")
        assert await db.fetchval("SELECT current_setting('lading.queued_counted', true)") == "off"
        batch_id = await db.fetchval("SELECT batch_id FROM extraction_jobs LIMIT 1")
        job_id = await db.fetchval(
            "INSERT INTO extraction_jobs (tenant, batch_id, ordinal, document_key, request_hash, content_sha256, "
            "pool, schema, validation_policy, priority, max_attempts, deadline_at) "
            "SELECT tenant, batch_id, 1000, 'by-hand', request_hash, content_sha256, pool, schema, "
            "validation_policy, priority, max_attempts, deadline_at FROM extraction_jobs LIMIT 1 RETURNING id")
        await db.execute("INSERT INTO job_documents (job_id, text, bytes) VALUES ($1, 'abc', 3)", job_id)
        assert batch_id is not None
    assert await counted(db) == await real(db) == {"acme": (15, 20 + sum(range(1, 13)) + 20 + 3)}


async def test_a_manifest_batch_writes_one_counter_row(db: asyncpg.Connection, tmp_path: pathlib.Path) -> None:
    """A manifest's jobs and documents are counted by the insert statement itself, in one row."""
    from lading.settings import DocumentSettings
    from tests.integration import test_manifest_batches as manifests
    from tests.support import factories

    await factories.seed(db)
    (tmp_path / "acme").mkdir()
    manifests.synthetic_manifest(tmp_path / "acme" / "m.jsonl", 40)
    rows_before = await db.fetchval("SELECT count(*) FROM tenant_queued")
    await applying.admit_batch(db, manifests.batch((tmp_path / "acme" / "m.jsonl").as_uri()),
                               documents=DocumentSettings(roots=(str(tmp_path),)))
    bytes_ = await db.fetchval("SELECT sum(bytes) FROM job_documents")
    assert bytes_ > 0
    assert await counted(db) == await real(db) == {"acme": (40, bytes_)}
    assert await db.fetchval("SELECT count(*) FROM tenant_queued") - rows_before <= 1
    assert await db.fetchval("SELECT current_setting('lading.queued_counted', true)") in ("", "off", None)


async def test_a_tenant_s_sums_walk_the_index_entries_of_live_rows_only(db: asyncpg.Connection) -> None:
    """Deltas folded away leave dead rows until a vacuum: the readers mark their index entries dead
    as they pass (an index scan, not a bitmap scan), so the next read skips them."""
    await db.execute("INSERT INTO tenant_queued (tenant, jobs, bytes) "
                     "SELECT 'acme', 1, 10 FROM generate_series(1, 2000)")
    await db.execute("DELETE FROM tenant_queued WHERE ctid IN (SELECT ctid FROM tenant_queued LIMIT 1990)")

    async def read() -> tuple[tuple[int, int], int]:
        # Entries the index returned to this backend, not flushed to the shared statistics inside
        # a transaction, so the difference is this read's.
        returned = "SELECT pg_stat_get_xact_tuples_returned('tenant_queued_tenant'::regclass)"
        async with db.transaction():
            before = await db.fetchval(returned)
            sums = await db.fetchrow("SELECT jobs, bytes FROM lading_tenant_queued_sums('acme')")
            return (sums["jobs"], sums["bytes"]), await db.fetchval(returned) - before

    assert (await read())[0] == (10, 100)
    sums, entries = await read()
    assert sums == (10, 100)
    assert 10 <= entries <= 20, f"the second read walked {entries} index entries for 10 live rows"
