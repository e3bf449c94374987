"""The boundary for model output: what PostgreSQL cannot store is invalid output, kept escaped."""

from __future__ import annotations

import json
import math
from typing import Any

import hypothesis
import pytest
from hypothesis import strategies as st

from lading import storable
from lading.jobs import transitions
from lading.providers import base, openai_compatible

# Any code point, lone surrogates (which hypothesis leaves out unless asked) and U+0000 included.
ANY_TEXT = st.text(st.characters() | st.integers(0xD800, 0xDFFF).map(chr) | st.just("\x00"))
JSON_LIKE = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | ANY_TEXT,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(ANY_TEXT, children, max_size=4),
    max_leaves=20,
)


def _storable(outcome: base.Outcome) -> bool:
    """Every field of `outcome` that the committer writes could be stored."""
    return all(
        storable.unstorable_reason(value) is None
        for value in (outcome.result, outcome.error, outcome.error_class, outcome.raw_output,
                      outcome.tokens_in, outcome.tokens_out, outcome.usage_refused)
    )  # fmt: skip


@hypothesis.given(result=st.dictionaries(ANY_TEXT, JSON_LIKE, max_size=5))
def test_whatever_a_provider_returns_comes_out_storable(result: dict[str, Any]) -> None:
    outcome = base.checked(base.Outcome.ok(result, tokens_in=1, tokens_out=2))
    assert _storable(outcome)
    if storable.unstorable_reason(result) is None:
        assert outcome.result is result and outcome.outcome is base.OutcomeClass.OK
    else:
        assert (outcome.outcome, outcome.error_class) == (base.OutcomeClass.INVALID_OUTPUT, base.UNSTORABLE_OUTPUT)
        assert outcome.result is None and outcome.raw_output
    assert base.checked(outcome) == outcome  # idempotent


@hypothesis.given(raw=ANY_TEXT, error=ANY_TEXT)
def test_raw_output_and_error_texts_are_escaped_not_lost(raw: str, error: str) -> None:
    outcome = base.checked(base.Outcome.failed(
        base.OutcomeClass.INVALID_OUTPUT, error_class="MALFORMED_OUTPUT", error=error, raw_output=raw
    ))  # fmt: skip
    assert _storable(outcome)
    assert outcome.raw_output == storable.escaped(raw)
    assert outcome.raw_output is not None
    outcome.raw_output.encode("utf-8")  # what the executor digests: never UnicodeEncodeError


@pytest.mark.parametrize(
    ("result", "place"),
    [
        ({"supplier": {"name": "Acme\x00"}}, "result.supplier.name: contains U+0000"),
        ({"lines": [{"description": "\ud800"}]}, "result.lines[0].description: contains a lone surrogate U+D800"),
        ({"evidence": {"total\x00": "1"}}, "result.evidence: a key contains U+0000"),
        ({"total": 2**64}, "result.total: integer out of range"),
        ({"total": -(2**63) - 1}, "result.total: integer out of range"),
        ({"total": math.inf}, "result.total: inf is not a finite number"),
        ({"total": math.nan}, "result.total: nan is not a finite number"),
    ],
)
def test_an_unstorable_result_is_invalid_output_naming_where(result: dict[str, Any], place: str) -> None:
    outcome = base.checked(base.Outcome.ok(result))
    assert (outcome.outcome, outcome.error_class) == (base.OutcomeClass.INVALID_OUTPUT, base.UNSTORABLE_OUTPUT)
    assert outcome.error is not None and place in outcome.error


def test_keys_a_model_wrote_are_not_repeated_in_the_error() -> None:
    outcome = base.checked(base.Outcome.ok({"evidence": {"IBAN DE89 3704 0044": "x\x00"}}))
    assert outcome.error is not None and "DE89" not in outcome.error
    assert "result.evidence.?" in outcome.error
    assert outcome.raw_output is not None and "DE89" in outcome.raw_output  # the reviewer still sees it


