"""The synthetic invoice generator: deterministic per seed, the promised mix, and truths that hold."""

from __future__ import annotations

import collections
import decimal
import functools
import re

from lading.models import invoice
from lading_demo import generator

CENT = decimal.Decimal("0.01")


@functools.cache
def samples(seed: int = 7, count: int = 400) -> tuple[generator.Sample, ...]:
    return tuple(generator.generate(count, seed=seed))


def readable() -> list[generator.Sample]:
    return [sample for sample in samples() if sample.truth is not None]


def mod97_valid(iban: str) -> bool:
    """ISO 13616, written out again here so the test does not trust the generator's own helper."""
    rearranged = iban[4:] + iban[:4]
    digits = "".join(str(ord(char) - 55) if char.isalpha() else char for char in rearranged)
    return int(digits) % 97 == 1


def test_the_same_seed_gives_the_same_samples() -> None:
    assert generator.generate(60, seed=42) == generator.generate(60, seed=42)


def test_different_seeds_give_different_texts() -> None:
    first = [sample.text for sample in generator.generate(20, seed=1)]
    second = [sample.text for sample in generator.generate(20, seed=2)]
    assert first != second


def test_a_shorter_run_is_a_prefix_of_a_longer_one() -> None:
    assert generator.generate(33, seed=5) == generator.generate(80, seed=5)[:33]


def test_keys_are_numbered_from_one() -> None:
    assert [sample.key for sample in generator.generate(3, seed=1)] == ["inv-0001", "inv-0002", "inv-0003"]


def test_every_block_of_twenty_is_17_clean_2_defective_1_unreadable() -> None:
    for start in range(0, 400, generator.BLOCK_SIZE):
        block = samples()[start:start + generator.BLOCK_SIZE]
        states = collections.Counter(sample.expected_state for sample in block)
        assert states == {"SUCCEEDED": 17, "REVIEW_REQUIRED": 2, "FAILED_TERMINAL": 1}


def test_defects_explain_every_state_that_is_not_succeeded() -> None:
    pairs = collections.Counter((sample.expected_state, sample.defect) for sample in samples())
    assert set(pairs) == {
        ("SUCCEEDED", None),
        ("REVIEW_REQUIRED", "totals_mismatch"),
        ("REVIEW_REQUIRED", "bad_iban_checksum"),
        ("FAILED_TERMINAL", "unreadable"),
    }


def test_unreadable_samples_have_no_truth_and_the_others_do() -> None:
    for sample in samples():
        assert (sample.truth is None) == (sample.expected_state == "FAILED_TERMINAL")


def test_every_truth_validates_as_an_invoice_without_evidence() -> None:
    for sample in readable():
        parsed = invoice.Invoice.model_validate(sample.truth)
        assert parsed.evidence == {}
        assert parsed.to_json() == sample.truth


def test_lines_subtotal_and_tax_add_up_in_every_truth() -> None:
    for sample in readable():
        parsed = invoice.Invoice.model_validate(sample.truth)
        line_tax = decimal.Decimal(0)
        for line in parsed.lines:
            expected = (invoice.money(line.quantity) * invoice.money(line.unit_price)).quantize(
                CENT, rounding=decimal.ROUND_HALF_UP)
            assert invoice.money(line.amount) == expected
            line_tax += (invoice.money(line.amount) * invoice.money(line.tax_rate) / 100).quantize(
                CENT, rounding=decimal.ROUND_HALF_UP)
        assert invoice.money(parsed.subtotal) == sum(invoice.money(line.amount) for line in parsed.lines)
        assert invoice.money(parsed.tax_total) == line_tax


def test_the_total_is_subtotal_plus_tax_unless_the_document_misprints_it() -> None:
    for sample in readable():
        parsed = invoice.Invoice.model_validate(sample.truth)
        total, subtotal, tax = (invoice.money(v) for v in (parsed.total, parsed.subtotal, parsed.tax_total))
        difference = total - subtotal - tax
        if sample.defect == "totals_mismatch":
            assert abs(difference) > CENT  # more than the validator's rounding tolerance
        else:
            assert difference == 0


