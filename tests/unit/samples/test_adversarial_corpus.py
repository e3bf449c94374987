"""The adversarial corpus: deterministic, covering, truths that hold, and corruptions of exactly one field."""

from __future__ import annotations

import collections
import decimal
import functools
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lading.models import invoice
from lading_demo import adversarial

CENT = decimal.Decimal("0.01")

seeds = st.integers(min_value=0, max_value=2**64 - 1)
languages = st.sampled_from(adversarial.LANGUAGES)
layouts = st.sampled_from(adversarial.LAYOUTS)


@functools.cache
def corpus() -> tuple[adversarial.Document, ...]:
    return tuple(adversarial.documents(280, seed=11))


def flat(value: Any, path: str = "") -> dict[str, Any]:
    """`{"supplier": {"name": x}}` -> `{"supplier.name": x}`, lines as `lines[0].amount`; no evidence."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if key != "evidence" or path:
                out.update(flat(item, f"{path}.{key}" if path else key))
        return out
    if isinstance(value, list):
        out = {}
        for index, item in enumerate(value):
            out.update(flat(item, f"{path}[{index}]"))
        return out
    return {path: value}


def test_the_same_seed_gives_the_same_documents() -> None:
    assert adversarial.documents(30, seed=3) == adversarial.documents(30, seed=3)
    assert [d.text for d in adversarial.documents(5, seed=3)] != [d.text for d in adversarial.documents(5, seed=4)]


def test_every_language_and_layout_is_rendered() -> None:
    combos = {(d.language, d.layout) for d in corpus()}
    assert combos == {(lang, layout) for lang in adversarial.LANGUAGES for layout in adversarial.LAYOUTS}


def test_every_answer_class_occurs() -> None:
    cases = collections.Counter(answer.case for d in corpus() for answer in d.answers)
    assert set(cases) == set(adversarial.CLASSES)
    assert all(count >= 3 for count in cases.values()), cases


def test_the_features_the_policies_must_read_all_occur() -> None:
    features = collections.Counter(feature for d in corpus() for feature in d.features)
    for wanted in ("several_rates", "grouped", "noise", "credit_note", "buyer_iban", "order_no",
                   "currency:code_after", "currency:code_before", "currency:symbol", "currency:field",
                   "currency:none", "date:iso", "date:dots", "date:slash_dmy", "date:slash_mdy", "date:dash_dmy",
                   "date:long", "date:long_us", "country:US", "country:GB"):
        assert features[wanted] > 0, wanted
    ungrouped = [d for d in corpus() if "grouped" not in d.features and abs(decimal.Decimal(d.truth["total"])) >= 1000]
    assert ungrouped, "amounts of 1000 and more are also printed without thousands separators"
    assert any("\f" in d.text for d in corpus() if d.layout == "multi-page")


def test_most_documents_are_clean_and_the_doubtful_say_why() -> None:
    for d in corpus():
        assert (d.doubt is None) == (d.expected == adversarial.SUCCEEDED)
        assert d.answers[0].result == d.truth
        assert d.answers[0].case == (d.doubt or adversarial.CLEAN)
        if d.doubt == adversarial.CURRENCY_NOT_SHOWN:
            assert "currency" not in d.truth["evidence"]
        if d.doubt is not None:
            assert len(d.answers) == 1
    clean = sum(d.doubt is None for d in corpus())
    assert clean / len(corpus()) > 0.85


@settings(max_examples=40, deadline=None)
@given(seed=seeds, language=languages, layout=layouts)
def test_the_truth_fits_the_schema_adds_up_and_quotes_the_document(seed: int, language: str, layout: str) -> None:
    document = adversarial.document(seed=seed, language=language, layout=layout)
    truth = invoice.Invoice.model_validate(document.truth)
    for line in truth.lines:
        exact = decimal.Decimal(line.quantity) * decimal.Decimal(line.unit_price)
        assert exact.quantize(CENT, rounding=decimal.ROUND_HALF_UP) == decimal.Decimal(line.amount)
    subtotal = sum((decimal.Decimal(line.amount) for line in truth.lines), decimal.Decimal(0))
    assert subtotal == decimal.Decimal(truth.subtotal)
    assert decimal.Decimal(truth.subtotal) + decimal.Decimal(truth.tax_total) == decimal.Decimal(truth.total)
    exact_tax = sum((decimal.Decimal(line.amount) * decimal.Decimal(line.tax_rate) / 100 for line in truth.lines),
                    decimal.Decimal(0))
    rates = {line.tax_rate for line in truth.lines}
    assert abs(exact_tax - decimal.Decimal(truth.tax_total)) <= decimal.Decimal("0.005") * len(rates)
    if document.credit_note:
        assert decimal.Decimal(truth.total) < 0
    text = adversarial.normalised(document.text)
    for path, quote in truth.evidence.items():
        assert adversarial.normalised(quote) in text, path
    expected_paths = {"invoice_number", "issue_date", "supplier.name", "buyer.name", "subtotal", "tax_total",
                      "total"}
    assert expected_paths <= truth.evidence.keys()
    for index in range(len(truth.lines)):
        for field in ("description", "quantity", "unit_price", "amount", "tax_rate"):
            assert f"lines[{index}].{field}" in truth.evidence


@settings(max_examples=40, deadline=None)
@given(seed=seeds, language=languages, layout=layouts)
def test_each_corruption_fits_the_schema_and_changes_exactly_its_fields(seed: int, language: str, layout: str) -> None:
    document = adversarial.document(seed=seed, language=language, layout=layout)
    truth = flat(document.truth)
    for answer in document.answers[1:]:
        invoice.Invoice.model_validate(answer.result)
        assert answer.expected == adversarial.REVIEW_REQUIRED
        changed = flat(answer.result)
        differing = {path for path in truth.keys() | changed.keys() if truth.get(path) != changed.get(path)}
        assert differing == set(answer.fields), answer.case
        for field in ("subtotal", "tax_total", "total"):
            assert changed[field] == truth[field]
        for path, quote in answer.result["evidence"].items():
            assert adversarial.normalised(quote) in adversarial.normalised(document.text), (answer.case, path)
        for path in ("invoice_number", "subtotal", "tax_total", "total"):
            assert path in answer.result["evidence"]


def test_a_currency_absent_answer_names_a_currency_the_text_never_shows() -> None:
    symbols = {"EUR": ("€",), "GBP": ("£",), "TRY": ("TL", "₺"), "USD": ("$",), "CHF": ()}
    for d in corpus():
        for answer in d.answers:
            if answer.case == adversarial.CURRENCY_ABSENT:
                code = answer.result["currency"]
                assert code not in d.text and not any(symbol in d.text for symbol in symbols[code])


def test_day_for_month_answers_read_a_printed_date_the_other_way() -> None:
    for d in corpus():
        for answer in d.answers:
            if answer.case == adversarial.ISSUE_DATE_DAY_FOR_MONTH:
                wrong, right = answer.result["issue_date"], d.truth["issue_date"]
                assert wrong[:4] == right[:4] and wrong[5:7] == right[8:10] and wrong[8:10] == right[5:7]


def test_a_document_with_an_ambiguous_date_and_no_locale_signal_is_doubtful() -> None:
    doubtful = [d for d in corpus() if d.doubt == adversarial.DATE_READS_TWO_WAYS]
    assert doubtful
    for d in doubtful:
        assert d.language == "en" and d.truth["supplier"]["iban"] is None
        assert not (d.truth["supplier"]["vat_id"] or "00")[:2].isalpha()


@pytest.mark.parametrize(("language", "layout"), [("xx", "ledger"), ("en", "scroll")])
def test_an_unknown_language_or_layout_is_refused_by_name(language: str, layout: str) -> None:
    with pytest.raises(ValueError, match="xx" if language == "xx" else "scroll"):
        adversarial.document(seed=1, language=language, layout=layout)