def test_a_storable_outcome_is_returned_as_is() -> None:
    outcome = base.Outcome.ok({"total": "1.00", "evidence": {"total": "1,00"}}, tokens_in=5, tokens_out=7)
    assert base.checked(outcome) is outcome


@pytest.mark.parametrize(
    ("tokens_in", "tokens_out", "kept", "reason"),
    [
        (2**40, 10, (None, 10), "tokens_in is 1099511627776, past the 2147483647"),
        (10, 2**63, (10, None), "tokens_out is 9223372036854775808, past"),
        (-1, 10, (None, 10), "tokens_in is negative"),
        (True, 10, (None, 10), "tokens_in is a bool"),
        (transitions.USAGE_TOKENS_MAX, 0, (transitions.USAGE_TOKENS_MAX, 0), None),
    ],
)
def test_implausible_token_counts_are_not_recorded_and_say_why(
        tokens_in: int, tokens_out: int, kept: tuple[int | None, int | None], reason: str | None
) -> None:
    outcome = base.checked(base.Outcome.ok({"total": "1.00"}, tokens_in=tokens_in, tokens_out=tokens_out))
    assert outcome.outcome is base.OutcomeClass.OK  # the extraction stands
    assert (outcome.tokens_in, outcome.tokens_out) == kept
    if reason is None:
        assert outcome.usage_refused is None
    else:
        assert outcome.usage_refused is not None and reason in outcome.usage_refused


# openai-compatible: the JSON as a server sends it -------------------------------------------------


def _body(content: str, **usage: int) -> bytes:
    envelope: dict[str, Any] = {
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 20, **usage},
    }
    return json.dumps(envelope).encode()  # ensure_ascii: NUL and lone surrogates travel as \u escapes


@pytest.mark.parametrize(
    ("content", "place"),
    [
        ('{"invoice_number": "A\\u0000"}', "answer.invoice_number: contains U+0000"),
        ('{"invoice_number": "\\ud800"}', "answer.invoice_number: contains a lone surrogate"),
        ('{"inv\\u0000": 1}', "answer: a key contains U+0000"),
        ('{"total": 123456789012345678901234567890}', "answer.total: integer out of range"),
        ('{"total": 1e400}', "answer.total: inf is not a finite number"),
        ('{"lines": [{"amount": -1e999}]}', "answer.lines[0].amount: -inf is not a finite number"),
    ],
)
def test_an_answer_holding_what_postgresql_cannot_store_is_unstorable_output(content: str, place: str) -> None:
    outcome = openai_compatible._completion(_body(content))
    assert (outcome.outcome, outcome.error_class) == (base.OutcomeClass.INVALID_OUTPUT, base.UNSTORABLE_OUTPUT)
    assert outcome.error is not None and place in outcome.error
    assert (outcome.tokens_in, outcome.tokens_out) == (10, 20)
    assert _storable(outcome) and outcome.raw_output is not None


def test_raw_output_with_a_literal_nul_is_kept_escaped() -> None:
    outcome = openai_compatible._completion(_body('{"invoice_number": "A"}\x00'))
    assert outcome.error_class == openai_compatible.MALFORMED_OUTPUT
    assert outcome.raw_output == '{"invoice_number": "A"}\\u0000'


@hypothesis.given(content=ANY_TEXT)
def test_any_answer_text_gives_a_storable_outcome(content: str) -> None:
    assert _storable(base.checked(openai_compatible._completion(_body(content))))


@hypothesis.given(prompt_tokens=st.integers(min_value=-(2**70), max_value=2**70))
def test_any_reported_token_count_gives_a_storable_outcome(prompt_tokens: int) -> None:
    outcome = base.checked(openai_compatible._completion(_body('{"a": 1}', prompt_tokens=prompt_tokens)))
    assert _storable(outcome)
    assert outcome.tokens_in is None or 0 <= outcome.tokens_in <= transitions.USAGE_TOKENS_MAX
