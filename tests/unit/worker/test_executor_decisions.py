"""How the executor turns a provider outcome into exactly one transition."""

from __future__ import annotations

import dataclasses
import datetime as dt
import time

import pytest
from lading_worker import executing

from lading.db import jobs
from lading.ids import BatchId, Fence, JobId, PoolName
from lading.jobs.states import JobState
from lading.providers import base
from lading.settings import AttemptSettings
from tests.support import providers

NOW = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)
VALID = {
    "invoice_number": "INV-1",
    "issue_date": "2026-03-01",
    "due_date": None,
    "currency": "EUR",
    "supplier": {"name": "Supplier", "vat_id": None, "iban": None},
    "buyer": {"name": "Buyer", "vat_id": None},
    "lines": [
        {"description": "Widget", "quantity": "2", "unit_price": "5.00", "amount": "10.00", "tax_rate": "19"}
    ],
    "subtotal": "10.00",
    "tax_total": "1.90",
    "total": "11.90",
    "evidence": {
        "invoice_number": "INV-1",
        "lines[0].amount": "10,00",
        "subtotal": "10,00",
        "tax_total": "1,90",
        "total": "11,90",
    },
}
SOURCE = "Invoice INV-1\nWidget 2 x 5,00 = 10,00\nSubtotal 10,00\nVAT 1,90\nTotal 11,90\n"


def _job(*, attempt: int = 1, max_attempts: int = 5, deadline_in_s: float = 3600) -> jobs.ClaimedJob:
    return jobs.ClaimedJob(
        id=JobId(1), tenant="acme", batch_id=BatchId(1), document_key="k", attempt=attempt,
        max_attempts=max_attempts, fence=Fence(1), lease_until=NOW,
        deadline_at=NOW + dt.timedelta(seconds=deadline_in_s),
        schema="invoice.v1", validation_policy="invoice-strict-v1", pool=PoolName("p"), text=SOURCE, claimed_at=NOW,
    )  # fmt: skip


def _executor(**settings: float) -> executing.Executor:
    return executing.Executor(
        provider=providers.ScriptedProvider(providers.always(base.Outcome.ok({}))),
        settings=AttemptSettings(timeout_s=10, backoff_base_s=2, backoff_cap_s=60, **settings),  # type: ignore[arg-type]
        rand=lambda: 0.5,
    )


def test_a_result_that_passes_every_check_succeeds() -> None:
    finish = _executor().decide(_job(), base.Outcome.ok(VALID), now=NOW, latency_ms=5)
    assert finish.to is JobState.SUCCEEDED
    assert finish.validation is not None and finish.validation["passed"] is True


def test_a_result_failing_a_check_goes_to_review_with_the_failed_checks() -> None:
    wrong = {**VALID, "total": "12.90", "evidence": {**VALID["evidence"], "total": "12,90"}}  # type: ignore[dict-item]
    finish = _executor().decide(_job(), base.Outcome.ok(wrong), now=NOW, latency_ms=5)
    assert finish.to is JobState.REVIEW_REQUIRED
    assert finish.result == wrong
    assert finish.validation is not None
    assert {c["check"] for c in finish.validation["failed_checks"]} >= {"total_sum"}


def test_a_terminal_outcome_fails_the_job_at_once() -> None:
    outcome = base.Outcome.failed(base.OutcomeClass.TERMINAL, error_class="DOCUMENT_TOO_LARGE", error="too big")
    finish = _executor().decide(_job(), outcome, now=NOW, latency_ms=5)
    assert (finish.to, finish.error_class) == (JobState.FAILED_TERMINAL, "DOCUMENT_TOO_LARGE")
    assert finish.outcome == "terminal"


@pytest.mark.parametrize("kind", [base.OutcomeClass.TRANSIENT, base.OutcomeClass.TIMEOUT_AMBIGUOUS])
def test_retryable_outcomes_are_scheduled_with_backoff(kind: base.OutcomeClass) -> None:
    outcome = base.Outcome.failed(kind, error_class="X", error="y")
    finish = _executor().decide(_job(attempt=2), outcome, now=NOW, latency_ms=5)
    assert finish.to is JobState.RETRY_SCHEDULED
    assert finish.outcome == kind.value
    assert finish.retry_in_s == pytest.approx(0.5 * 2 * 2)  # full jitter: rand 0.5 x base 2 x 2^(attempt-1)


