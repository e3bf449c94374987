"""The builtin (offline, rule-based) extractor reads the generated invoices exactly, from the text alone."""

# ruff: noqa: RUF001  (the Turkish dotless i and the multiplication sign are meant, not confusables)

from __future__ import annotations

import asyncio
import functools
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from lading.ids import JobId
from lading.models import invoice
from lading.providers import base, noop
from lading_demo import builtin, generator

SEEDS = {1: 200, 2: 200, 2026: 100}  # 500 documents


@functools.cache
def corpus() -> tuple[tuple[generator.Sample, base.Outcome], ...]:
    pairs = []
    for seed, count in SEEDS.items():
        for sample in generator.generate(count, seed=seed):
            pairs.append((sample, builtin.extract_text(sample.text)))
    return tuple(pairs)


def without_evidence(result: dict[str, Any]) -> dict[str, Any]:
    return {field: value for field, value in result.items() if field != "evidence"}


def document(text: str) -> base.Document:
    return base.Document(job_id=JobId(1), key="doc-1", text=text, tenant="acme")


def test_every_readable_sample_is_extracted_exactly_as_its_truth() -> None:
    wrong = []
    for sample, outcome in corpus():
        if sample.truth is None:
            continue
        if outcome.outcome is not base.OutcomeClass.OK or outcome.result is None:
            wrong.append((sample.key, outcome.error_class, outcome.error))
        elif without_evidence(outcome.result) != without_evidence(sample.truth):
            wrong.append((sample.key, "differs", None))
    assert wrong == []


def test_defective_documents_are_extracted_as_printed_not_corrected() -> None:
    review = (generator.TOTALS_MISMATCH, generator.BAD_IBAN_CHECKSUM)
    defective = [(sample, outcome) for sample, outcome in corpus() if sample.defect in review]
    assert defective
    for sample, outcome in defective:
        assert outcome.result is not None and sample.truth is not None
        assert outcome.result["total"] == sample.truth["total"]
        assert outcome.result["supplier"]["iban"] == sample.truth["supplier"]["iban"]


def test_unreadable_samples_are_terminal_unreadable_document() -> None:
    unreadable = [outcome for sample, outcome in corpus() if sample.truth is None]
    assert len(unreadable) == 25
    for outcome in unreadable:
        assert outcome.outcome is base.OutcomeClass.TERMINAL
        assert outcome.error_class == builtin.UNREADABLE_DOCUMENT
        assert outcome.result is None


def test_every_evidence_value_is_an_exact_substring_of_the_source_text() -> None:
    for sample, outcome in corpus():
        for path, quote in (outcome.result or {}).get("evidence", {}).items():
            assert quote and quote in sample.text, (sample.key, path)


def test_evidence_covers_every_extracted_value() -> None:
    for _, outcome in corpus():
        if outcome.result is None:
            continue
        result = outcome.result
        expected = {"invoice_number", "issue_date", "currency", "supplier.name", "buyer.name", "subtotal",
                    "tax_total", "total"}
        expected |= {path for path, value in (
            ("due_date", result["due_date"]),
            ("supplier.vat_id", result["supplier"]["vat_id"]),
            ("supplier.iban", result["supplier"]["iban"]),
            ("buyer.vat_id", result["buyer"]["vat_id"]),
        ) if value is not None}
        for index in range(len(result["lines"])):
            expected |= {f"lines[{index}].{field}" for field in
                         ("description", "quantity", "unit_price", "amount", "tax_rate")}
        assert set(result["evidence"]) == expected


def test_amounts_are_plain_decimal_strings_whatever_the_document_uses() -> None:
    for _, outcome in corpus():
        if outcome.result is not None:
            parsed = invoice.Invoice.model_validate(outcome.result)
            amounts = [parsed.subtotal, parsed.tax_total, parsed.total, *(ln.amount for ln in parsed.lines)]
            for amount in amounts:
                assert "," not in amount and amount.count(".") == 1 and len(amount.split(".")[1]) == 2


