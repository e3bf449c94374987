"""
A batch's status as the intake reports it: the fields and the phase rules of the ExtractionBatch
custom resource's `.status` (the operator's `lading_operator.batches.Reconciler.status_of`), computed
from the same reads (`lading.db.batches.get_observed`). Pure: the caller reads, this shapes.

    phase      lading.batch_phase.phase_of: Completed, Failed, Suspended or Running
    conditions Ready, Stalled (kstatus), Admitted, Progressing, Complete, Failed, Delivered
    queuePosition, etaSeconds   while work is left (`lading.db.queue.position`, the operator's read too)

The phase and its reasons are `lading.batch_phase`'s, the one rule (tests/integration/api checks
the fields a client reads).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from lading import batch_phase
from lading.db import api_views, batches, jobs, queue
from lading.jobs.states import JobState


def rfc3339(moment: dt.datetime | None) -> str | None:
    return None if moment is None else moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def reason_of(error_class: str) -> str:
    """An error class (DEADLINE_EXCEEDED, InvalidOutput) as a CamelCase reason, as the operator writes it."""
    return batch_phase.failure_reason(error_class)


def view(
        batch: api_views.Batch,
        current: batches.ObservedBatch,
        *,
        delivered: int | None,
        failures: Sequence[jobs.Failure],
        where: queue.QueuePosition | None,
) -> dict[str, Any]:
    """`where` is the batch's queue position, read while it is not settled (None once it is)."""
    c = current.counts
    found = batch_phase.phase_of(c, total=current.total, suspended=current.suspended)
    settled, good, phase, failed = found.settled, found.good, found.phase, found.failed
    progressing, complete = found.progressing_reason, found.complete_reason
    summary = (f"{c[JobState.SUCCEEDED]} succeeded, {c[JobState.REVIEW_REQUIRED]} awaiting review, "
               f"{c[JobState.FAILED_TERMINAL]} failed, {c[JobState.CANCELLED]} cancelled of {current.total}")
    delivery = None
    if delivered is not None:
        done = delivered >= good and settled
        delivery = _condition("Delivered", done, "AllDelivered" if done else "DeliveriesPending",
                              f"{delivered} of {good} results delivered")
    # kstatus, as the custom resource: Ready once it did what it is for (completed, and delivered when it
    # has an endpoint); Stalled when only a person can move it on (it failed).
    if failed:
        ready, ready_message = "Failed", summary
    elif not settled:
        ready, ready_message = progressing, ""
    elif delivery is not None and delivery["status"] != "True":
        ready, ready_message = delivery["reason"], delivery["message"]
    else:
        ready, ready_message = (delivery["reason"] if delivery is not None else "Completed"), summary
    conditions = [
        _condition("Ready", ready in ("Completed", "AllDelivered"), ready, ready_message),
        _condition("Stalled", failed, "Failed" if failed else "NotStalled", summary if failed else ""),
        _condition("Admitted", True, "Admitted", f"batch {current.batch_id} of tenant {batch.tenant}"),
        _condition("Progressing", not settled and not current.suspended, progressing),
        # A failed batch is not Complete: waiting for Complete waits for success only.
        _condition("Complete", settled and not failed, complete),
        _condition("Failed", failed, complete, summary if failed else ""),
    ]
    if delivery is not None:
        conditions.append(delivery)
    return {
        "namespace": batch.namespace,
        "name": batch.name,
        "phase": phase,
        "batchId": str(current.batch_id),
        "tenant": batch.tenant,
        "total": current.total,
        "ready": c[JobState.READY],
        "running": c[JobState.RUNNING],
        "retryScheduled": c[JobState.RETRY_SCHEDULED],
        "reviewRequired": c[JobState.REVIEW_REQUIRED],
        "succeeded": c[JobState.SUCCEEDED],
        "failed": c[JobState.FAILED_TERMINAL],
        "cancelled": c[JobState.CANCELLED],
        "delivered": delivered,
        "oldestEligibleAgeSeconds": int(current.oldest_eligible_s or 0),
        "queuePosition": None if settled or where is None else where.position,
        "etaSeconds": None if settled or where is None else where.eta_s,
        "admittedAt": rfc3339(current.admitted_at),
        "completedAt": rfc3339(current.last_finished_at) if settled else None,
        "recentFailures": [
            {"documentKey": f.document_key[:256], "reason": reason_of(f.error_class), "message": f.error[:512],
             "at": rfc3339(f.at)}
            for f in failures
        ],
        "conditions": conditions,
    }


def _condition(kind: str, value: bool, reason: str, message: str = "") -> dict[str, str]:
    return {"type": kind, "status": "True" if value else "False", "reason": reason, "message": message}
