"""The batch phase rule (`lading.batch_phase`) the operator's status and the API's share."""

from __future__ import annotations

import pytest

from lading import batch_phase
from lading.jobs.states import JobState

S = JobState


@pytest.mark.parametrize(("counts", "total", "suspended", "phase", "progressing", "complete"), [
    ({}, 0, False, "Completed", "Settled", "Completed"),
    ({S.SUCCEEDED: 2, S.FAILED_TERMINAL: 1}, 3, False, "Completed", "Settled", "Completed"),
    ({S.REVIEW_REQUIRED: 1, S.CANCELLED: 1}, 2, False, "Completed", "Settled", "Completed"),
    ({S.FAILED_TERMINAL: 1, S.CANCELLED: 2}, 3, False, "Failed", "Settled", "Failed"),
    ({S.FAILED_TERMINAL: 1, S.CANCELLED: 2}, 3, True, "Failed", "Settled", "Failed"),
    ({S.READY: 1, S.SUCCEEDED: 1}, 2, True, "Suspended", "Suspended", "JobsRemaining"),
    ({S.RUNNING: 1, S.RETRY_SCHEDULED: 1}, 2, False, "Running", "JobsRemaining", "JobsRemaining"),
    ({S.SUCCEEDED: 1}, 2, False, "Running", "JobsRemaining", "JobsRemaining"),  # a job not counted yet
])  # fmt: skip
def test_the_phase_follows_the_job_counts(
        counts: dict[JobState, int], total: int, suspended: bool, phase: str, progressing: str, complete: str,
) -> None:
    found = batch_phase.phase_of(counts, total=total, suspended=suspended)
    assert (found.phase, found.progressing_reason, found.complete_reason) == (phase, progressing, complete)
    assert found.failed == (phase == "Failed")
    assert found.good == counts.get(S.SUCCEEDED, 0) + counts.get(S.REVIEW_REQUIRED, 0)


@pytest.mark.parametrize(("error_class", "reason"), [
    ("DEADLINE_EXCEEDED", "DeadlineExceeded"), ("InvalidOutput", "InvalidOutput"), ("", "Failed"),
    ("provider-error", "providererror"), ("9lives", "Failed"),
])  # fmt: skip
def test_an_error_class_becomes_a_camel_case_reason(error_class: str, reason: str) -> None:
    assert batch_phase.failure_reason(error_class) == reason
