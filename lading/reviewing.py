"""
Human review of doubtful extractions: a reviewer approves, corrects or rejects a job that
waits in REVIEW_REQUIRED, and says who they are and why.

    REVIEW_REQUIRED ──approve──▶ SUCCEEDED         the stored result stands
                    ──correct──▶ SUCCEEDED         the reviewer's result replaces it
                    ──reject───▶ FAILED_TERMINAL   REJECTED_BY_REVIEWER, with the reason

Each decision is ONE transaction: the guarded state change (`lading.db.jobs.review_decide`;
the database writes its outbox event by trigger), the results row for a correction, and the
`review_decisions` row (migration 0003): the audit trail of who decided what, when and why.
A job that is not waiting for review (decided already, by a concurrent reviewer too, or
cancelled) changes nothing, and `NotAwaitingReview` names the state it is in.

A correction must be a valid `invoice.v1` document, or `CorrectionInvalid` names pydantic's
error locations and nothing is written. What PostgreSQL cannot store (NUL, lone surrogates,
integers past 64 bits, NaN or Infinity; `lading.storable`) is refused the same way, naming
the field, before any SQL; a sign-off holding a lone surrogate is refused like one holding
control characters. The job's validation policy then judges the correction against the
document's text, with its pool's `defaultCurrency` as the worker judged the model's answer;
that verdict is stored and reported, never enforced: the reviewer decides, and may well
accept an invoice that really does not add up.

`list_queue` and `show` are the read side. Neither reads the document text, which may be
confidential (`lading jobs show ID --show-document` prints it on request). The CLI is
`lading_cli.review`; the state machine is `lading.jobs.states`.

    errors.PermanentError
    ├── JobNotFound             no job has this id
    ├── NotAwaitingReview       the job is not in REVIEW_REQUIRED; names its state
    └── ReviewInputInvalid      reviewer or reason missing, too long, with control characters or a
        │                       lone surrogate
        └── CorrectionInvalid   not an invoice.v1 document, or not storable; names where and why
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import unicodedata
from collections.abc import Sequence
from typing import Any, Final

import asyncpg
import pydantic

from lading import errors, ids, storable, validation
from lading.db import jobs, registry, results, review_decisions
from lading.jobs import states
from lading.models import invoice, specs

REVIEWER_MAX_CHARS: Final = 200
"""Longest reviewer name (after trimming): room for an e-mail address or a directory DN.
Migration 0003 checks the same bound."""

REASON_MAX_CHARS: Final = 2000
"""Longest reason (after trimming): a paragraph, not a document. Migration 0003 checks the same bound."""

QUEUE_LIMIT_DEFAULT: Final = 50
"""Jobs per page of the review queue when not told: one screen."""

QUEUE_LIMIT_MAX: Final = 1000
"""The largest page: bounds the query and the memory of one call; page with `after` for more."""

CORRECTION_LOCATIONS_MAX: Final = 20
"""Schema errors named in a `CorrectionInvalid` message; the rest are counted."""

_NAME_MAX = 64
"""A dict key from the correction, cut to this length when named in an error (it may be anything)."""

_REASON_CONTROLS_ALLOWED = frozenset("\n\t")


class Decision(enum.StrEnum):
    APPROVED = "approved"    #: the stored result stands; the job SUCCEEDED
    CORRECTED = "corrected"  #: the reviewer's result replaced it; the job SUCCEEDED
    REJECTED = "rejected"    #: nothing is delivered; the job FAILED_TERMINAL

    @property
    def target(self) -> states.JobState:
        """The state this decision moves a job to."""
        return states.JobState.FAILED_TERMINAL if self is Decision.REJECTED else states.JobState.SUCCEEDED


class JobNotFound(errors.PermanentError):
    """No job has this id."""

    def __init__(self, *, job_id: ids.JobId) -> None:
        super().__init__(f"job {job_id} not found")
        self.job_id = job_id


class NotAwaitingReview(errors.PermanentError):
    """The job is not in REVIEW_REQUIRED (decided already, cancelled, or never doubtful); nothing changed."""

    def __init__(self, *, job_id: ids.JobId, state: states.JobState) -> None:
        super().__init__(f"job {job_id} is {state.value}, not REVIEW_REQUIRED; nothing was changed")
        self.job_id = job_id
        self.state = state


class ReviewInputInvalid(errors.PermanentError):
    """What the reviewer gave is unusable as is (the message says why); nothing changed."""


class CorrectionInvalid(ReviewInputInvalid):
    """The corrected result is not an `invoice.v1` document; `locations` say where and why."""

    def __init__(self, *, locations: Sequence[str]) -> None:
        listed = "; ".join(locations[:CORRECTION_LOCATIONS_MAX])
        more = len(locations) - CORRECTION_LOCATIONS_MAX
        if more > 0:
            listed += f"; and {more} more"
        super().__init__(f"the correction is not a valid {invoice.SCHEMA_NAME} document: {listed}")
        self.locations = tuple(locations)


@dataclasses.dataclass(frozen=True)
class SignOff:
    """Who decides and why: both required, trimmed, bounded. Build it with `SignOff.of()`."""

    reviewer: str
    reason: str

    @classmethod
    def of(cls, *, reviewer: str, reason: str) -> SignOff:
        """The trimmed sign-off, or `ReviewInputInvalid` naming what is wrong with it."""
        reviewer, reason = reviewer.strip(), reason.strip()
        for what, value, limit, allowed in (
            ("reviewer", reviewer, REVIEWER_MAX_CHARS, frozenset[str]()),
            ("reason", reason, REASON_MAX_CHARS, _REASON_CONTROLS_ALLOWED),
        ):
            if not value:
                raise ReviewInputInvalid(f"a {what} is required")
            if len(value) > limit:
                raise ReviewInputInvalid(f"the {what} is {len(value)} characters long; at most {limit} are allowed")
            if any(unicodedata.category(c) == "Cc" and c not in allowed for c in value):
                raise ReviewInputInvalid(f"the {what} contains control characters")
            if storable.unstorable_reason(value) is not None:  # a lone surrogate: not valid UTF-8
                raise ReviewInputInvalid(f"the {what} contains a lone surrogate, which is not valid UTF-8")
        return cls(reviewer=reviewer, reason=reason)


@dataclasses.dataclass(frozen=True)
class ReviewDecision:
    """One row of `review_decisions`: who moved a job out of REVIEW_REQUIRED, how and why."""

    id: int
    job_id: ids.JobId
    decision: Decision
    reviewer: str
    reason: str
    decided_at: dt.datetime
    previous_result: dict[str, Any] | None
    """For a correction: the result it replaced (None when the job had none); else None."""
    previous_validation: dict[str, Any] | None
    """For a correction: the stored verdict it replaced, as stored; else None."""
    corrected_result: dict[str, Any] | None
    """For a correction: the reviewer's result, now the job's result; else None."""
    corrected_verdict: validation.Verdict | None
    """For a correction: the policy's verdict on the reviewer's result (reported, not enforced); else None."""

    @property
    def state(self) -> states.JobState:
        """The state the decision moved the job to."""
        return self.decision.target


@dataclasses.dataclass(frozen=True)
class QueuedJob:
    """One line of the review queue."""

    id: ids.JobId
    tenant: ids.TenantName
    batch_namespace: str
    batch_name: str
    document_key: str
    validation_policy: str
    failed_checks: tuple[str, ...]
    """The ids of the checks its stored verdict failed, in the policy's order (repeats included)."""
    waiting_since: dt.datetime
    """When it entered REVIEW_REQUIRED (nothing else touches a job waiting there)."""
    waiting_age_s: float
    """Seconds it has waited, by the database clock."""


