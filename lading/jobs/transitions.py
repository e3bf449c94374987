"""
How an attempt ends: a closed set of constructors for the finishing transitions.

The executor builds one `Finish` per attempt and hands it to the committer, which
applies many at once with `lading.db.jobs.finish_many` (one compare-and-set statement).
No code writes `state = ...` by hand; the SQL guards come from `states.LEGAL`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from lading import errors
from lading.ids import Fence, JobId
from lading.jobs.states import JobState, is_legal

FINISHING = frozenset(
    {JobState.SUCCEEDED, JobState.REVIEW_REQUIRED, JobState.RETRY_SCHEDULED, JobState.FAILED_TERMINAL}
)
"""Where an attempt can end (cancellation is not an attempt's outcome: it comes from outside)."""


@dataclasses.dataclass(frozen=True)
class Usage:
    """What an attempt cost, recorded on its attempt row."""

    tokens_in: int | None = None
    tokens_out: int | None = None
    latency_ms: int | None = None


NO_USAGE = Usage()


@dataclasses.dataclass(frozen=True)
class Finish:
    job_id: JobId
    fence: Fence
    to: JobState
    outcome: str
    """The attempt's outcome class (job_attempts.outcome), e.g. `ok`, `transient`."""
    error_class: str | None = None
    error: str | None = None
    retry_in_s: float | None = None
    usage: Usage = NO_USAGE
    result: dict[str, Any] | None = None
    validation: dict[str, Any] | None = None
    output_sha256: str | None = None
    """Digest of the attempt's invalid output, when there was one."""
    give_back_attempt: bool = False
    """The endpoint could not serve this attempt at all (key refused, quota spent): a retry does
    not count it against the job's budget."""
    pause_pool_s: float | None = None
    """Pause the job's pool this long after committing: its endpoint cannot serve anyone now."""

    def __post_init__(self) -> None:
        if self.to not in FINISHING or not is_legal(JobState.RUNNING, self.to):
            raise errors.IllegalTransition(f"an attempt cannot finish in {self.to.value}")




def succeed(
        job_id: JobId,
        fence: Fence,
        *,
        result: dict[str, Any],
        validation: dict[str, Any],
        usage: Usage = NO_USAGE,
) -> Finish:
    return Finish(
        job_id, fence, JobState.SUCCEEDED, "ok", result=result, validation=validation, usage=usage
    )


def needs_review(
        job_id: JobId,
        fence: Fence,
        *,
        result: dict[str, Any],
        validation: dict[str, Any],
        error_class: str = "VALIDATION_FAILED",
        outcome: str = "validation-failed",
        error: str | None = None,
        output_sha256: str | None = None,
        usage: Usage = NO_USAGE,
) -> Finish:
    return Finish(
        job_id,
        fence,
        JobState.REVIEW_REQUIRED,
        outcome,
        error_class=error_class,
        error=error,
        result=result,
        validation=validation,
        output_sha256=output_sha256,
        usage=usage,
    )


def retry(
        job_id: JobId,
        fence: Fence,
        *,
        outcome: str,
        error_class: str,
        error: str,
        retry_in_s: float,
        output_sha256: str | None = None,
        pause_pool_s: float | None = None,
        usage: Usage = NO_USAGE,
) -> Finish:
    return Finish(
        job_id,
        fence,
        JobState.RETRY_SCHEDULED,
        outcome,
        error_class=error_class,
        error=error,
        retry_in_s=retry_in_s,
        output_sha256=output_sha256,
        give_back_attempt=pause_pool_s is not None,
        pause_pool_s=pause_pool_s,
        usage=usage,
    )


def fail(
        job_id: JobId,
        fence: Fence,
        *,
        outcome: str,
        error_class: str,
        error: str,
        usage: Usage = NO_USAGE,
) -> Finish:
    return Finish(
        job_id, fence, JobState.FAILED_TERMINAL, outcome, error_class=error_class, error=error, usage=usage
    )
