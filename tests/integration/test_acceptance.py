"""Acceptance: one transaction, idempotent under concurrency, conflicts change nothing."""

from __future__ import annotations

import asyncio
import dataclasses

import asyncpg
import pytest

from lading import accepting, errors, failpoints
from lading.db import pool
from tests.support import factories


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
    with failpoints.enabled("accept.after_jobs_before_documents", "raise"), pytest.raises(
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