@dataclasses.dataclass(frozen=True)
class QueuePage:
    jobs: tuple[QueuedJob, ...]
    next_after: ids.JobId | None
    """The `after` of the next page; None when this page is the last."""


@dataclasses.dataclass(frozen=True)
class ReviewCase:
    """Everything a reviewer decides on, except the document text."""

    job: jobs.JobDetail
    result: results.JobResult | None
    """The stored result and its verdict (the corrected one after a correction); None if there is none."""
    decisions: tuple[ReviewDecision, ...]
    """The decisions so far, oldest first: none while the job waits, at most one after (0003 checks it)."""


# Input ----------------------------------------------------------------------------------------


def parse_correction(corrected: dict[str, Any]) -> invoice.Invoice:
    """The corrected result as an `invoice.Invoice`, or `CorrectionInvalid` naming every schema
    error, or the first value PostgreSQL could not store (checked first: the schema would accept
    a NUL in a name, and a key it forbids is still named)."""
    unstorable = storable.unstorable_reason(corrected, where="correction")
    if unstorable is not None:
        raise CorrectionInvalid(locations=[unstorable[:500]])
    try:
        return invoice.Invoice.model_validate(corrected)
    except pydantic.ValidationError as exc:
        problems = exc.errors(include_url=False, include_input=False, include_context=False)
        raise CorrectionInvalid(
            locations=[f"{_location(p['loc'])}: {p['msg']} ({p['type']})" for p in problems]
        ) from None


