"""The `invoice-strict-v2` policy: each rule with an invoice in each language, and what a failure says."""

# ruff: noqa: RUF001  (the Turkish dotless i is meant, not a confusable)

from __future__ import annotations

import copy
import dataclasses
import decimal
from typing import Any

import pytest

from lading import validation
from lading.validation import strict_v2
from lading_demo import generator

POLICY = validation.STRICT_V2


@dataclasses.dataclass(frozen=True)
class Language:
    code: str
    country: str
    supplier_cue: str | None
    buyer_cue: str
    vat_label: str
    number_label: str
    issue_label: str
    due_label: str
    delivery_label: str
    subtotal: str
    tax: str
    total: str
    issue_printed: str
    due_printed: str
    comma: bool
    rate: int
    supplier_vat: str
    bank_code: str


LANGUAGES = {
    "en": Language("en", "GB", "From", "Bill To", "VAT No", "Invoice No", "Invoice Date", "Due Date",
                   "Delivery Date", "Subtotal", "VAT", "Total", "04/03/2025", "03/04/2025", False, 20,
                   "GB123456782", "NWBK60161331926819"),
    "de": Language("de", "DE", None, "Rechnung an", "USt-IdNr.", "Rechnungsnummer", "Rechnungsdatum", "Fällig am",
                   "Lieferdatum", "Zwischensumme", "MwSt.", "Gesamtbetrag", "04.03.2025", "03.04.2025", True, 19,
                   "DE123456789", "370400440532013000"),
    "tr": Language("tr", "TR", "Satıcı", "Sayın", "VKN", "Fatura No", "Fatura Tarihi", "Vade Tarihi",
                   "İrsaliye Tarihi", "Ara Toplam", "KDV", "Genel Toplam", "04.03.2025", "03.04.2025", True, 20,
                   "1234567890", "0006100519786457841326"),
    "fr": Language("fr", "FR", "Fournisseur", "Facturé à", "N° TVA", "Facture n°", "Date de facture",
                   "Date d'échéance", "Date de livraison", "Total HT", "TVA", "Total TTC", "4 mars 2025",
                   "3 avril 2025", True, 20, "FR40303265045", "20041010050500013M02606"),
    "nl": Language("nl", "NL", "Leverancier", "Factuur aan", "BTW-nr", "Factuurnummer", "Factuurdatum",
                   "Vervaldatum", "Leverdatum", "Subtotaal", "BTW", "Totaal", "4 maart 2025", "3 april 2025", True,
                   21, "NL123456789B01", "ABNA0417164300"),
    "es": Language("es", "ES", "Proveedor", "Cliente", "NIF", "Factura nº", "Fecha de factura",
                   "Fecha de vencimiento", "Fecha de entrega", "Base imponible", "IVA", "Total", "4 de marzo de 2025",
                   "3 de abril de 2025", True, 21, "ESB12345678", "21000418450200051332"),
    "it": Language("it", "IT", "Fornitore", "Spett.le", "P. IVA", "Fattura n.", "Data fattura", "Data di scadenza",
                   "Data di consegna", "Imponibile", "IVA", "Totale", "04/03/2025", "03/04/2025", True, 22,
                   "IT12345678901", "X0542811101000000123456"),
}
"""Every language of the cue table, each with its supplier's country (so dates read day first)."""

SUPPLIER = "Nordlicht Software GmbH"
BUYER = "Anadolu Lojistik A.Ş."
BUYER_VAT = "DE811907980"
NUMBER = "INV-2025-0042"
QUANTITY, PRICE = decimal.Decimal(2), decimal.Decimal("617.25")


def _iban(lang: Language) -> str:
    return lang.country + generator.iban_check_digits(country=lang.country, bban=lang.bank_code) + lang.bank_code


def _money(value: decimal.Decimal, lang: Language) -> str:
    text = f"{value:,.2f}"
    return text.translate(str.maketrans(",.", ".,")) if lang.comma else text