def test_ibans_pass_mod97_unless_the_document_misprints_one() -> None:
    for sample in readable():
        iban = sample.truth["supplier"]["iban"] if sample.truth else None
        if sample.defect == "bad_iban_checksum":
            assert iban is not None
            assert not mod97_valid(iban)
        elif iban is not None:
            assert mod97_valid(iban)
            assert len(iban) == {"TR": 26, "DE": 22, "GB": 22}[iban[:2]]


def test_vat_ids_have_their_country_format() -> None:
    formats = re.compile(r"\d{10}|DE\d{9}|GB\d{9}")
    for sample in readable():
        assert sample.truth is not None
        for party in (sample.truth["supplier"], sample.truth["buyer"]):
            assert party["vat_id"] is None or formats.fullmatch(party["vat_id"])


def test_values_of_the_truth_are_printed_in_the_text() -> None:
    for sample in readable():
        assert sample.truth is not None
        compact = "".join(sample.text.split())
        assert sample.truth["invoice_number"] in sample.text
        assert sample.truth["supplier"]["name"] in sample.text
        assert sample.truth["buyer"]["name"] in sample.text
        if sample.truth["supplier"]["iban"] is not None:
            assert sample.truth["supplier"]["iban"] in compact


def test_texts_use_both_thousands_separator_styles() -> None:
    texts = "\n".join(sample.text for sample in samples())
    assert re.search(r"\d{1,3}(?:\.\d{3})+,\d{2}(?!\d)", texts)  # 1.234,56
    assert re.search(r"\d{1,3}(?:,\d{3})+\.\d{2}(?!\d)", texts)  # 1,234.56


def test_texts_are_worded_in_turkish_english_and_german() -> None:
    texts = "\n".join(sample.text for sample in samples())
    for words in (
        ("Fatura", "Ara Toplam", "KDV", "Genel Toplam", "Vade Tarihi"),
        ("Invoice No", "Subtotal", "VAT", "Total"),
        ("Rechnungsnummer", "Zwischensumme", "MwSt.", "Gesamtbetrag"),
    ):
        for word in words:
            assert word in texts, word
    assert collections.Counter(sample.language for sample in samples()).keys() == {"tr", "en", "de"}


def test_all_layouts_and_currencies_occur() -> None:
    assert {sample.layout for sample in samples()} == set(generator.LAYOUTS)
    currencies = {sample.truth["currency"] for sample in readable() if sample.truth is not None}
    assert currencies == {"TRY", "EUR", "USD", "GBP"}


def test_dates_are_printed_in_three_styles() -> None:
    texts = "\n".join(sample.text for sample in samples())
    assert re.search(r"\b\d{2}\.\d{2}\.20\d{2}\b", texts)
    assert re.search(r"\b20\d{2}-\d{2}-\d{2}\b", texts)
    assert re.search(r"\b\d{1,2} (?:March|Mart|April|Nisan) 20\d{2}\b", texts)
    assert re.search(r"\b\d{1,2}\. (?:März|April|Mai|Juni) 20\d{2}\b", texts)


def test_some_descriptions_continue_on_the_next_line() -> None:
    continued = 0
    for sample in readable():
        assert sample.truth is not None
        for line in sample.truth["lines"]:
            description = line["description"]
            if description in sample.text:
                continue
            continued += 1
            cuts = [index for index, char in enumerate(description) if char == " "]
            halves = [(description[:cut], description[cut + 1:]) for cut in cuts]
            assert any(first in sample.text and rest in sample.text for first, rest in halves), description
    assert continued > 50


def test_texts_have_no_trailing_blanks_and_end_with_one_newline() -> None:
    for sample in samples():
        assert sample.text.endswith("\n") and not sample.text.endswith("\n\n")
        assert all(line == line.rstrip() for line in sample.text.split("\n"))
