"""Acceptance: one transaction, idempotent under concurrency, conflicts change nothing."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt

import asyncpg
import pytest

from lading import accepting, errors, failpoints
from lading.db import job_rows, pool
from lading.ids import BatchId, JobId
from lading.jobs import hashing
from tests.support import factories
from tests.support import waiting as waiting_support


async def _counts(conn: asyncpg.Connection) -> tuple[int, int, int, int]:
    row = await conn.fetchrow(
        """SELECT (SELECT count(*) FROM batches) AS b, (SELECT count(*) FROM extraction_jobs) AS j,
                  (SELECT count(*) FROM job_documents) AS d, (SELECT count(*) FROM outbox_events) AS o"""
    )
    assert row is not None
    return row["b"], row["j"], row["d"], row["o"]


async def test_acceptance_writes_batch_jobs_documents_and_outbox_rows_together(db: asyncpg.Connection) -> None:
    await factories.seed(db)
    result = await accepting.accept_batch(db, factories.batch_request(count=25))
    assert result.created
    assert len(result.job_ids) == 25
    assert await _counts(db) == (1, 25, 25, 1)
    states = await db.fetch("SELECT DISTINCT state FROM extraction_jobs")
    assert [r["state"] for r in states] == ["READY"]
    types = await db.fetch("SELECT DISTINCT type FROM outbox_events")
    assert [r["type"] for r in types] == ["batch.accepted.v1"]


async def test_repeated_acceptance_inserts_nothing_and_returns_the_same_ids(db: asyncpg.Connection) -> None:
    await factories.seed(db)
    first = await accepting.accept_batch(db, factories.batch_request(count=5))
    again = await accepting.accept_batch(db, factories.batch_request(count=5))
    assert not again.created
    assert again.job_ids == first.job_ids
    assert await _counts(db) == (1, 5, 5, 1)


async def test_eight_concurrent_acceptances_of_one_batch_create_one_set_of_jobs(
        db: asyncpg.Connection, database_url: str
) -> None:
    await factories.seed(db)
    request = factories.batch_request(count=200)
    connections = [await pool.connect(database_url) for _ in range(8)]
    try:
        results = await asyncio.gather(*(accepting.accept_batch(c, request) for c in connections))
    finally:
        for c in connections:
            await c.close()
    assert sum(r.created for r in results) == 1
    assert len({r.job_ids for r in results}) == 1
    assert await _counts(db) == (1, 200, 200, 1)


async def test_same_key_with_a_changed_document_conflicts_and_changes_nothing(db: asyncpg.Connection) -> None:
    await factories.seed(db)
    original = factories.batch_request(count=3)
    await accepting.accept_batch(db, original)
    before = await db.fetch("SELECT id, request_hash FROM extraction_jobs ORDER BY id")
    changed_docs = list(original.documents)
    changed_docs[1] = accepting.DocumentInput(key=changed_docs[1].key, text=changed_docs[1].text + "!")
    with pytest.raises(errors.IdempotencyConflict):
        await accepting.accept_batch(db, dataclasses.replace(original, documents=changed_docs))
    assert await _counts(db) == (1, 3, 3, 1)
    assert await db.fetch("SELECT id, request_hash FROM extraction_jobs ORDER BY id") == before


async def test_hash_ignores_transport_level_options_but_not_the_model(db: asyncpg.Connection) -> None:
    await factories.seed(db)
    original = factories.batch_request(count=2)
    await accepting.accept_batch(db, original)
    # priority and deadline do not affect the result: the same request
    same = await accepting.accept_batch(db, dataclasses.replace(original, priority="high", deadline_s=60))
    assert not same.created
    with pytest.raises(errors.IdempotencyConflict):
        await accepting.accept_batch(
            db, dataclasses.replace(original, model_policy={**original.model_policy, "model": "other"})
        )


async def test_a_failure_inside_acceptance_rolls_back_everything_and_a_retry_succeeds_once(
        db: asyncpg.Connection,
) -> None:
    await factories.seed(db)
    request = factories.batch_request(count=10)
    with failpoints.enabled("accept.after_bulk_inserts", "raise"), pytest.raises(
        failpoints.FailpointError
    ):
        await accepting.accept_batch(db, request)
    assert await _counts(db) == (0, 0, 0, 0)
    retried = await accepting.accept_batch(db, request)
    again = await accepting.accept_batch(db, request)
    assert retried.created and not again.created
    assert await _counts(db) == (1, 10, 10, 1)


async def test_an_acceptance_still_committing_elsewhere_is_reported_in_progress(
        db: asyncpg.Connection, database_url: str
) -> None:
    await factories.seed(db)
    request = factories.batch_request(count=3)
    holder = await pool.connect(database_url)
    try:
        tx = holder.transaction()
        await tx.start()
        await holder.execute(
            "INSERT INTO batches (tenant, namespace, name, uid, idempotency_key, request_hash, hash_version, schema,"
            " pool, validation_policy, priority, deadline_s, total_jobs)"
            " VALUES ($1, 'acme', 'b1', 'x', $2, 'h', 1, 'invoice.v1', $3, 'p', 1, 60, 0)",
            factories.TENANT, request.idempotency_key, factories.POOL,
        )
        with pytest.raises(errors.AcceptanceInProgress):
            await accepting.accept_batch(db, request, lock_timeout_s=0.2)
        await tx.rollback()
    finally:
        await holder.close()
    assert (await accepting.accept_batch(db, request)).created


async def test_same_batch_key_in_two_tenants_gives_independent_jobs(db: asyncpg.Connection) -> None:
    await factories.seed(db, tenant="acme")
    await factories.seed(db, tenant="globex")
    a = await accepting.accept_batch(db, factories.batch_request(tenant="acme", count=2))
    b = await accepting.accept_batch(db, factories.batch_request(tenant="globex", count=2))
    assert a.created and b.created
    assert set(a.job_ids).isdisjoint(b.job_ids)


async def test_job_and_document_rows_hold_the_request_values_across_copy_chunks(db: asyncpg.Connection) -> None:
    # Rows of about 1 KB, so the documents' COPY stream spans several chunks; keys and texts
    # outside ASCII, so sizes are UTF-8 bytes, not characters.
    await factories.seed(db)
    documents = [
        accepting.DocumentInput(key=f"clé-{i:04d}-ü", text=f"Rechnung {i} 🧾 é " + "x" * (1000 + i % 7))
        for i in range(1_200)
    ]
    assert 1_200 * 1_000 > 2 * job_rows.COPY_CHUNK_BYTES
    request = dataclasses.replace(
        factories.batch_request(), documents=documents, priority="high", max_attempts=3, deadline_s=7200
    )
    result = await accepting.accept_batch(db, request)
    rows = await db.fetch(
        """SELECT j.*, d.text, d.bytes, d.uri, b.created_at AS batch_created_at
             FROM extraction_jobs j JOIN job_documents d ON d.job_id = j.id JOIN batches b ON b.id = j.batch_id
            ORDER BY j.ordinal"""
    )
    assert [r["id"] for r in rows] == list(result.job_ids)
    for ordinal, (row, document) in enumerate(zip(rows, documents, strict=True)):
        digest = hashing.content_digest(document.text)
        assert (row["ordinal"], row["document_key"], row["text"], row["bytes"], row["uri"]) == (
            ordinal, document.key, document.text, len(document.text.encode()), None
        )
        assert row["content_sha256"] == digest
        assert row["request_hash"] == hashing.job_request_hash(
            content_sha256=digest, schema=request.schema, model_policy=request.model_policy,
            validation_policy=request.validation_policy,
        )  # fmt: skip
        assert (row["tenant"], row["batch_id"], row["pool"], row["schema"], row["validation_policy"]) == (
            request.tenant, result.batch_id, request.pool, request.schema, request.validation_policy
        )
        assert (row["state"], row["priority"], row["attempt"], row["max_attempts"], row["suspended"]) == (
            "READY", 0, 0, 3, False
        )
        # The deadline counts from the acceptance (the batch row's insert), to the microsecond.
        assert abs(row["deadline_at"] - row["batch_created_at"] - dt.timedelta(seconds=7200)) < dt.timedelta(seconds=5)
    assert len({r["deadline_at"] for r in rows}) == 1
    queued = await db.fetchrow(
        "SELECT sum(jobs)::bigint AS jobs, sum(bytes)::bigint AS bytes FROM tenant_queued WHERE tenant = $1",
        request.tenant,
    )
    assert queued is not None and (queued["jobs"], queued["bytes"]) == (
        1_200, sum(len(d.text.encode()) for d in documents)
    )


async def test_a_batch_committed_elsewhere_after_the_lookup_is_returned_and_nothing_of_this_one_stays(
        db: asyncpg.Connection, database_url: str
) -> None:
    # The other acceptance of the same batch has written its batch row and not committed: this
    # one finds no batch, writes its documents, then waits on the key. Once the other commits,
    # this one rolls back what it wrote and answers with the stored batch.
    await factories.seed(db)
    request = factories.batch_request(count=50)
    holder = await pool.connect(database_url)
    try:
        transaction = holder.transaction()
        await transaction.start()
        first = await accepting.accept_batch(holder, request)
        waiting = asyncio.create_task(accepting.accept_batch(db, request, lock_timeout_s=30))
        await _until_waiting_on_a_lock(holder, count=1)
        await transaction.commit()
        second = await asyncio.wait_for(waiting, 30)
    finally:
        await holder.close()
    assert first.created and not second.created
    assert second.job_ids == first.job_ids
    assert await _counts(db) == (1, 50, 50, 1)


async def _until_waiting_on_a_lock(conn: asyncpg.Connection, *, count: int) -> None:
    async def waiting() -> bool:
        n: int = await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        return n >= count

    await waiting_support.until(waiting)


@pytest.mark.parametrize(
    "deadline_at",
    [
        dt.datetime(2031, 5, 6, 7, 8, 9, 123_456, tzinfo=dt.timezone(dt.timedelta(hours=2))),
        dt.datetime(1999, 12, 31, 23, 59, 59, 500_000, tzinfo=dt.UTC),  # before PostgreSQL's epoch
    ],
)
async def test_the_binary_job_rows_store_every_shared_value_exactly(
        db: asyncpg.Connection, deadline_at: dt.datetime
) -> None:
    shared = job_rows.SharedJobValues(
        tenant="ténant", batch_id=BatchId(2**40 + 3), pool="ns/pool-ü", schema="invoice.v1",
        validation_policy="strict", priority=2, max_attempts=7, deadline_at=deadline_at,
    )  # fmt: skip
    digest, request_hash = "0" * 64, "f" * 64
    async with db.transaction():
        await job_rows.copy_jobs(db, shared, [(JobId(2**41 + 5), 9, "kéy 🧾", request_hash.encode(), digest.encode())])
        row = await db.fetchrow("SELECT * FROM extraction_jobs")
    assert row is not None
    assert (row["id"], row["ordinal"], row["document_key"], row["request_hash"], row["content_sha256"]) == (
        2**41 + 5, 9, "kéy 🧾", request_hash, digest
    )
    assert (
        row["tenant"], row["batch_id"], row["pool"], row["schema"], row["validation_policy"], row["priority"],
        row["max_attempts"], row["deadline_at"],
    ) == ("ténant", 2**40 + 3, "ns/pool-ü", "invoice.v1", "strict", 2, 7, deadline_at)  # fmt: skip