def _invoice(code: str) -> tuple[dict[str, Any], str]:
    """A clean invoice in language `code`: (the correct answer with its evidence, the document)."""
    lang = LANGUAGES[code]
    amount = QUANTITY * PRICE
    tax = (amount * lang.rate / 100).quantize(decimal.Decimal("0.01"))
    total = amount + tax
    iban = _iban(lang)
    supplier_block = [f"{lang.supplier_cue}:"] if lang.supplier_cue else []
    lines = [
        *supplier_block,
        SUPPLIER,
        "Hauptstraße 5 · 20457 Hamburg",
        f"{lang.vat_label}: {lang.supplier_vat}",
        "",
        f"{lang.buyer_cue}" if lang.buyer_cue in ("Sayın", "Spett.le") else f"{lang.buyer_cue}:",
        BUYER,
        "Atatürk Cad. No:12, 34394 İstanbul",
        f"{lang.vat_label}: {BUYER_VAT}",
        "",
        f"{lang.number_label}: {NUMBER}",
        f"{lang.issue_label}: {lang.issue_printed}",
        f"{lang.due_label}: {lang.due_printed}",
        "",
        f"Consulting services   {QUANTITY}   {_money(PRICE, lang)}   {lang.rate}%   {_money(amount, lang)}",
        "",
        f"{lang.subtotal}:   {_money(amount, lang)}",
        f"{lang.tax} {lang.rate}%:   {_money(tax, lang)}",
        f"{lang.total}:   {_money(total, lang)} EUR",
        "",
        f"IBAN: {' '.join(iban[i:i + 4] for i in range(0, len(iban), 4))}",
    ]
    document = "\n".join(lines) + "\n"
    result = {
        "invoice_number": NUMBER,
        "issue_date": "2025-03-04",
        "due_date": "2025-04-03",
        "currency": "EUR",
        "supplier": {"name": SUPPLIER, "vat_id": lang.supplier_vat, "iban": iban},
        "buyer": {"name": BUYER, "vat_id": BUYER_VAT},
        "lines": [{"description": "Consulting services", "quantity": str(QUANTITY), "unit_price": f"{PRICE}",
                   "amount": f"{amount:.2f}", "tax_rate": str(lang.rate)}],
        "subtotal": f"{amount:.2f}",
        "tax_total": f"{tax:.2f}",
        "total": f"{total:.2f}",
        "evidence": {
            "invoice_number": NUMBER,
            "supplier.iban": lines[-1].removeprefix("IBAN: "),
            "supplier.name": SUPPLIER,
            "buyer.name": BUYER,
            "issue_date": lang.issue_printed,
            "lines[0].amount": _money(amount, lang),
            "subtotal": lines[-5],
            "tax_total": lines[-4],
            "total": lines[-3],
            "currency": "EUR",
        },
    }
    return result, document


def _checks(result: dict[str, Any], document: str, **options: Any) -> list[tuple[str, str | None]]:
    verdict = validation.validate(result, source_text=document, policy=POLICY, **options)
    return [(failure.check, failure.field) for failure in verdict.failed]


def _failure(result: dict[str, Any], document: str, check: str) -> validation.FailedCheck:
    verdict = validation.validate(result, source_text=document, policy=POLICY)
    found = [failure for failure in verdict.failed if failure.check == check]
    assert found, verdict.failed
    return found[0]


# ---------------------------------------------------------------------------------------------
# clean invoices pass, in every language
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("code", sorted(LANGUAGES))
def test_a_clean_invoice_passes_in_every_language(code: str) -> None:
    result, document = _invoice(code)
    assert _checks(result, document) == []


@pytest.mark.parametrize("code", sorted(LANGUAGES))
def test_a_clean_invoice_passes_without_quotes_for_the_fields_v1_never_asked_for(code: str) -> None:
    result, document = _invoice(code)
    for path in ("supplier.name", "buyer.name", "issue_date", "currency"):
        del result["evidence"][path]
    assert _checks(result, document) == []


def test_v2_is_known_and_the_default_for_new_batches() -> None:
    assert {"invoice-strict-v1", "invoice-strict-v2"} <= validation.known_policies()
    assert validation.DEFAULT_POLICY == strict_v2.NAME == POLICY


def test_the_builtin_extractor_passes_v2_on_the_generators_clean_documents() -> None:
    from lading_demo import builtin

    for sample in generator.generate(80, seed=2024):
        outcome = builtin.extract_text(sample.text)
        if sample.expected_state == generator.FAILED_TERMINAL:
            continue
        assert outcome.result is not None, sample.key
        verdict = validation.validate(outcome.result, source_text=sample.text, policy=POLICY)
        assert verdict.passed is (sample.expected_state == generator.SUCCEEDED), (sample.key, verdict.failed)


# ---------------------------------------------------------------------------------------------
# currency
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("code", sorted(LANGUAGES))
def test_a_currency_the_document_never_shows_is_not_grounded(code: str) -> None:
    result, document = _invoice(code)
    result["currency"] = "USD"
    del result["evidence"]["currency"]
    assert _checks(result, document) == [("currency_not_grounded", "currency")]


