"""
A delivery row is written by the database in the statement that records a job's success: with
the worker's commit, and with a reviewer's approve or correct, never without the success and
never for a batch without an endpoint, a job sent to review, or a rejected one.
"""

from __future__ import annotations

import dataclasses

import asyncpg
import orjson
import pytest

from lading import accepting, reviewing
from lading.db import jobs
from lading.ids import JobId
from lading.jobs import transitions
from lading.jobs.states import JobState
from tests.integration.delivery import helpers
from tests.support import erp_stub, factories

TEXT = """RECHNUNG / INVOICE
Invoice no: INV-2024-001
Date: 2024-03-01
Supplier: Acme Tools GmbH
Buyer: Example Trading Ltd
Widget   2 x 10.00   20.00
Subtotal 20.00
VAT 20% 4.00
Total 24.00
"""

CORRECT = {
    "invoice_number": "INV-2024-001", "issue_date": "2024-03-01", "currency": "EUR",
    "supplier": {"name": "Acme Tools GmbH"}, "buyer": {"name": "Example Trading Ltd"},
    "lines": [{"description": "Widget", "quantity": "2", "unit_price": "10.00", "amount": "20.00", "tax_rate": "20"}],
    "subtotal": "20.00", "tax_total": "4.00", "total": "24.00",
    "evidence": {"invoice_number": "Invoice no: INV-2024-001", "lines[0].amount": "2 x 10.00   20.00",
                 "subtotal": "Subtotal 20.00", "tax_total": "VAT 20% 4.00", "total": "Total 24.00"},
}  # fmt: skip


async def _count(db: asyncpg.Connection) -> int:
    return int(await db.fetchval("SELECT count(*) FROM deliveries"))


async def test_the_workers_success_writes_one_pending_delivery_per_job_in_its_own_statement(
        db: asyncpg.Connection,
) -> None:
    job_ids = await helpers.succeed(db, count=3)
    rows = await db.fetch("SELECT job_id, endpoint, state, attempt, fence FROM deliveries ORDER BY job_id")
    assert [tuple(r) for r in rows] == [(j, helpers.ENDPOINT, "PENDING", 0, 0) for j in job_ids]


async def test_a_success_rolled_back_leaves_no_delivery(db: asyncpg.Connection) -> None:
    await helpers.accept(db, count=1)
    [claimed] = await jobs.claim_batch(db, pool=factories.POOL, worker_id=helpers.WORKER, limit=1, lease_ttl_s=60)
    with pytest.raises(RuntimeError):
        async with db.transaction():
            finish = transitions.succeed(claimed.id, claimed.fence, result={"x": 1}, validation={"passed": True})
            assert await jobs.finish_many(db, [finish], worker_id=helpers.WORKER) == {claimed.id}
            assert await _count(db) == 1
            raise RuntimeError("the commit fails")
    assert await _count(db) == 0
    assert await db.fetchval("SELECT state FROM extraction_jobs WHERE id = $1", claimed.id) == "RUNNING"


async def test_a_batch_without_an_endpoint_and_jobs_that_do_not_succeed_get_no_delivery(
        db: asyncpg.Connection,
) -> None:
    await helpers.succeed(db, count=2, endpoint=None)
    await helpers.accept(db, count=2, name="b2")
    claimed = await jobs.claim_batch(db, pool=factories.POOL, worker_id=helpers.WORKER, limit=2, lease_ttl_s=60)
    finishes = [
        transitions.needs_review(claimed[0].id, claimed[0].fence, result={"x": 1}, validation={"passed": False}),
        transitions.Finish(claimed[1].id, claimed[1].fence, JobState.FAILED_TERMINAL, "terminal"),
    ]
    await jobs.finish_many(db, finishes, worker_id=helpers.WORKER)
    assert await _count(db) == 0


async def _awaiting_review(db: asyncpg.Connection, count: int) -> list[JobId]:
    await factories.seed(db)
    request = dataclasses.replace(
        factories.batch_request(count=count), endpoint=helpers.ENDPOINT,
        documents=[accepting.DocumentInput(key=f"doc-{i:05d}", text=TEXT) for i in range(count)],
    )  # fmt: skip
    await accepting.accept_batch(db, request)
    claimed = await jobs.claim_batch(db, pool=factories.POOL, worker_id=helpers.WORKER, limit=count, lease_ttl_s=60)
    doubtful = {**CORRECT, "total": "42.00"}
    await jobs.finish_many(
        db, [transitions.needs_review(c.id, c.fence, result=doubtful, validation={"passed": False}) for c in claimed],
        worker_id=helpers.WORKER,
    )  # fmt: skip
    return [c.id for c in claimed]


async def test_a_reviewers_approve_and_correct_write_the_delivery_in_the_decisions_transaction_and_reject_does_not(
        db: asyncpg.Connection,
) -> None:
    approved, corrected, rejected = await _awaiting_review(db, 3)
    assert await _count(db) == 0
    await db.execute("UPDATE results SET result = $2 WHERE job_id = $1", approved, CORRECT)  # a valid invoice

    await reviewing.approve(db, job_id=approved, reviewer="ann", reason="checked")
    await reviewing.correct(db, job_id=corrected, reviewer="ann", reason="total fixed", corrected=CORRECT)
    await reviewing.reject(db, job_id=rejected, reviewer="ann", reason="not ours")

    rows = await db.fetch("SELECT job_id, state FROM deliveries ORDER BY job_id")
    assert [tuple(r) for r in rows] == [(approved, "PENDING"), (corrected, "PENDING")]


async def test_a_refused_approval_rolls_its_delivery_back_with_it(db: asyncpg.Connection) -> None:
    [job_id] = await _awaiting_review(db, 1)
    await db.execute("UPDATE results SET result = '{\"raw\": \"unusable\"}'::jsonb WHERE job_id = $1", job_id)
    with pytest.raises(reviewing.ReviewInputInvalid):
        await reviewing.approve(db, job_id=job_id, reviewer="ann", reason="ok")
    assert await _count(db) == 0


async def test_a_reviewed_jobs_body_says_approved_or_corrected_and_carries_the_reviewed_result(
        db: asyncpg.Connection, dbpool: asyncpg.Pool,
) -> None:
    approved, corrected = await _awaiting_review(db, 2)
    await db.execute("UPDATE results SET result = $2 WHERE job_id = $1", approved, CORRECT)
    await reviewing.approve(db, job_id=approved, reviewer="ann", reason="checked")
    fixed = {**CORRECT, "currency": "USD"}
    await reviewing.correct(db, job_id=corrected, reviewer="ann", reason="currency", corrected=fixed)
    async with erp_stub.running() as erp:
        await helpers.register(db, erp.webhook_url)
        async with helpers.dispatcher(dbpool) as d:
            assert (await d.run_once()).delivered == 2
    bodies = {int(b["data"]["job_id"]): b["data"] for b in (orjson.loads(r.body) for r in erp.requests)}
    assert bodies[approved]["validation"]["outcome"] == "approved"
    assert bodies[corrected]["validation"]["outcome"] == "corrected"
    assert bodies[corrected]["result"]["currency"] == "USD"