def test_retry_after_is_honoured_over_a_shorter_backoff() -> None:
    outcome = base.Outcome.failed(
        base.OutcomeClass.TRANSIENT, error_class="RateLimited", error="429", retry_after_s=42
    )
    finish = _executor().decide(_job(), outcome, now=NOW, latency_ms=5)
    assert finish.retry_in_s == pytest.approx(42)


def test_the_last_attempt_fails_instead_of_retrying() -> None:
    outcome = base.Outcome.failed(base.OutcomeClass.TRANSIENT, error_class="Overloaded", error="503")
    finish = _executor().decide(_job(attempt=5, max_attempts=5), outcome, now=NOW, latency_ms=5)
    assert (finish.to, finish.error_class) == (JobState.FAILED_TERMINAL, "ATTEMPTS_EXHAUSTED")
    assert finish.error is not None and "Overloaded" in finish.error


def test_no_retry_is_scheduled_that_could_not_finish_before_the_deadline() -> None:
    outcome = base.Outcome.failed(base.OutcomeClass.TRANSIENT, error_class="Overloaded", error="503")
    finish = _executor().decide(_job(deadline_in_s=5), outcome, now=NOW, latency_ms=5)
    assert (finish.to, finish.error_class) == (JobState.FAILED_TERMINAL, "DEADLINE_EXHAUSTED")


async def test_a_provider_that_hangs_is_cut_off_as_an_ambiguous_timeout() -> None:
    import asyncio

    provider = providers.ScriptedProvider(providers.always(base.Outcome.ok(VALID)), gate=asyncio.Event())
    executor = executing.Executor(provider=provider, settings=AttemptSettings(timeout_s=0.05), rand=lambda: 0.0)
    finish = await executor.run(_job(), claimed_mono=time.monotonic())
    assert (finish.to, finish.outcome, finish.error_class) == (
        JobState.RETRY_SCHEDULED, "timeout-ambiguous", "AttemptTimeout"
    )  # fmt: skip


async def test_a_provider_that_raises_is_a_transient_failure_not_a_crash() -> None:
    def boom(_: base.Document) -> base.Outcome:
        raise RuntimeError("bug")

    provider = providers.ScriptedProvider(boom)
    executor = executing.Executor(provider=provider, settings=AttemptSettings(), rand=lambda: 0.0)
    finish = await executor.run(_job(), claimed_mono=time.monotonic())
    assert (finish.to, finish.error_class) == (JobState.RETRY_SCHEDULED, "ProviderError")


def _invalid(error_class: str, raw: str) -> base.Outcome:
    return base.Outcome.failed(base.OutcomeClass.INVALID_OUTPUT, error_class=error_class, error="bad", raw_output=raw)


def test_invalid_output_is_retried_while_it_may_change_and_its_digest_recorded() -> None:
    finish = _executor().decide(_job(), _invalid("MALFORMED_OUTPUT", "{oops"), now=NOW, latency_ms=5)
    assert finish.to is JobState.RETRY_SCHEDULED
    assert finish.output_sha256 is not None and len(finish.output_sha256) == 64


@pytest.mark.parametrize("error_class", ["MALFORMED_OUTPUT", "OUTPUT_TRUNCATED", "SCHEMA_VIOLATION"])
def test_invalid_output_is_retried_at_once_without_backoff(error_class: str) -> None:
    # The provider answered: waiting would not change its next answer, only leave the pool idle.
    finish = _executor().decide(_job(attempt=3), _invalid(error_class, "{oops"), now=NOW, latency_ms=5)
    assert (finish.to, finish.outcome) == (JobState.RETRY_SCHEDULED, "invalid-output")
    assert finish.retry_in_s == 0.0


def test_invalid_output_still_waits_for_a_retry_after_the_provider_sent() -> None:
    outcome = dataclasses.replace(_invalid("MALFORMED_OUTPUT", "{oops"), retry_after_s=9)
    finish = _executor().decide(_job(), outcome, now=NOW, latency_ms=5)
    assert finish.retry_in_s == pytest.approx(9)