def test_a_quote_that_shows_another_currency_is_not_grounded() -> None:
    result, document = _invoice("en")
    result["currency"] = "GBP"
    result["evidence"]["currency"] = "EUR"
    assert _checks(result, document) == [("currency_not_grounded", "currency")]


def test_a_document_showing_no_currency_needs_a_default() -> None:
    result, document = _invoice("de")
    document = document.replace(" EUR\n", "\n")
    del result["evidence"]["currency"]
    result["evidence"]["total"] = result["evidence"]["total"].removesuffix(" EUR")
    assert _checks(result, document) == [("currency_not_shown", "currency")]
    assert _checks(result, document, default_currency="EUR") == []
    assert _checks(result, document, default_currency="CHF") == [("currency_not_grounded", "currency")]


def test_a_symbol_grounds_its_currency_and_a_currency_field_counts() -> None:
    result, document = _invoice("en")
    result["evidence"].update(currency="€", total=result["evidence"]["total"].replace(" EUR", " €"))
    assert _checks(result, document.replace(" EUR\n", " €\n")) == []
    result, document = _invoice("en")
    document = document.replace(" EUR\n", "\n").replace("Invoice No:", "Currency: EUR\nInvoice No:")
    result["evidence"]["total"] = result["evidence"]["total"].removesuffix(" EUR")
    assert _checks(result, document) == []


def test_a_dollar_sign_is_ambiguous_for_a_canadian_supplier() -> None:
    result, document = _invoice("en")
    document = document.replace(" EUR\n", " $\n").replace("VAT No: GB123456782", "VAT No: CA123456789")
    result.update(currency="USD", supplier={**result["supplier"], "vat_id": "CA123456789"})
    result["evidence"]["total"] = result["evidence"]["total"].replace("EUR", "$")
    del result["evidence"]["currency"]
    assert _checks(result, document) == [("currency_ambiguous", "currency")]


def test_several_currencies_are_decided_by_the_totals_line() -> None:
    result, document = _invoice("en")
    document += "Exchange rate on the invoice date: 1 USD = 0.92 EUR\n"
    assert _checks(result, document) == []
    result["currency"] = "USD"
    del result["evidence"]["currency"]
    assert _checks(result, document) == [("currency_not_grounded", "currency")]


# ---------------------------------------------------------------------------------------------
# parties
# ---------------------------------------------------------------------------------------------

def _swapped(result: dict[str, Any]) -> dict[str, Any]:
    swapped = copy.deepcopy(result)
    supplier, buyer = swapped["supplier"], swapped["buyer"]
    swapped["supplier"] = {"name": buyer["name"], "vat_id": buyer["vat_id"], "iban": supplier["iban"]}
    swapped["buyer"] = {"name": supplier["name"], "vat_id": supplier["vat_id"]}
    swapped["evidence"]["supplier.name"], swapped["evidence"]["buyer.name"] = buyer["name"], supplier["name"]
    return swapped


@pytest.mark.parametrize("code", sorted(LANGUAGES))
def test_swapped_supplier_and_buyer_go_to_review_in_every_language(code: str) -> None:
    result, document = _invoice(code)
    assert _checks(_swapped(result), document) == [
        ("party_role", "supplier.name"),
        ("party_role", "supplier.vat_id"),
        ("party_role", "buyer.name"),
        ("party_role", "buyer.vat_id"),
    ]


def test_side_by_side_party_blocks_are_read_by_column() -> None:
    result, _ = _invoice("en")
    document = (
        "INVOICE\n\n"
        "Invoice No: INV-2025-0042     Invoice Date: 04/03/2025\n\n"
        f"Supplier:                      Bill To:\n"
        f"{SUPPLIER}        {BUYER}\n"
        f"VAT No: GB123456782            VAT No: {BUYER_VAT}\n\n"
        "Consulting services   2   617.25   20%   1,234.50\n\n"
        "Subtotal:   1,234.50\nVAT 20%:   246.90\nTotal:   1,481.40 EUR\n\n"
        f"IBAN: {result['supplier']['iban']}\n"
    )
    result["due_date"] = None
    result["evidence"] = {
        "invoice_number": NUMBER, "supplier.iban": result["supplier"]["iban"], "lines[0].amount": "1,234.50",
        "subtotal": "Subtotal:   1,234.50", "tax_total": "VAT 20%:   246.90", "total": "Total:   1,481.40 EUR",
    }
    assert _checks(result, document) == []
    assert [check for check, _ in _checks(_swapped(result), document)] == ["party_role"] * 4


