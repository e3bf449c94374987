"""The executor on output PostgreSQL cannot store: invalid output with the raw text kept escaped, never a crash."""

from __future__ import annotations

import dataclasses
import time

import pytest
from lading_worker import executing

from lading import storable
from lading.jobs.states import JobState
from lading.providers import base
from lading.settings import AttemptSettings
from tests.support import providers
from tests.unit.worker.test_executor_decisions import NOW, VALID, _executor, _job


def _running(outcome: base.Outcome) -> executing.Executor:
    return executing.Executor(
        provider=providers.ScriptedProvider(providers.always(outcome)),
        settings=AttemptSettings(timeout_s=10, backoff_base_s=2, backoff_cap_s=60),
        rand=lambda: 0.5,
    )


@pytest.mark.parametrize("raw", ['{"total": "1\ud800"', '{"total": "1\x00"', "\udfff\x00"])
def test_invalid_output_with_a_lone_surrogate_or_nul_is_digested_not_a_crash(raw: str) -> None:
    outcome = base.Outcome.failed(
        base.OutcomeClass.INVALID_OUTPUT, error_class="MALFORMED_OUTPUT", error="not JSON", raw_output=raw
    )
    finish = _executor().decide(_job(), outcome, now=NOW, latency_ms=5)
    assert finish.to is JobState.RETRY_SCHEDULED
    assert finish.output_sha256 is not None and len(finish.output_sha256) == 64


async def test_a_result_holding_nul_is_invalid_output_then_review_with_the_raw_output_escaped() -> None:
    poisoned = {**VALID, "supplier": {"name": "Supp\x00lier", "vat_id": None, "iban": None}}
    executor = _running(base.Outcome.ok(poisoned, tokens_in=10, tokens_out=20))

    first = await executor.run(_job(), claimed_mono=time.monotonic())
    assert (first.to, first.outcome, first.error_class) == (
        JobState.RETRY_SCHEDULED, "invalid-output", base.UNSTORABLE_OUTPUT
    )  # fmt: skip
    assert first.error is not None and "result.supplier.name: contains U+0000" in first.error
    assert (first.usage.tokens_in, first.usage.tokens_out) == (10, 20)

    # The same output again (temperature 0): a reviewer gets it, escaped, and it can be stored.
    again = dataclasses.replace(
        _job(attempt=2), previous_error_class=first.error_class, previous_output_sha256=first.output_sha256
    )
    second = await executor.run(again, claimed_mono=time.monotonic())
    assert (second.to, second.error_class) == (JobState.REVIEW_REQUIRED, "REPEATED_INVALID_OUTPUT")
    assert second.result is not None and "Supp\\u0000lier" in second.result["raw_output"]
    for value in (second.result, second.validation, second.error):
        assert storable.unstorable_reason(value) is None


async def test_an_absurd_token_count_is_not_recorded_and_the_result_stands(caplog: pytest.LogCaptureFixture) -> None:
    executor = _running(base.Outcome.ok(VALID, tokens_in=2**40, tokens_out=2**63))
    finish = await executor.run(_job(), claimed_mono=time.monotonic())
    assert finish.to is JobState.SUCCEEDED
    assert (finish.usage.tokens_in, finish.usage.tokens_out) == (None, None)
    assert "tokens_in is 1099511627776, past the 2147483647 tokens" in caplog.text

