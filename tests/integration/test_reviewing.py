"""
Human review against real PostgreSQL: each decision moves a job out of REVIEW_REQUIRED with
its result, its audit row and exactly one outbox event, in one transaction, or changes nothing.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import asyncpg
import pytest

from lading import accepting, ids, reviewing, validation
from lading.db import jobs, pool
from lading.jobs import states, transitions
from tests.support import factories, waiting

WORKER = ids.WorkerId("w1")
POLICY = "invoice-strict-v1"

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

CORRECT: dict[str, Any] = {
    "invoice_number": "INV-2024-001",
    "issue_date": "2024-03-01",
    "currency": "EUR",
    "supplier": {"name": "Acme Tools GmbH"},
    "buyer": {"name": "Example Trading Ltd"},
    "lines": [{"description": "Widget", "quantity": "2", "unit_price": "10.00", "amount": "20.00", "tax_rate": "20"}],
    "subtotal": "20.00",
    "tax_total": "4.00",
    "total": "24.00",
    "evidence": {
        "invoice_number": "Invoice no: INV-2024-001",
        "lines[0].amount": "2 x 10.00   20.00",
        "subtotal": "Subtotal 20.00",
        "tax_total": "VAT 20% 4.00",
        "total": "Total 24.00",
    },
}
"""What the document says, quoted: passes every check of the policy."""

DOUBTFUL: dict[str, Any] = {**CORRECT, "total": "42.00"}
"""What the model extracted: a total that does not add up (total_sum, evidence_mismatch)."""

EVENTS = "SELECT type FROM outbox_events WHERE aggregate_type = 'job' AND aggregate_id = $1 ORDER BY id"


async def _awaiting_review(db: asyncpg.Connection, *, count: int = 1, name: str = "b1",
                           tenant: str = factories.TENANT) -> list[ids.JobId]:  # fmt: skip
    """`count` jobs of a new batch, extracted as DOUBTFUL and waiting for a reviewer."""
    await factories.seed(db, tenant=tenant)
    request = dataclasses.replace(
        factories.batch_request(name=name, count=count, tenant=tenant),
        documents=[accepting.DocumentInput(key=f"doc-{i:05d}", text=TEXT) for i in range(count)],
    )
    accepted = await accepting.accept_batch(db, request)
    claimed = await jobs.claim_batch(db, pool=factories.POOL, worker_id=WORKER, limit=count, lease_ttl_s=600)
    assert {j.id for j in claimed} == set(accepted.job_ids), "no other job was waiting"
    verdict = validation.validate(DOUBTFUL, source_text=TEXT, policy=POLICY).to_json()
    finishes = [transitions.needs_review(j.id, j.fence, result=DOUBTFUL, validation=verdict) for j in claimed]
    assert await jobs.finish_many(db, finishes, worker_id=WORKER) == set(accepted.job_ids)
    return list(accepted.job_ids)


async def _snapshot(db: asyncpg.Connection) -> list[list[tuple[Any, ...]]]:
    """Every row a decision could write, to show that a refused one wrote none."""
    return [
        [tuple(r) for r in await db.fetch(f"SELECT * FROM {table} ORDER BY 1")]
        for table in ("extraction_jobs", "results", "review_decisions", "outbox_events")
    ]


async def _decisions(db: asyncpg.Connection, job_id: ids.JobId) -> list[asyncpg.Record]:
    return list(await db.fetch("SELECT * FROM review_decisions WHERE job_id = $1", job_id))


async def test_approve_succeeds_the_job_with_its_result_and_records_who_and_why(db: asyncpg.Connection) -> None:
    [job_id] = await _awaiting_review(db)
    stored = await db.fetchrow("SELECT result, validation FROM results WHERE job_id = $1", job_id)

    decision = await reviewing.approve(db, job_id=job_id, reviewer=" alice@example.com ", reason="total is right\n")

    assert (decision.decision, decision.state) == (reviewing.Decision.APPROVED, states.JobState.SUCCEEDED)
    assert (decision.reviewer, decision.reason) == ("alice@example.com", "total is right")
    assert decision.corrected_verdict is None
    job = await jobs.get(db, job_id=job_id)
    assert job is not None
    assert job["state"] == "SUCCEEDED" and job["finished_at"] is not None
    assert (job["last_error_class"], job["last_error"]) == (None, None)
    assert await db.fetchrow("SELECT result, validation FROM results WHERE job_id = $1", job_id) == stored
    [row] = await _decisions(db, job_id)
    assert (row["id"], row["decision"], row["reviewer"], row["reason"]) == (
        decision.id, "approved", "alice@example.com", "total is right"
    )  # fmt: skip
    assert row["decided_at"] == decision.decided_at
    assert [row[c] for c in ("previous_result", "previous_validation", "corrected_result", "corrected_validation")] == [
        None, None, None, None
    ]  # fmt: skip
    assert await db.fetch(EVENTS, job_id) == [("extraction.review_required.v1",), ("extraction.completed.v1",)]


async def test_correct_stores_the_reviewers_result_with_its_verdict_and_keeps_the_one_it_replaced(
        db: asyncpg.Connection,
) -> None:
    [job_id] = await _awaiting_review(db)
    before = await db.fetchrow("SELECT result, validation, fence FROM results WHERE job_id = $1", job_id)

    decision = await reviewing.correct(db, job_id=job_id, reviewer="bob", reason="total misread", corrected=CORRECT)

    assert (decision.decision, decision.state) == (reviewing.Decision.CORRECTED, states.JobState.SUCCEEDED)
    assert decision.corrected_verdict == validation.Verdict(policy=POLICY, passed=True, failed=())
    normalised = {**CORRECT, "due_date": None, "supplier": {**CORRECT["supplier"], "vat_id": None, "iban": None},
                  "buyer": {**CORRECT["buyer"], "vat_id": None}}  # fmt: skip
    assert decision.corrected_result == normalised
    after = await db.fetchrow("SELECT result, validation, fence FROM results WHERE job_id = $1", job_id)
    assert after["result"] == normalised
    assert after["validation"] == {"policy": POLICY, "passed": True, "failed_checks": []}
    assert after["fence"] == before["fence"]
    [row] = await _decisions(db, job_id)
    assert row["decision"] == "corrected"
    assert (row["previous_result"], row["previous_validation"]) == (DOUBTFUL, before["validation"])
    assert (row["corrected_result"], row["corrected_validation"]) == (normalised, after["validation"])
    assert await db.fetchval("SELECT state FROM extraction_jobs WHERE id = $1", job_id) == "SUCCEEDED"
    assert await db.fetch(EVENTS, job_id) == [("extraction.review_required.v1",), ("extraction.completed.v1",)]


async def test_reject_fails_the_job_terminally_naming_the_reviewer_and_the_reason(db: asyncpg.Connection) -> None:
    [job_id] = await _awaiting_review(db)
    stored = await db.fetchrow("SELECT result, validation FROM results WHERE job_id = $1", job_id)

    decision = await reviewing.reject(db, job_id=job_id, reviewer="carol", reason="not our invoice")

    assert (decision.decision, decision.state) == (reviewing.Decision.REJECTED, states.JobState.FAILED_TERMINAL)
    job = await jobs.get(db, job_id=job_id)
    assert job is not None
    assert (job["state"], job["last_error_class"]) == ("FAILED_TERMINAL", "REJECTED_BY_REVIEWER")
    assert job["last_error"] == "rejected by carol: not our invoice"
    assert job["finished_at"] is not None
    assert await db.fetchrow("SELECT result, validation FROM results WHERE job_id = $1", job_id) == stored
    [row] = await _decisions(db, job_id)
    assert (row["decision"], row["reviewer"], row["reason"]) == ("rejected", "carol", "not our invoice")
    assert row["corrected_result"] is None
    assert await db.fetch(EVENTS, job_id) == [("extraction.review_required.v1",), ("extraction.failed.v1",)]
    payload = await db.fetchval(
        "SELECT payload FROM outbox_events WHERE aggregate_id = $1 AND type = 'extraction.failed.v1'", job_id
    )
    assert (payload["state"], payload["error_class"]) == ("FAILED_TERMINAL", "REJECTED_BY_REVIEWER")


DECISIONS = {
    "approve": lambda db, job_id: reviewing.approve(db, job_id=job_id, reviewer="dave", reason="fine"),
    "correct": lambda db, job_id: reviewing.correct(db, job_id=job_id, reviewer="dave", reason="fixed",
                                                    corrected=CORRECT),
    "reject": lambda db, job_id: reviewing.reject(db, job_id=job_id, reviewer="dave", reason="bad"),
}  # fmt: skip


@pytest.mark.parametrize("decide", DECISIONS)
async def test_a_decision_on_a_job_that_is_not_awaiting_review_changes_nothing_and_names_its_state(
        db: asyncpg.Connection, decide: str,
) -> None:
    approved, rejected, cancelled = await _awaiting_review(db, count=3)
    await reviewing.approve(db, job_id=approved, reviewer="erin", reason="ok")
    await reviewing.reject(db, job_id=rejected, reviewer="erin", reason="no")
    await jobs.cancel(db, job_id=cancelled, reason="batch deleted")
    accepted = await accepting.accept_batch(db, factories.batch_request(name="b2", count=2))
    ready, running = accepted.job_ids
    await jobs.claim_batch(db, pool=factories.POOL, worker_id=WORKER, limit=1, lease_ttl_s=600)
    before = await _snapshot(db)

    for job_id, state in (
        (approved, "SUCCEEDED"), (rejected, "FAILED_TERMINAL"), (cancelled, "CANCELLED"), (ready, "RUNNING"),
        (running, "READY"),
    ):  # fmt: skip
        with pytest.raises(reviewing.NotAwaitingReview, match=f"job {job_id} is {state}, not REVIEW_REQUIRED") as e:
            await DECISIONS[decide](db, job_id)
        assert e.value.state == states.JobState(state)
    with pytest.raises(reviewing.JobNotFound, match="job 987654 not found"):
        await DECISIONS[decide](db, ids.JobId(987654))

    assert await _snapshot(db) == before


async def test_a_correction_that_is_not_invoice_v1_is_refused_with_its_error_locations_and_writes_nothing(
        db: asyncpg.Connection,
) -> None:
    [job_id] = await _awaiting_review(db)
    before = await _snapshot(db)
    invalid = {**CORRECT, "lines": [{**CORRECT["lines"][0], "amount": "20,00"}], "colour": "red"}
    del invalid["invoice_number"]

    with pytest.raises(reviewing.CorrectionInvalid) as refused:
        await reviewing.correct(db, job_id=job_id, reviewer="bob", reason="fixed", corrected=invalid)

    assert [location.split(":")[0] for location in refused.value.locations] == [
        "invoice_number", "lines[0].amount", "colour"
    ]  # fmt: skip
    message = str(refused.value)
    assert message.startswith("the correction is not a valid invoice.v1 document: invoice_number: Field required")
    assert "lines[0].amount: String should match pattern" in message and "(string_pattern_mismatch)" in message
    assert "colour: Extra inputs are not permitted (extra_forbidden)" in message
    assert await _snapshot(db) == before


async def test_a_correction_that_still_fails_a_check_is_accepted_and_its_report_lists_the_check(
        db: asyncpg.Connection,
) -> None:
    [job_id] = await _awaiting_review(db)
    gold = {**CORRECT, "currency": "XAU"}

    decision = await reviewing.correct(db, job_id=job_id, reviewer="bob", reason="paid in gold", corrected=gold)

    verdict = decision.corrected_verdict
    assert verdict is not None and not verdict.passed
    assert [(c.check, c.field) for c in verdict.failed] == [("currency_allowed", "currency")]
    assert await db.fetchval("SELECT state FROM extraction_jobs WHERE id = $1", job_id) == "SUCCEEDED"
    stored = await db.fetchval("SELECT validation FROM results WHERE job_id = $1", job_id)
    assert stored == verdict.to_json() and stored["passed"] is False
    case = await reviewing.show(db, job_id=job_id)
    assert [d.corrected_verdict for d in case.decisions] == [verdict]


@pytest.mark.parametrize(("sign_off", "refusal"), [
    ({"reviewer": "", "reason": "fine"}, "a reviewer is required"),
    ({"reviewer": "  ", "reason": "fine"}, "a reviewer is required"),
    ({"reviewer": "alice", "reason": " \n "}, "a reason is required"),
    ({"reviewer": "a" * 201, "reason": "fine"}, "the reviewer is 201 characters long; at most 200 are allowed"),
    ({"reviewer": "alice", "reason": "r" * 2001}, "the reason is 2001 characters long; at most 2000 are allowed"),
    ({"reviewer": "alice\x1b[31m", "reason": "fine"}, "the reviewer contains control characters"),
    ({"reviewer": "alice", "reason": "fine\x00"}, "the reason contains control characters"),
], ids=["no-reviewer", "blank-reviewer", "blank-reason", "long-reviewer", "long-reason", "escape", "nul"])  # fmt: skip
async def test_reviewer_and_reason_are_required_bounded_and_printable(
        db: asyncpg.Connection, sign_off: dict[str, str], refusal: str,
) -> None:
    [job_id] = await _awaiting_review(db)
    before = await _snapshot(db)
    for decide in (reviewing.approve, reviewing.reject):
        with pytest.raises(reviewing.ReviewInputInvalid) as refused:
            await decide(db, job_id=job_id, **sign_off)
        assert str(refused.value) == refusal
    with pytest.raises(reviewing.ReviewInputInvalid) as refused:
        await reviewing.correct(db, job_id=job_id, corrected=CORRECT, **sign_off)
    assert str(refused.value) == refusal
    assert await _snapshot(db) == before
    longest = {"reviewer": "a" * reviewing.REVIEWER_MAX_CHARS, "reason": "line one\n\tline two" * 100}
    await reviewing.approve(db, job_id=job_id, **longest)


async def _waiting_for_locks(database_url: str, *, count: int) -> bool:
    conn = await pool.connect(database_url)
    try:
        waiting_now = await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
    finally:
        await conn.close()
    return bool(waiting_now == count)


@pytest.mark.parametrize("second", ["approve", "reject"])
async def test_of_two_concurrent_decisions_on_one_job_exactly_one_wins(
        db: asyncpg.Connection, database_url: str, second: str,
) -> None:
    [job_id] = await _awaiting_review(db)
    one, two = await pool.connect(database_url), await pool.connect(database_url)
    try:
        # Hold the job's row lock until both decisions wait for it, so that they truly overlap:
        # the loser's guarded UPDATE re-reads the row after the winner commits.
        blocking = db.transaction()
        await blocking.start()
        await db.execute("SELECT 1 FROM extraction_jobs WHERE id = $1 FOR UPDATE", job_id)
        both = asyncio.gather(
            reviewing.approve(one, job_id=job_id, reviewer="first", reason="ok"),
            DECISIONS[second](two, job_id),
            return_exceptions=True,
        )
        await waiting.until(lambda: _waiting_for_locks(database_url, count=2))
        await blocking.rollback()
        outcomes = await both
    finally:
        await one.close()
        await two.close()

    won = [o for o in outcomes if isinstance(o, reviewing.ReviewDecision)]
    lost = [o for o in outcomes if isinstance(o, reviewing.NotAwaitingReview)]
    assert (len(won), len(lost)) == (1, 1), outcomes
    assert lost[0].state == won[0].state
    [row] = await _decisions(db, job_id)
    assert row["id"] == won[0].id
    assert await db.fetchval("SELECT state FROM extraction_jobs WHERE id = $1", job_id) == won[0].state.value
    settling = "extraction.failed.v1" if won[0].state is states.JobState.FAILED_TERMINAL else "extraction.completed.v1"
    assert await db.fetch(EVENTS, job_id) == [("extraction.review_required.v1",), (settling,)]


async def test_the_queue_pages_through_the_jobs_awaiting_review_in_id_order(db: asyncpg.Connection) -> None:
    acme = await _awaiting_review(db, count=5)
    globex = await _awaiting_review(db, count=2, name="g1", tenant="globex")
    await reviewing.approve(db, job_id=acme[1], reviewer="alice", reason="ok")
    await accepting.accept_batch(db, factories.batch_request(name="b3", count=3))  # READY: not in the queue
    waiting = [acme[0], *acme[2:], *globex]

    seen: list[ids.JobId] = []
    after: ids.JobId | None = None
    pages = 0
    while True:
        page = await reviewing.list_queue(db, limit=2, after=after)
        pages += 1
        assert len(page.jobs) <= 2
        seen.extend(j.id for j in page.jobs)
        if page.next_after is None:
            break
        assert page.next_after == page.jobs[-1].id
        after = page.next_after
    assert seen == waiting and pages == 3

    only_globex = await reviewing.list_queue(db, tenant=ids.TenantName("globex"), limit=10)
    assert [j.id for j in only_globex.jobs] == globex and only_globex.next_after is None
    first = only_globex.jobs[0]
    assert (first.tenant, first.batch_namespace, first.batch_name, first.document_key) == (
        "globex", "globex", "g1", "doc-00000"
    )  # fmt: skip
    assert first.failed_checks == ("total_sum", "evidence_mismatch")
    assert first.validation_policy == POLICY and first.waiting_age_s >= 0
    assert (await reviewing.list_queue(db, limit=10, after=globex[-1])).jobs == ()
    with pytest.raises(ValueError, match="limit must be 1 to"):
        await reviewing.list_queue(db, limit=0)


async def test_show_returns_the_job_its_result_with_the_failed_checks_and_the_decisions_so_far(
        db: asyncpg.Connection,
) -> None:
    [job_id] = await _awaiting_review(db)
    case = await reviewing.show(db, job_id=job_id)
    assert (case.job.id, case.job.state) == (job_id, states.JobState.REVIEW_REQUIRED)
    assert case.result is not None and case.result.result == DOUBTFUL
    assert [c.check for c in case.result.failed_checks] == ["total_sum", "evidence_mismatch"]
    assert case.decisions == ()

    decision = await reviewing.correct(db, job_id=job_id, reviewer="bob", reason="total misread", corrected=CORRECT)

    case = await reviewing.show(db, job_id=job_id)
    assert case.job.state is states.JobState.SUCCEEDED
    assert case.result is not None and case.result.passed is True and case.result.failed_checks == ()
    assert case.decisions == (decision,)
    assert case.decisions[0].previous_result == DOUBTFUL
    with pytest.raises(reviewing.JobNotFound):
        await reviewing.show(db, job_id=ids.JobId(987654))
    async with db.transaction(isolation="repeatable_read", readonly=True):  # the caller's snapshot is used
        assert (await reviewing.show(db, job_id=job_id)).decisions == (decision,)


async def test_a_job_whose_model_output_was_unusable_cannot_be_approved_only_corrected(
        db: asyncpg.Connection,
) -> None:
    [job_id] = await _awaiting_review(db)
    await db.execute(
        "UPDATE results SET result = $2 WHERE job_id = $1", job_id, {"raw_output": '{"invoice_number": '}
    )
    before = await _snapshot(db)
    with pytest.raises(reviewing.ReviewInputInvalid, match="lading review correct"):
        await reviewing.approve(db, job_id=job_id, reviewer="ada", reason="looks fine")
    assert await _snapshot(db) == before
    decision = await reviewing.correct(db, job_id=job_id, reviewer="ada", reason="typed in", corrected=CORRECT)
    assert decision.state is states.JobState.SUCCEEDED