def test_a_buyer_under_no_heading_after_the_items_has_no_role() -> None:
    result, document = _invoice("en")
    block = document[document.index("Bill To:"):document.index("Invoice No:")]
    document = document.replace(block, "") + "\n" + block.replace("Bill To:\n", "")
    failure = _failure(result, document, "party_role")
    assert failure.field == "buyer.name"
    assert "unknown" in failure.message


def test_the_address_block_of_a_letter_with_no_buyer_heading_is_the_buyers() -> None:
    result, document = _invoice("de")
    document = document.replace("Rechnung an:\n", "")
    assert _checks(result, document) == []
    assert [check for check, _ in _checks(_swapped(result), document)] == ["party_role"] * 4


def test_the_supplier_may_be_the_block_holding_the_iban() -> None:
    result, document = _invoice("en")
    head, _, rest = document.partition("\n\n")  # the supplier's block, with its "From:" heading
    iban_line = rest[rest.index("IBAN"):]
    footer = f"{SUPPLIER} · VAT No: GB123456782\n{iban_line}"
    document = "INVOICE\n\n" + rest.replace(iban_line, footer)
    assert head.startswith("From:") and SUPPLIER not in rest
    assert _checks(result, document) == []
    without_iban = document.replace(iban_line, "")
    del result["evidence"]["supplier.iban"]
    result["supplier"]["iban"] = None
    assert ("party_role", "supplier.name") in _checks(result, without_iban)


def test_supplier_and_buyer_must_differ() -> None:
    result, document = _invoice("de")
    result["buyer"] = {"name": SUPPLIER, "vat_id": None}
    del result["evidence"]["buyer.name"]
    assert ("parties_identical", "buyer.name") in _checks(result, document)


@pytest.mark.parametrize("field", ["supplier", "buyer"])
def test_a_vat_id_printed_nowhere_is_not_in_the_source(field: str) -> None:
    result, document = _invoice("de")
    result[field]["vat_id"] = "DE999999999" if field == "supplier" else "DE811907981"
    assert _checks(result, document) == [("party_not_in_source", f"{field}.vat_id")]


def test_a_vat_id_inside_an_iban_is_not_that_vat_id() -> None:
    result, document = _invoice("de")
    iban = result["supplier"]["iban"]
    result["supplier"]["vat_id"] = "DE" + iban[4:13]
    assert ("party_not_in_source", "supplier.vat_id") in _checks(result, document)


# ---------------------------------------------------------------------------------------------
# dates
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("code", sorted(LANGUAGES))
def test_a_date_read_day_for_month_is_misread(code: str) -> None:
    result, document = _invoice(code)
    result["issue_date"] = "2025-04-03"
    result["due_date"] = "2025-04-03"
    checks = _checks(result, document)
    assert ("date_misread", "issue_date") in checks or ("date_role", "issue_date") in checks


def test_a_date_that_reads_two_ways_needs_a_locale() -> None:
    result, document = _invoice("en")
    result["supplier"]["vat_id"] = None
    result["supplier"]["iban"] = None
    document = document.replace("VAT No: GB123456782\n", "")
    document = document[:document.index("IBAN")]
    del result["evidence"]["supplier.iban"]
    assert _checks(result, document) == [("date_ambiguous", "issue_date"), ("date_ambiguous", "due_date")]


def test_the_delivery_date_is_not_the_issue_date() -> None:
    result, document = _invoice("de")
    document = document.replace("Rechnungsdatum: 04.03.2025", "Rechnungsdatum: 05.03.2025\nLieferdatum: 04.03.2025")
    result["evidence"]["issue_date"] = "04.03.2025"
    assert _checks(result, document) == [("date_role", "issue_date")]


def test_a_due_date_may_follow_from_the_payment_terms() -> None:
    result, document = _invoice("de")
    document = document.replace("Fällig am: 03.04.2025\n", "Zahlbar innerhalb von 30 Tagen ohne Abzug.\n")
    assert _checks(result, document) == []
    result["due_date"] = "2025-04-10"
    assert _checks(result, document) == [("date_not_in_source", "due_date")]


# ---------------------------------------------------------------------------------------------
# tax
# ---------------------------------------------------------------------------------------------

def test_a_tax_rate_printed_nowhere_goes_to_review() -> None:
    result, document = _invoice("de")
    document = document.replace("   19%   ", "   ").replace("MwSt. 19%:", "MwSt.:")
    result["evidence"]["tax_total"] = result["evidence"]["tax_total"].replace(" 19%", "")
    result["lines"][0]["tax_rate"] = "17"
    assert _checks(result, document) == [
        ("tax_rate_not_in_source", "lines[0].tax_rate"), ("tax_total_rates", "tax_total"),
    ]


