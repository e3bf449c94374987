"""
What an operator does with deliveries no machine will move again (`lading deliveries`):

    FAILED_TERMINAL | UNKNOWN_EXTERNAL ──redeliver──▶ PENDING    due now, fresh retry budget,
                                                                 the same delivery id (webhook-id)
    UNKNOWN_EXTERNAL ──────────────────resolve────▶ DELIVERED   the receiver has it (reconciled)

An UNKNOWN_EXTERNAL delivery was sent at least once without an answer, so the receiver may have
applied it: look it up there by its delivery id (the `webhook-id` header; a receiver that
dedups by it, like `lading receiver`, applies a redelivery at most once). Found: `resolve`.
Not found: `redeliver`. Either way who and why are required and recorded. The model is never
called again: a redelivery sends the stored result.

    errors.PermanentError
    ├── DeliveryNotFound        no delivery has this id
    ├── NotReconcilable         the delivery is not in a state the action applies to; names it
    ├── ResultDeleted           redeliver: retention deleted the job's result, nothing to send
    └── SignOffInvalid          operator or reason missing, too long, or with control characters
"""

from __future__ import annotations

import datetime as dt

import asyncpg

from lading import errors, reviewing
from lading.db import deliveries, jobs
from lading.delivery.states import DeliveryState
from lading.ids import DeliveryId, JobId


class DeliveryNotFound(errors.PermanentError):
    def __init__(self, *, delivery_id: DeliveryId) -> None:
        super().__init__(f"delivery {delivery_id} not found")
        self.delivery_id = delivery_id


class NotReconcilable(errors.PermanentError):
    """The delivery is not in a state the action applies to; nothing changed."""

    def __init__(self, *, delivery_id: DeliveryId, state: DeliveryState, action: str, allowed: str) -> None:
        super().__init__(f"delivery {delivery_id} is {state.value}; {action} applies to {allowed} only; "
                         "nothing was changed")  # fmt: skip
        self.delivery_id = delivery_id
        self.state = state


class ResultDeleted(errors.PermanentError):
    """Retention (TenantQuota spec.retention.resultsDays) deleted the job's result: there is nothing
    to send again. The delivery and the job's audit trail are unchanged."""

    def __init__(self, *, delivery_id: DeliveryId, job_id: JobId, deleted_at: dt.datetime) -> None:
        super().__init__(f"delivery {delivery_id}: the result of job {job_id} was deleted by retention at "
                         f"{deleted_at.isoformat()}; there is nothing to redeliver; nothing was changed")
        self.delivery_id = delivery_id
        self.job_id = job_id


class SignOffInvalid(errors.PermanentError):
    """Who or why is unusable as given (the message says why); nothing changed."""


def sign_off(*, operator: str, reason: str) -> reviewing.SignOff:
    """Who and why, trimmed and bounded by the same rules as a reviewer's sign-off."""
    try:
        return reviewing.SignOff.of(reviewer=operator, reason=reason)
    except reviewing.ReviewInputInvalid as exc:
        message = str(exc).replace("a reviewer", "an operator").replace("the reviewer", "the operator")
        raise SignOffInvalid(message) from None


async def redeliver(conn: asyncpg.Connection, *, delivery_id: DeliveryId, operator: str, reason: str) -> None:
    """FAILED_TERMINAL | UNKNOWN_EXTERNAL -> PENDING with a fresh budget; who and why kept as its last note."""
    who = sign_off(operator=operator, reason=reason)
    note = f"redelivery requested by {who.reviewer}: {who.reason}"
    if await deliveries.redeliver(conn, delivery_id=delivery_id, note=note):
        return
    found = await deliveries.get(conn, delivery_id=delivery_id)
    if found is not None and found.state in (DeliveryState.FAILED_TERMINAL, DeliveryState.UNKNOWN_EXTERNAL):
        job = await jobs.get_job(conn, job_id=found.job_id)
        if job is not None and job.result_deleted_at is not None:
            raise ResultDeleted(delivery_id=delivery_id, job_id=found.job_id, deleted_at=job.result_deleted_at)
    await _refuse(conn, delivery_id, "redeliver", "FAILED_TERMINAL and UNKNOWN_EXTERNAL")


async def resolve(conn: asyncpg.Connection, *, delivery_id: DeliveryId, operator: str, reason: str) -> None:
    """UNKNOWN_EXTERNAL -> DELIVERED, reconciled: who and why recorded on the delivery."""
    who = sign_off(operator=operator, reason=reason)
    if await deliveries.resolve(conn, delivery_id=delivery_id, resolved_by=who.reviewer, reason=who.reason):
        return
    await _refuse(conn, delivery_id, "resolve", "UNKNOWN_EXTERNAL")


async def _refuse(conn: asyncpg.Connection, delivery_id: DeliveryId, action: str, allowed: str) -> None:
    found = await deliveries.get(conn, delivery_id=delivery_id)
    if found is None:
        raise DeliveryNotFound(delivery_id=delivery_id)
    raise NotReconcilable(delivery_id=delivery_id, state=found.state, action=action, allowed=allowed)
