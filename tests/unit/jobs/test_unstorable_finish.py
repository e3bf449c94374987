"""The UNSTORABLE failure that replaces an attempt PostgreSQL refused: legal, storable, naming the field only."""

from __future__ import annotations

import pytest

from lading import storable
from lading.ids import Fence, JobId
from lading.jobs import states, transitions
from lading.jobs.states import JobState

JOB, FENCE = JobId(7), Fence(3)


def _stored_fields(finish: transitions.Finish) -> list[object]:
    return [finish.result, finish.validation, finish.error, finish.error_class, finish.output_sha256,
            finish.usage.tokens_in, finish.usage.tokens_out, finish.usage.latency_ms]  # fmt: skip


@pytest.mark.parametrize(
    ("refused", "named"),
    [
        (transitions.succeed(JOB, FENCE, result={"supplier": {"name": "Se\x00cret"}}, validation={}),
         "result.supplier.name: contains U+0000"),
        (transitions.needs_review(JOB, FENCE, result={}, validation={"failed_checks": [{"message": "Se\ud800cret"}]}),
         "validation.failed_checks[0].message: contains a lone surrogate U+D800"),
        (transitions.fail(JOB, FENCE, outcome="terminal", error_class="X", error="Se\x00cret"),
         "error: contains U+0000"),
        (transitions.succeed(JOB, FENCE, result={}, validation={}, usage=transitions.Usage(tokens_in=2**63)),
         "tokens_in: integer out of range"),
    ],
)  # fmt: skip
def test_the_failure_names_the_refused_field_never_its_value(refused: transitions.Finish, named: str) -> None:
    finish = transitions.unstorable(refused, sqlstate="22P05")
    assert (finish.job_id, finish.fence, finish.to) == (JOB, FENCE, JobState.FAILED_TERMINAL)
    assert (finish.outcome, finish.error_class) == ("terminal", storable.UNSTORABLE)
    assert finish.error is not None and named in finish.error and "(SQLSTATE 22P05)" in finish.error
    assert "Se" not in finish.error.replace("SQLSTATE", "")
    assert all(storable.unstorable_reason(value) is None for value in _stored_fields(finish))
    assert finish.result is None and finish.validation is None


def test_plausible_usage_is_kept_and_the_rest_dropped() -> None:
    usage = transitions.Usage(tokens_in=812, tokens_out=2**40, latency_ms=1500)
    refused = transitions.succeed(JOB, FENCE, result={"a": "\x00"}, validation={}, usage=usage)
    usage = transitions.unstorable(refused).usage
    assert (usage.tokens_in, usage.tokens_out, usage.latency_ms) == (812, None, 1500)


def test_a_refusal_no_single_field_explains_still_says_so() -> None:
    finish = transitions.unstorable(transitions.succeed(JOB, FENCE, result={"a": 1}, validation={}), sqlstate="54000")
    assert finish.error == (
        "the database refused to store this attempt's outcome (SQLSTATE 54000); no single field explains it"
    )


def test_the_unstorable_failure_is_a_legal_move_out_of_running() -> None:
    assert states.is_legal(JobState.RUNNING, JobState.FAILED_TERMINAL)
    assert "RUNNING" in states.sources_of(JobState.FAILED_TERMINAL)


def test_a_refusal_names_keys_a_model_may_have_written_as_question_marks() -> None:
    reason = transitions.refusal({"evidence": {"IBAN DE89 3704": "\x00", "ok_key": 1}}, where="result")
    assert reason == "result.evidence.?: contains U+0000 (NUL), which PostgreSQL text cannot store"
    assert transitions.refusal({"evidence": {"lines[0].amount": "\ud800"}}, where="result") == (
        "result.evidence.lines[0].amount: contains a lone surrogate U+D800, which is not valid UTF-8"
    )
    assert transitions.refusal({"a": ["fine", 1, 2.5, None]}, where="result") is None
