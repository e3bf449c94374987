"""
Single documents (`lading.intake.submit_document`): one job per (namespace, idempotency key)
decided by the database under real concurrent connections, replays and mismatches, rolling
batches, and every admission rule through `lading.applying` with nothing half-applied.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
from typing import Any

import asyncpg
import pytest
from lading_worker import cleaning

from lading import applying, errors, intake, reasons
from lading.db import registry
from lading.settings import RollingBatchSettings
from tests.integration.test_admission_rules import seed


def document(key: str = "inv-1", **fields: Any) -> intake.SubmittedDocument:
    values: dict[str, Any] = {
        "key": key, "text": f"Invoice {key}", "uri": None, "sha256": None, "bytes": None,
        "inference_pool_ref": "cheap", "delivery_endpoint_ref": None, "priority": None, "deadline_seconds": None,
    }  # fmt: skip
    values.update(fields)
    return intake.SubmittedDocument(**values)


async def submit(
        dbpool: asyncpg.Pool,
        doc: intake.SubmittedDocument,
        *,
        key: str | None = None,
        digest: str | None = None,
        settings: RollingBatchSettings | None = None,
) -> intake.Submission:
    return await intake.submit_document(
        dbpool, namespace="acme", document=doc, idempotency_key=key or f"key-{doc.key}",
        request_digest=digest or hashlib.sha256(repr(doc).encode()).hexdigest(), settings=settings,
    )  # fmt: skip


async def written(conn: asyncpg.Connection) -> dict[str, int]:
    return {
        table: await conn.fetchval(f"SELECT count(*) FROM {table}")
        for table in ("document_submissions", "extraction_jobs", "job_documents", "batches", "outbox_events")
    }


async def test_a_document_becomes_a_ready_job_in_a_rolling_batch(db: asyncpg.Connection, dbpool: asyncpg.Pool) -> None:
    await seed(db)
    await db.execute("LISTEN lading_jobs")
    woken: list[str] = []
    await db.add_listener("lading_jobs", lambda *args: woken.append(args[3]))
    submission = await submit(dbpool, document("inv-1"))
    assert not submission.replayed and submission.batch_namespace == "acme"
    assert submission.batch_name.startswith("documents-")
    job = await db.fetchrow("SELECT * FROM extraction_jobs WHERE id = $1", submission.job_id)
    assert (job["state"], job["tenant"], job["pool"], job["document_key"], job["ordinal"]) == (
        "READY", "acme", "acme/cheap", "inv-1", 0
    )
    assert job["content_sha256"] == hashlib.sha256(b"Invoice inv-1").hexdigest()
    assert await db.fetchval("SELECT text FROM job_documents WHERE job_id = $1", submission.job_id) == "Invoice inv-1"
    batch = await db.fetchrow("SELECT * FROM batches WHERE id = $1", job["batch_id"])
    assert (batch["name"], batch["total_jobs"], batch["priority"]) == (submission.batch_name, 1, 1)
    assert batch["open_until"] is not None and batch["rolling_group"] is not None
    event = await db.fetchrow("SELECT type, payload FROM outbox_events")
    assert event["type"] == "batch.accepted.v1" and event["payload"]["rolling"] is True
    assert await db.fetchval("SELECT count(*) FROM tenant_queues WHERE pool = 'acme/cheap' AND tenant = 'acme'") == 1
    await db.execute("SELECT 1")  # notifications arrive with the next round trip
    assert woken == ["acme/cheap"]


async def test_a_document_by_reference_keeps_its_uri_digest_and_size(
        db: asyncpg.Connection, dbpool: asyncpg.Pool) -> None:  # fmt: skip
    await seed(db)
    digest = hashlib.sha256(b"x").hexdigest()
    submission = await submit(dbpool, document("scan-7", text=None, uri="https://files.example/7.txt",
                                               sha256=digest, bytes=1234))  # fmt: skip
    row = await db.fetchrow("SELECT text, uri, sha256, bytes FROM job_documents WHERE job_id = $1", submission.job_id)
    assert tuple(row) == (None, "https://files.example/7.txt", digest, 1234)
    assert await db.fetchval("SELECT content_sha256 FROM extraction_jobs WHERE id = $1", submission.job_id) == digest


async def test_same_key_same_digest_replays_and_another_digest_is_refused(
        db: asyncpg.Connection, dbpool: asyncpg.Pool) -> None:  # fmt: skip
    await seed(db)
    first = await submit(dbpool, document("inv-1"), key="k", digest="d1")
    again = await submit(dbpool, document("inv-1"), key="k", digest="d1")
    assert again == dataclasses.replace(first, replayed=True)
    before = await written(db)
    with pytest.raises(intake.IdempotencyMismatch, match="'k' was already used in namespace acme"):
        await submit(dbpool, document("inv-2"), key="k", digest="d2")
    assert await written(db) == before


async def test_fifty_concurrent_submissions_of_one_key_make_one_job(
        db: asyncpg.Connection, dbpool: asyncpg.Pool) -> None:  # fmt: skip
    await seed(db)
    results = await asyncio.gather(*(submit(dbpool, document("inv-1"), key="k", digest="d") for _ in range(50)))
    assert len({r.job_id for r in results}) == 1
    assert sum(not r.replayed for r in results) == 1
    assert (await written(db))["extraction_jobs"] == 1


async def test_concurrent_documents_spread_over_the_open_batches_of_their_group(
        db: asyncpg.Connection, dbpool: asyncpg.Pool) -> None:  # fmt: skip
    await seed(db)
    settings = RollingBatchSettings()
    results = await asyncio.gather(*(submit(dbpool, document(f"inv-{i}"), settings=settings) for i in range(40)))
    assert 1 <= len({r.batch_name for r in results}) <= settings.open_batches
    rows = await db.fetch(
        "SELECT b.total_jobs, array_agg(j.ordinal ORDER BY j.ordinal) AS ordinals"
        "  FROM batches b JOIN extraction_jobs j ON j.batch_id = b.id GROUP BY b.id"
    )
    assert all(r["ordinals"] == list(range(r["total_jobs"])) for r in rows)  # each batch counts its own
    assert sum(r["total_jobs"] for r in rows) == 40
    # One open batch per group: they all take turns on it, and it holds all of them.
    await submit(dbpool, document("x-0", priority="low"))
    one = RollingBatchSettings(open_batches=1)
    results = await asyncio.gather(*(submit(dbpool, document(f"x-{i}", priority="low"), settings=one)
                                     for i in range(1, 20)))  # fmt: skip
    assert len({r.batch_name for r in results}) == 1


async def test_a_rolling_batch_closes_when_full_when_its_time_is_up_and_on_a_repeated_key(
        db: asyncpg.Connection, dbpool: asyncpg.Pool) -> None:  # fmt: skip
    await seed(db)
    three = RollingBatchSettings(max_documents=3)
    names = [(await submit(dbpool, document(f"inv-{i}"), settings=three)).batch_name for i in range(7)]
    assert [names.count(n) for n in dict.fromkeys(names)] == [3, 3, 1]
    assert await db.fetchval("SELECT count(*) FROM batches WHERE open_until IS NOT NULL") == 1
    # The same document key under another idempotency key is another job, in another batch.
    again = await submit(dbpool, document("inv-6"), key="second-time", settings=three)
    assert again.batch_name != names[-1]
    # Past its open period a batch takes nothing more.
    expired = RollingBatchSettings(open_s=0.0)
    a = await submit(dbpool, document("a", priority="low"), settings=expired)
    b = await submit(dbpool, document("b", priority="low"), settings=expired)
    assert a.batch_name != b.batch_name


async def test_documents_of_other_groups_go_to_other_batches(db: asyncpg.Connection, dbpool: asyncpg.Pool) -> None:
    await seed(db)
    await registry.upsert_endpoint(db, name="acme/erp", url="https://erp.example/hook", spec={})
    groups: list[dict[str, Any]] = [
        {}, {"priority": "high"}, {"inference_pool_ref": "acme/fast"}, {"delivery_endpoint_ref": "erp"},
        {"deadline_seconds": 600},
    ]
    names = {(await submit(dbpool, document(f"d-{i}", **fields))).batch_name for i, fields in enumerate(groups)}
    assert len(names) == 5


@pytest.mark.parametrize(("quota", "fields", "reason", "field"), [
    ({}, {"inference_pool_ref": "missing"}, reasons.POOL_NOT_FOUND, "inferencePoolRef"),
    ({"allowedPools": ["acme/cheap"]}, {"inference_pool_ref": "globex/private-gpu"}, reasons.POOL_NOT_ALLOWED,
     "inferencePoolRef"),
    ({"allowedPriorities": ["low"]}, {"priority": "high"}, reasons.PRIORITY_NOT_ALLOWED, "priority"),
    ({}, {"delivery_endpoint_ref": "nowhere"}, reasons.INVALID_SPEC, "deliveryEndpointRef"),
    ({"maxQueuedJobs": 1}, {}, reasons.QUOTA_EXCEEDED, None),
    ({"maxQueuedBytes": 20}, {"text": "x" * 21}, reasons.QUOTA_EXCEEDED, None),
])  # fmt: skip
async def test_a_refused_document_changes_nothing_and_leaves_its_key_free(
        db: asyncpg.Connection,
        dbpool: asyncpg.Pool,
        quota: dict[str, Any],
        fields: dict[str, Any],
        reason: str,
        field: str | None,
) -> None:
    await seed(db, **quota)
    if reason == reasons.QUOTA_EXCEEDED and "text" not in fields:
        await submit(dbpool, document("first"))
    before = await written(db)
    with pytest.raises(applying.AdmissionRejected) as refused:
        await submit(dbpool, document("inv-1", **fields), key="k")
    assert refused.value.reason == reason
    assert [f.field for f in refused.value.fields] == ([field] if field else [])
    assert await written(db) == before
    # The key was not taken: the same key with an acceptable document goes through.
    await seed(db)
    await db.execute("UPDATE extraction_jobs SET state = 'CANCELLED', finished_at = now()")
    assert not (await submit(dbpool, document("inv-1"), key="k")).replayed


async def test_a_namespace_no_quota_covers_is_refused(db: asyncpg.Connection, dbpool: asyncpg.Pool) -> None:
    await seed(db)
    with pytest.raises(applying.AdmissionRejected, match="namespace globex is not covered") as refused:
        await intake.submit_document(dbpool, namespace="globex", document=document(), idempotency_key="k",
                                     request_digest="d")  # fmt: skip
    assert refused.value.reason == reasons.NO_TENANT_QUOTA


async def test_every_field_error_is_named_at_once_without_the_values(
        db: asyncpg.Connection, dbpool: asyncpg.Pool) -> None:  # fmt: skip
    await seed(db)
    bad = document("../secret", text="confidential\x00text", priority="urgent", deadline_seconds=5,
                   inference_pool_ref="Not A Pool", sha256="abc")  # fmt: skip
    with pytest.raises(applying.InvalidDocument) as refused:
        await intake.submit_document(dbpool, namespace="acme", document=bad, idempotency_key="k\x00",
                                     request_digest="d")  # fmt: skip
    fields = {f.field: f.message for f in refused.value.fields}
    assert set(fields) == {
        "idempotencyKey", "key", "text", "sha256", "inferencePoolRef", "priority", "deadlineSeconds"
    }, fields
    assert "U+0000" in fields["text"] and "U+0000" in fields["idempotencyKey"]
    assert fields["sha256"] == "must be 64 lowercase hex characters"
    assert refused.value.reason == reasons.INVALID_SPEC
    assert "confidential" not in str(refused.value)
    assert (await written(db))["document_submissions"] == 0


@pytest.mark.parametrize(("fields", "message"), [
    ({"text": None}, "text is required"),
    ({"text": None, "uri": "https://files.example/1"}, "a document by reference needs sha256, bytes"),
    ({"uri": "https://files.example/1", "sha256": "0" * 64, "bytes": 3}, "give either text, or uri"),
])  # fmt: skip
def test_a_document_has_text_or_a_reference(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(applying.InvalidDocument, match=message):
        intake.validated(document(**fields), namespace="acme", idempotency_key="k")


async def test_the_same_key_while_the_first_is_committing_is_in_progress(
        db: asyncpg.Connection, dbpool: asyncpg.Pool) -> None:  # fmt: skip
    await seed(db)
    blocker = await dbpool.acquire()
    try:
        tx = blocker.transaction()
        await tx.start()
        await blocker.execute(
            "INSERT INTO document_submissions (namespace, idempotency_key, request_digest, job_id) "
            "VALUES ('acme', 'k', 'd', 1)"
        )
        with pytest.raises(errors.AcceptanceInProgress, match="'k' of namespace acme is being accepted"):
            await submit(dbpool, document(), key="k", digest="d", settings=RollingBatchSettings(lock_timeout_s=0.2))
        await tx.rollback()
    finally:
        await dbpool.release(blocker)
    assert not (await submit(dbpool, document(), key="k", digest="d")).replayed


async def test_idempotency_records_go_after_their_retention_and_their_jobs_stay(
        db: asyncpg.Connection, dbpool: asyncpg.Pool) -> None:  # fmt: skip
    await seed(db)
    first = await submit(dbpool, document("old"), key="old")
    await submit(dbpool, document("new"), key="new")
    await db.execute(
        "UPDATE document_submissions SET created_at = now() - interval '49 hours' WHERE idempotency_key = 'old'"
    )
    deleted = await cleaning.clean(db, settings=cleaning.CleanerSettings())
    assert deleted["document_submissions"] == 1
    kept = await db.fetch("SELECT idempotency_key FROM document_submissions")
    assert [r["idempotency_key"] for r in kept] == ["new"]
    assert (await written(db))["extraction_jobs"] == 2
    again = await submit(dbpool, document("old"), key="old")  # past the window: a new job
    assert not again.replayed and again.job_id != first.job_id