def test_the_same_invalid_output_twice_goes_to_review_with_the_raw_output() -> None:
    first = _executor().decide(_job(), _invalid("MALFORMED_OUTPUT", "{oops"), now=NOW, latency_ms=5)
    job = dataclasses.replace(_job(attempt=2), previous_error_class="MALFORMED_OUTPUT",
                              previous_output_sha256=first.output_sha256)
    finish = _executor().decide(job, _invalid("MALFORMED_OUTPUT", "{oops"), now=NOW, latency_ms=5)
    assert (finish.to, finish.error_class) == (JobState.REVIEW_REQUIRED, "REPEATED_INVALID_OUTPUT")
    assert finish.result == {"raw_output": "{oops"}
    assert finish.validation is not None and finish.validation["passed"] is False


def test_a_different_invalid_output_is_retried_again() -> None:
    job = dataclasses.replace(_job(attempt=2), previous_error_class="MALFORMED_OUTPUT", previous_output_sha256="0" * 64)
    finish = _executor().decide(job, _invalid("MALFORMED_OUTPUT", "{other"), now=NOW, latency_ms=5)
    assert finish.to is JobState.RETRY_SCHEDULED


def test_a_truncated_answer_gets_one_retry_only() -> None:
    job = dataclasses.replace(_job(attempt=2), previous_error_class="OUTPUT_TRUNCATED", previous_output_sha256="0" * 64)
    finish = _executor().decide(job, _invalid("OUTPUT_TRUNCATED", '{"invoice_number": "1'), now=NOW, latency_ms=5)
    assert (finish.to, finish.error_class) == (JobState.REVIEW_REQUIRED, "OUTPUT_TRUNCATED_AGAIN")


def test_invalid_output_on_the_last_attempt_goes_to_review_not_failure() -> None:
    finish = _executor().decide(
        _job(attempt=5, max_attempts=5), _invalid("SCHEMA_VIOLATION", '{"x": 1}'), now=NOW, latency_ms=5
    )
    assert (finish.to, finish.error_class) == (JobState.REVIEW_REQUIRED, "ATTEMPTS_EXHAUSTED")
    assert finish.result == {"raw_output": '{"x": 1}'}


@pytest.mark.parametrize("error_class", sorted(base.CONGESTED))
def test_congestion_on_the_last_attempt_gives_the_attempt_back_and_waits_for_the_cooldown(error_class: str) -> None:
    outcome = base.Outcome.failed(
        base.OutcomeClass.TRANSIENT, error_class=error_class, error="HTTP 429: rate limited", retry_after_s=7
    )
    finish = _executor().decide(_job(attempt=5, max_attempts=5), outcome, now=NOW, latency_ms=5)
    assert (finish.to, finish.error_class, finish.outcome) == (JobState.RETRY_SCHEDULED, error_class, "transient")
    assert finish.give_back_attempt  # recorded, not counted against maxAttempts
    assert finish.retry_in_s is not None and finish.retry_in_s >= 7


def test_congestion_without_retry_after_waits_the_default_cooldown() -> None:
    outcome = base.Outcome.failed(base.OutcomeClass.TRANSIENT, error_class=base.RATE_LIMITED, error="HTTP 429")
    finish = _executor().decide(_job(attempt=3, max_attempts=3), outcome, now=NOW, latency_ms=5)
    assert finish.to is JobState.RETRY_SCHEDULED and finish.give_back_attempt
    assert finish.retry_in_s is not None and finish.retry_in_s >= executing.RATE_LIMIT_COOLDOWN_DEFAULT_S


def test_congestion_is_bounded_only_by_the_deadline() -> None:
    outcome = base.Outcome.failed(
        base.OutcomeClass.TRANSIENT, error_class=base.RATE_LIMITED, error="HTTP 429", retry_after_s=120
    )
    finish = _executor().decide(_job(attempt=1, deadline_in_s=100), outcome, now=NOW, latency_ms=5)
    assert (finish.to, finish.error_class) == (JobState.FAILED_TERMINAL, "DEADLINE_EXHAUSTED")
    assert finish.error is not None and finish.error.startswith("RATE_LIMITED")


def test_a_plain_server_error_still_counts_against_the_attempts() -> None:
    outcome = base.Outcome.failed(
        base.OutcomeClass.TRANSIENT, error_class="SERVER_ERROR", error="HTTP 500", retry_after_s=1
    )
    finish = _executor().decide(_job(attempt=5, max_attempts=5), outcome, now=NOW, latency_ms=5)
    assert (finish.to, finish.error_class) == (JobState.FAILED_TERMINAL, "ATTEMPTS_EXHAUSTED")