def _location(loc: Sequence[int | str]) -> str:
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            name = part if len(part) <= _NAME_MAX else part[:_NAME_MAX] + "..."
            path += f".{name}" if path else name
    return path or "(document)"


# Decisions ------------------------------------------------------------------------------------


async def approve(
        conn: asyncpg.Connection,
        *,
        job_id: ids.JobId,
        reviewer: str,
        reason: str,
) -> ReviewDecision:
    """REVIEW_REQUIRED -> SUCCEEDED with the stored result, in one transaction with its audit row.

    Only a result that is a valid `invoice.v1` document can be approved: a job that came to
    review because the model's output was unusable (its raw output is kept) needs `correct`."""
    sign_off = SignOff.of(reviewer=reviewer, reason=reason)
    async with conn.transaction():
        await _leave_review(conn, job_id=job_id, approve=True, note=sign_off.reason)
        stored = await results.get_for_approval(conn, job_id=job_id)
        try:
            invoice.Invoice.model_validate(stored)
        except pydantic.ValidationError:
            raise ReviewInputInvalid(
                f"job {job_id} has no valid {invoice.SCHEMA_NAME} result to approve (the model's output was "
                "unusable; its raw output is kept); supply one with `lading review correct`; nothing was changed"
            ) from None
        return await _record(conn, job_id=job_id, decision=Decision.APPROVED, sign_off=sign_off)


async def correct(
        conn: asyncpg.Connection,
        *,
        job_id: ids.JobId,
        reviewer: str,
        reason: str,
        corrected: dict[str, Any],
) -> ReviewDecision:
    """
    REVIEW_REQUIRED -> SUCCEEDED with the reviewer's result (normalised as `invoice.v1` JSON)
    replacing the stored one, in one transaction with its audit row. The job's policy judges
    the correction against the document text; its verdict is in `corrected_verdict`, stored
    with the result, and does not stop the decision.
    """
    sign_off = SignOff.of(reviewer=reviewer, reason=reason)
    document = parse_correction(corrected).to_json()
    async with conn.transaction():
        await _leave_review(conn, job_id=job_id, approve=True, note=sign_off.reason)
        job = await jobs.get_for_correction(conn, job_id=job_id)
        if job is None:  # a job row without its document: acceptance writes both at once
            raise ReviewInputInvalid(f"job {job_id} has no document to check the correction against")
        if job.schema != invoice.SCHEMA_NAME:
            raise ReviewInputInvalid(
                f"job {job_id} extracts {job.schema}; corrections can only be {invoice.SCHEMA_NAME} documents"
            )
        verdict = validation.validate(
            document, source_text=job.text, policy=job.validation_policy,
            default_currency=await _default_currency(conn, job_id=job_id),
        )
        replaced = await results.replace_corrected(
            conn, job_id=job_id, result=document, validation=verdict.to_json()
        )
        assert replaced is not None, "the job exists: its row is locked by this transaction"
        return await _record(
            conn,
            job_id=job_id,
            decision=Decision.CORRECTED,
            sign_off=sign_off,
            previous_result=replaced.previous_result,
            previous_validation=replaced.previous_validation,
            corrected_result=document,
            corrected_verdict=verdict,
        )


async def _default_currency(conn: asyncpg.Connection, *, job_id: ids.JobId) -> str | None:
    """The default currency of the job's pool, as the worker that judged the job used it."""
    detail = await jobs.get_job(conn, job_id=job_id)
    pool = None if detail is None else await registry.get_pool(conn, name=detail.pool)
    return None if pool is None else specs.stored_default_currency(pool.spec)


async def reject(
        conn: asyncpg.Connection,
        *,
        job_id: ids.JobId,
        reviewer: str,
        reason: str,
) -> ReviewDecision:
    """REVIEW_REQUIRED -> FAILED_TERMINAL (REJECTED_BY_REVIEWER), in one transaction with its audit row."""
    sign_off = SignOff.of(reviewer=reviewer, reason=reason)
    async with conn.transaction():
        note = f"rejected by {sign_off.reviewer}: {sign_off.reason}"
        await _leave_review(conn, job_id=job_id, approve=False, note=note)
        return await _record(conn, job_id=job_id, decision=Decision.REJECTED, sign_off=sign_off)


async def _leave_review(conn: asyncpg.Connection, *, job_id: ids.JobId, approve: bool, note: str) -> None:
    """The guarded state change; raises (rolling the caller's transaction back) when it changed nothing."""
    if await jobs.review_decide(conn, job_id=job_id, approve=approve, note=note):
        return
    row = await jobs.get(conn, job_id=job_id)
    if row is None:
        raise JobNotFound(job_id=job_id)
    raise NotAwaitingReview(job_id=job_id, state=states.JobState(row["state"]))