def test_a_rate_that_follows_from_the_totals_needs_no_print() -> None:
    result, document = _invoice("de")
    document = document.replace("   19%   ", "   ").replace("MwSt. 19%:", "MwSt.:")
    result["evidence"]["tax_total"] = result["evidence"]["tax_total"].replace(" 19%", "")
    assert _checks(result, document) == []


def test_tax_total_must_agree_with_the_line_rates() -> None:
    result, document = _invoice("en")
    document = document.replace("VAT 20%:", "VAT 10% / 20%:")
    result["lines"][0]["tax_rate"] = "10"
    result["evidence"]["tax_total"] = result["evidence"]["tax_total"].replace("VAT 20%", "VAT 10% / 20%")
    assert _checks(result, document) == [("tax_total_rates", "tax_total")]


def test_a_quoted_rate_must_show_the_rate() -> None:
    result, document = _invoice("en")
    result["evidence"]["lines[0].tax_rate"] = "617.25"
    assert _checks(result, document) == [("evidence_mismatch", "lines[0].tax_rate")]


# ---------------------------------------------------------------------------------------------
# identifiers
# ---------------------------------------------------------------------------------------------

def test_an_iban_in_the_buyers_block_is_not_the_payees() -> None:
    result, document = _invoice("en")
    iban_line = document[document.index("IBAN"):]
    document = document.replace(iban_line, "").replace(f"VAT No: {BUYER_VAT}\n", f"VAT No: {BUYER_VAT}\n{iban_line}")
    assert ("identifier_role", "supplier.iban") in _checks(result, document)


def test_an_iban_on_a_direct_debit_line_is_the_buyers() -> None:
    result, document = _invoice("de")
    iban = result["evidence"]["supplier.iban"]
    document = document.replace(f"IBAN: {iban}", f"Der Betrag wird per Lastschrift von IBAN {iban} eingezogen.")
    assert ("identifier_role", "supplier.iban") in _checks(result, document)


@pytest.mark.parametrize("label", ["Order No", "Bestellnummer", "Sipariş No", "N° de commande", "Codice cliente"])
def test_an_order_number_is_not_the_invoice_number(label: str) -> None:
    result, document = _invoice("en")
    document = document.replace("Invoice No: INV-2025-0042", f"Invoice No: INV-2025-0041\n{label}: INV-2025-0042")
    assert _checks(result, document) == [("identifier_role", "invoice_number")]


# ---------------------------------------------------------------------------------------------
# what a failure says
# ---------------------------------------------------------------------------------------------

def test_a_failure_names_the_field_the_quote_and_the_line() -> None:
    result, document = _invoice("tr")
    failure = _failure(_swapped(result), document, "party_role")
    assert failure.field == "supplier.name"
    assert failure.quote == BUYER
    assert failure.line == document.splitlines().index(BUYER) + 1
    assert f'"{BUYER}"' in failure.message and f"line {failure.line}" in failure.message
    assert '"Sayın"' in failure.message
    assert failure.to_json()["quote"] == BUYER and failure.to_json()["line"] == failure.line


def test_v1_failures_under_v2_carry_their_quote_and_line() -> None:
    result, document = _invoice("en")
    result["total"] = "1481.50"
    total = _failure(result, document, "total_sum")
    assert total.quote == " ".join(result["evidence"]["total"].split())
    assert total.line == next(i for i, line in enumerate(document.splitlines(), 1) if line.startswith("Total:"))


def test_a_quote_longer_than_the_limit_is_cut() -> None:
    result, document = _invoice("en")
    result["currency"] = "GBP"
    result["evidence"]["currency"] = document[:400]
    failure = _failure(result, document, "currency_not_grounded")
    assert failure.quote is not None and len(failure.quote) == validation.verdicts.QUOTE_MAX


def test_a_malformed_result_is_one_schema_failure() -> None:
    verdict = validation.validate({"invoice_number": 1}, source_text="", policy=POLICY)
    assert [(f.check, f.field) for f in verdict.failed] == [("schema", None)]


def test_validation_never_changes_the_result() -> None:
    result, document = _invoice("de")
    before = copy.deepcopy(result)
    validation.validate(_swapped(result), source_text=document, policy=POLICY)
    validation.validate(result, source_text=document, policy=POLICY)
    assert result == before
