"""
Round trips through `invoice-strict-v2`: a clean invoice rendered in any layout and language
validates; each single-field corruption of its answer goes to review, naming the field and
the quote a reviewer must look at. The corpus is `lading_demo.adversarial`.
"""

from __future__ import annotations

import importlib.util
import pathlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lading import validation
from lading_demo import adversarial, corpus

V1 = "invoice-strict-v1"
V2 = "invoice-strict-v2"
ROOT = pathlib.Path(__file__).resolve().parents[3]

needs_v2 = pytest.mark.skipif(
    V2 not in validation.known_policies(), reason=f"{V2} is not a registered validation policy",
)

seeds = st.integers(min_value=0, max_value=2**64 - 1)
languages = st.sampled_from(adversarial.LANGUAGES)
layouts = st.sampled_from(adversarial.LAYOUTS)

ALSO_NAMED = {
    adversarial.TAX_RATE_ABSENT: {"tax_total"},
    adversarial.TAX_RATE_OF_OTHER_LINE: {"tax_total"},
}
"""A wrong rate may be caught where it shows: the tax total no longer agrees with the rates."""


def failures(verdict: validation.Verdict) -> list[dict[str, object]]:
    return [check.to_json() for check in verdict.failed]


@needs_v2
@settings(max_examples=40, deadline=None)
@given(seed=seeds, language=languages, layout=layouts)
def test_a_correct_answer_succeeds_in_every_layout_and_language(seed: int, language: str, layout: str) -> None:
    document = adversarial.document(seed=seed, language=language, layout=layout)
    verdict = validation.validate(document.truth, source_text=document.text, policy=V2)
    assert verdict.passed == (document.doubt is None), (document.doubt, failures(verdict))


@needs_v2
@settings(max_examples=40, deadline=None)
@given(seed=seeds, language=languages, layout=layouts)
def test_each_single_field_corruption_goes_to_review_naming_its_field(seed: int, language: str, layout: str) -> None:
    document = adversarial.document(seed=seed, language=language, layout=layout)
    for answer in document.answers[1:]:
        verdict = validation.validate(answer.result, source_text=document.text, policy=V2)
        assert not verdict.passed, answer.case
        named = {check.field for check in verdict.failed}
        assert named & (set(answer.fields) | ALSO_NAMED.get(answer.case, set())), (answer.case, failures(verdict))


@needs_v2
@settings(max_examples=20, deadline=None)
@given(seed=seeds, language=languages, layout=layouts)
def test_a_failure_on_a_quoted_field_shows_the_quote_and_its_line(seed: int, language: str, layout: str) -> None:
    document = adversarial.document(seed=seed, language=language, layout=layout)
    lines = document.text.split("\n")  # a form feed between pages does not start a line
    for answer in document.answers[1:]:
        verdict = validation.validate(answer.result, source_text=document.text, policy=V2)
        for check in verdict.failed:
            shown = check.to_json()
            if check.quote is not None and check.line is not None:
                assert shown["quote"] == check.quote and shown["line"] == check.line
                first_word = check.quote.split()[0]
                assert first_word in lines[check.line - 1], (answer.case, shown)
        quoted = [check for check in verdict.failed if check.field in answer.fields and check.quote]
        evidence = answer.result["evidence"]
        if any(field in evidence for field in answer.fields) and answer.case not in ALSO_NAMED:
            assert quoted, (answer.case, failures(verdict))


def test_the_corpus_is_adversarial_for_v1() -> None:
    """v1 delivers the clean answers, and most of the wrong ones too: what v2 exists to stop."""
    cases = corpus.adversarial_cases(documents=56)
    clean = [case for case in cases if case.case == adversarial.CLEAN]
    assert clean and all(validation.validate(case.result, source_text=case.text, policy=V1).passed for case in clean)
    wrong = [case for case in cases if case.expected == adversarial.REVIEW_REQUIRED]
    delivered = sum(validation.validate(case.result, source_text=case.text, policy=V1).passed for case in wrong)
    assert delivered / len(wrong) > 0.8


@needs_v2
def test_the_quickstart_and_the_examples_are_not_held() -> None:
    clean = [case for case in corpus.quickstart_cases() + corpus.example_cases(ROOT) if case.expected == "SUCCEEDED"]
    held = {
        f"{case.source}:{case.key}": failures(verdict)
        for case in clean
        if not (verdict := validation.validate(case.result, source_text=case.text, policy=V2)).passed
    }
    assert len(clean) == 172 and held == {}


@needs_v2
def test_the_quickstart_defects_still_go_to_review() -> None:
    defective = [case for case in corpus.quickstart_cases() if case.expected == "REVIEW_REQUIRED"]
    assert defective
    for case in defective:
        assert not validation.validate(case.result, source_text=case.text, policy=V2).passed, case.key


def test_the_benchmark_fails_clearly_when_a_policy_is_not_registered(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = importlib.util.spec_from_file_location("bench_validation", ROOT / "hack" / "bench_validation.py")
    assert spec is not None and spec.loader is not None
    bench_validation = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench_validation)
    monkeypatch.setattr(bench_validation.validation, "known_policies", lambda: frozenset({V1}))
    results, _, passed = bench_validation.run(documents=28)
    assert not passed
    assert results["error"].startswith(f"{V2} is not a registered policy")
    assert "error" not in results["policies"][V1]
