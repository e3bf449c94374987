"""
How an attempt ends: a closed set of constructors for the finishing transitions.

The executor builds one `Finish` per attempt and hands it to the committer, which
applies many at once with `lading.db.jobs.finish_many` (one compare-and-set statement).
No code writes `state = ...` by hand; the SQL guards come from `states.LEGAL`.

A Finish PostgreSQL refuses to store (a NUL or a lone surrogate in its text or JSON, an
integer past bigint: `lading.storable`) is never retried as is: the committer replaces it
with `unstorable(...)`, FAILED_TERMINAL with error class UNSTORABLE, which names the refused
field and keeps none of its values. Values are meant to be refused earlier, where they enter
(model output: `lading.providers.base.checked`); this is the last line.
"""

from __future__ import annotations

import dataclasses
import decimal
import re
from typing import Any, Final

from lading import errors, storable
from lading.ids import Fence, JobId
from lading.jobs.states import JobState, is_legal

FINISHING = frozenset(
    {JobState.SUCCEEDED, JobState.REVIEW_REQUIRED, JobState.RETRY_SCHEDULED, JobState.FAILED_TERMINAL}
)
"""Where an attempt can end (cancellation is not an attempt's outcome: it comes from outside)."""


USAGE_TOKENS_MAX: Final = 2**31 - 1
"""The largest token count one model call can plausibly report. The largest context windows are
about 10⁷ tokens, so a count past this is a provider bug, not usage; and with every count below
it, a tenant's daily sum (bigint) cannot overflow however many calls it makes."""

_SHOWN_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,39}(\[[0-9]{1,9}\])*")
"""A place in a refused value that may be named in an error: a schema-like key, list indexes."""


@dataclasses.dataclass(frozen=True)
class Usage:
    """What an attempt cost, recorded on its attempt row (job_attempts.tokens_* are bigint)."""

    tokens_in: int | None = None
    tokens_out: int | None = None
    latency_ms: int | None = None
    cost: decimal.Decimal | None = None
    """What the attempt cost at its pool's prices (`lading.costing`), exact; None: the pool is unpriced."""
    currency: str | None = None
    """ISO 4217 code of `cost`; set exactly when `cost` is."""


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
    """The endpoint could not serve this attempt at all (key refused, quota spent, rate limited,
    overloaded): a retry does not count it against the job's budget."""
    pause_pool_s: float | None = None
    """Pause the job's pool this long after committing: its endpoint cannot serve anyone now."""
    reused_from: JobId | None = None
    """The attempt took this job's accepted result instead of calling the model (`reused`)."""

    def __post_init__(self) -> None:
        if self.to not in FINISHING or not is_legal(JobState.RUNNING, self.to):
            raise errors.IllegalTransition(f"an attempt cannot finish in {self.to.value}")


def refusal(value: object, *, where: str) -> str | None:
    """Why `value` cannot be stored (`storable.unstorable_reason`), in words fit for an error
    message: the place is named by schema-like keys only (a key written by a model may echo the
    document; others show as `?`), the value never. None when it can be stored."""
    reason = storable.unstorable_reason(value, where=where)
    if reason is None:
        return None
    # The kinds of reason contain no ": ", the place before it only keys already found storable.
    place, _, kind = reason.rpartition(": ")
    shown = ".".join(part if _SHOWN_NAME.fullmatch(part) else "?" for part in place.split("."))
    return f"{shown[:200]}: {kind}"


def unstorable(finish: Finish, *, sqlstate: str | None = None) -> Finish:
    """What ends an attempt whose `finish` PostgreSQL refused to store (SQLSTATE class 22 or 54):
    FAILED_TERMINAL, error class UNSTORABLE, the error naming the refused field, and none of the
    finish's own values but the storable usage. Terminal because the same values would be refused
    again; the job's other attempts and the other jobs of its commit group are not affected."""
    fields: list[tuple[str, object]] = [
        ("result", finish.result),
        ("validation", finish.validation),
        ("error", finish.error),
        ("error_class", finish.error_class),
        ("output_sha256", finish.output_sha256),
        ("tokens_in", finish.usage.tokens_in),
        ("tokens_out", finish.usage.tokens_out),
        ("latency_ms", finish.usage.latency_ms),
    ]
    named = next((reason for name, value in fields if (reason := refusal(value, where=name)) is not None), None)
    code = f" (SQLSTATE {sqlstate})" if sqlstate else ""
    error = (
        f"the database refused to store this attempt's outcome{code}: {named}"
        if named is not None
        else f"the database refused to store this attempt's outcome{code}; no single field explains it"
    )
    return fail(
        finish.job_id,
        finish.fence,
        outcome="terminal",
        error_class=storable.UNSTORABLE,
        error=storable.escaped(error)[:1000],
        usage=Usage(
            tokens_in=_plausible(finish.usage.tokens_in),
            tokens_out=_plausible(finish.usage.tokens_out),
            latency_ms=_plausible(finish.usage.latency_ms),
            cost=finish.usage.cost,  # computed by the worker from validated prices: always storable
            currency=finish.usage.currency,
        ),
    )


def _plausible(count: int | None) -> int | None:
    """`count` when it is a plausible token count (or latency in ms: both fit 32 bits), else None."""
    return count if count is not None and 0 <= count <= USAGE_TOKENS_MAX else None


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
        give_back: bool = False,
        usage: Usage = NO_USAGE,
) -> Finish:
    """Another attempt in `retry_in_s`. The attempt is given back (recorded, not counted against
    the job's maxAttempts) with `give_back` or a pool pause: the pool, not the job, failed."""
    return Finish(
        job_id,
        fence,
        JobState.RETRY_SCHEDULED,
        outcome,
        error_class=error_class,
        error=error,
        retry_in_s=retry_in_s,
        output_sha256=output_sha256,
        give_back_attempt=give_back or pause_pool_s is not None,
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


REUSED: Final = "reused"
"""The outcome of an attempt that took an earlier accepted result (job_attempts.outcome)."""

DEFERRED: Final = "deferred"
"""The outcome of an attempt given back unstarted because a duplicate was being extracted."""

DUPLICATE_IN_FLIGHT: Final = "DUPLICATE_IN_FLIGHT"
"""The error class a job carries while it waits for its duplicate's outcome."""


def reused(
        job_id: JobId,
        fence: Fence,
        *,
        source: JobId,
        result: dict[str, Any],
        validation: dict[str, Any],
) -> Finish:
    """SUCCEEDED with the result and verdict of job `source`, taken without a model call (docs/reuse.md);
    applied by `lading.db.reuse.finish_reused_many`."""
    return Finish(
        job_id, fence, JobState.SUCCEEDED, REUSED, result=result, validation=validation, reused_from=source
    )


def deferred(job_id: JobId, fence: Fence, *, leader: JobId, retry_in_s: float) -> Finish:
    """Claimable again in `retry_in_s`, the attempt given back: job `leader` is extracting the same
    document, and this job takes its result if it is accepted (docs/reuse.md)."""
    return retry(
        job_id,
        fence,
        outcome=DEFERRED,
        error_class=DUPLICATE_IN_FLIGHT,
        error=f"waiting for job {leader}, which is extracting the same document",
        retry_in_s=retry_in_s,
        give_back=True,
    )