def test_estimated_token_counts_are_reported() -> None:
    _, outcome = next(pair for pair in corpus() if pair[1].result is not None)
    assert outcome.tokens_in is not None and outcome.tokens_in > 0
    assert outcome.tokens_out is not None and outcome.tokens_out > 0


async def test_the_provider_extracts_through_the_protocol() -> None:
    sample = next(sample for sample in generator.generate(5, seed=3) if sample.truth is not None)
    provider: base.Provider = builtin.BuiltinProvider()
    outcome = await provider.extract(document(sample.text), schema="invoice.v1", policy="invoice-strict-v1")
    assert outcome.result is not None and sample.truth is not None
    assert without_evidence(outcome.result) == without_evidence(sample.truth)


async def test_latency_is_simulated_by_sleeping() -> None:
    provider = builtin.BuiltinProvider(latency_s=0.05)
    loop = asyncio.get_running_loop()
    started = loop.time()
    await provider.extract(document("nothing to read"), schema="invoice.v1", policy="invoice-strict-v1")
    assert loop.time() - started >= 0.05


async def test_other_schemas_are_terminal_unsupported_schema() -> None:
    for provider in (builtin.BuiltinProvider(), noop.NoopProvider()):
        outcome = await provider.extract(document("Invoice No: 1"), schema="receipt.v1", policy="p")
        assert outcome.outcome is base.OutcomeClass.TERMINAL
        assert outcome.error_class == builtin.UNSUPPORTED_SCHEMA


def test_errors_name_fields_never_document_text() -> None:
    text = "Invoice No: SECRET-4711\nSupplier: Very Secret Holding Ltd\nTotal: 12.00 EUR\n"
    outcome = builtin.extract_text(text)
    assert outcome.outcome is base.OutcomeClass.TERMINAL
    assert outcome.error is not None
    assert "SECRET" not in outcome.error and "Secret" not in outcome.error
    assert "lines" in outcome.error


async def test_the_noop_provider_answers_a_fixed_valid_invoice_without_reading() -> None:
    provider = noop.NoopProvider()
    first = await provider.extract(document(""), schema="invoice.v1", policy="invoice-strict-v1")
    second = await provider.extract(document("anything"), schema="invoice.v1", policy="invoice-strict-v1")
    assert first.outcome is base.OutcomeClass.OK and first.result is not None
    assert first.result == second.result
    assert first.result is not second.result
    invoice.Invoice.model_validate(first.result)


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_the_extractor_never_raises_on_arbitrary_text(text: str) -> None:
    assert isinstance(builtin.extract_text(text), base.Outcome)


INVOICE_ALPHABET = st.sampled_from([
    *"0123456789 .,:;|%€$£₺-/x×=()\n\tIBANTRDEGBEURUSDTL",
    "Invoice No: ", "Date: ", "12.03.2026", "2026-03-12", "12 March 2026", "Subtotal ", "VAT 20% ", "Total ",
    "KDV (%20) ", "Genel Toplam ", "Zwischensumme ", "Supplier:\n", "Bill To:\n", "Satıcı:    Alıcı:\n",
    "Description  Qty  Unit Price  VAT %  Amount\n", "| Açıklama | Miktar | Birim Fiyat | KDV % | Tutar |\n",
    "Items:\n", "1. ", "2 pcs x 10,00 = 20,00 (VAT 20%)\n", "1.234,56", "1,234.56", "IBAN: TR33 ", "İ",
])


@settings(max_examples=300, deadline=None)
@given(st.lists(INVOICE_ALPHABET, max_size=80).map("".join))
def test_the_extractor_never_raises_on_invoice_like_fragments(text: str) -> None:
    outcome = builtin.extract_text(text)
    assert isinstance(outcome, base.Outcome)
    for quote in (outcome.result or {}).get("evidence", {}).values():
        assert quote in text