async def _record(
        conn: asyncpg.Connection,
        *,
        job_id: ids.JobId,
        decision: Decision,
        sign_off: SignOff,
        previous_result: dict[str, Any] | None = None,
        previous_validation: dict[str, Any] | None = None,
        corrected_result: dict[str, Any] | None = None,
        corrected_verdict: validation.Verdict | None = None,
) -> ReviewDecision:
    recorded = await review_decisions.insert(
        conn,
        job_id=job_id,
        decision=decision.value,
        reviewer=sign_off.reviewer,
        reason=sign_off.reason,
        previous_result=previous_result,
        previous_validation=previous_validation,
        corrected_result=corrected_result,
        corrected_validation=None if corrected_verdict is None else corrected_verdict.to_json(),
    )
    return ReviewDecision(
        id=recorded.id,
        job_id=job_id,
        decision=decision,
        reviewer=sign_off.reviewer,
        reason=sign_off.reason,
        decided_at=recorded.decided_at,
        previous_result=previous_result,
        previous_validation=previous_validation,
        corrected_result=corrected_result,
        corrected_verdict=corrected_verdict,
    )


# Reading --------------------------------------------------------------------------------------


async def list_queue(
        conn: asyncpg.Connection,
        *,
        tenant: ids.TenantName | None = None,
        limit: int = QUEUE_LIMIT_DEFAULT,
        after: ids.JobId | None = None,
) -> QueuePage:
    """One page of the jobs waiting for a reviewer, in id order, after job `after` (None: from the start)."""
    if not 1 <= limit <= QUEUE_LIMIT_MAX:
        raise ValueError(f"limit must be 1 to {QUEUE_LIMIT_MAX}, not {limit}")
    rows = await jobs.review_queue_page(conn, after=after, limit=limit + 1, tenant=tenant)
    page = tuple(
        QueuedJob(
            id=ids.JobId(r["id"]),
            tenant=ids.TenantName(r["tenant"]),
            batch_namespace=r["batch_namespace"],
            batch_name=r["batch_name"],
            document_key=r["document_key"],
            validation_policy=r["validation_policy"],
            failed_checks=tuple(str(check) for check in r["failed_checks"]),
            waiting_since=r["waiting_since"],
            waiting_age_s=max(r["waiting_age_s"], 0.0),
        )
        for r in rows[:limit]
    )
    return QueuePage(jobs=page, next_after=page[-1].id if len(rows) > limit else None)


async def show(conn: asyncpg.Connection, *, job_id: ids.JobId) -> ReviewCase:
    """
    The job (in any state), its stored result and verdict, and the decisions about it, read in
    one snapshot (the caller's transaction, or a read-only one of its own). `JobNotFound` if none.
    """
    if conn.is_in_transaction():
        return await _case(conn, job_id=job_id)
    async with conn.transaction(isolation="repeatable_read", readonly=True):
        return await _case(conn, job_id=job_id)


async def _case(conn: asyncpg.Connection, *, job_id: ids.JobId) -> ReviewCase:
    job = await jobs.get_job(conn, job_id=job_id)
    if job is None:
        raise JobNotFound(job_id=job_id)
    rows = await review_decisions.list_of_job(conn, job_id=job_id)
    return ReviewCase(
        job=job,
        result=await results.result_of(conn, job_id=job_id),
        decisions=tuple(_decision(r) for r in rows),
    )


def _decision(r: asyncpg.Record) -> ReviewDecision:
    return ReviewDecision(
        id=r["id"],
        job_id=ids.JobId(r["job_id"]),
        decision=Decision(r["decision"]),
        reviewer=r["reviewer"],
        reason=r["reason"],
        decided_at=r["decided_at"],
        previous_result=r["previous_result"],
        previous_validation=r["previous_validation"],
        corrected_result=r["corrected_result"],
        corrected_verdict=_verdict(r["corrected_validation"]),
    )


def _verdict(stored: Any) -> validation.Verdict | None:
    """A verdict stored by `Verdict.to_json()` (by `correct`, so in that shape), or None."""
    if not isinstance(stored, dict):
        return None
    failed = tuple(
        validation.FailedCheck.from_json(c)
        for c in stored.get("failed_checks", ())
        if isinstance(c, dict)
    )
    return validation.Verdict(policy=str(stored.get("policy")), passed=bool(stored.get("passed")), failed=failed)
