"""What a chat-completions model is asked to quote: every field the validation policies ground."""

from __future__ import annotations

from lading.providers import prompting

GROUNDED_BY_V2 = {
    "invoice_number": "identifier_role: labelled as an invoice number",
    "issue_date": "date_role, date_misread, date_ambiguous",
    "due_date": "date_role, date_misread",
    "currency": "currency_not_grounded: a code or symbol beside an amount",
    "supplier.name": "party_role: under a seller heading or the letterhead",
    "supplier.vat_id": "party_role",
    "supplier.iban": "identifier_role: not the buyer's account",
    "buyer.name": "party_role: under a buyer heading",
    "buyer.vat_id": "party_role",
    "lines[i].tax_rate": "tax_rate_not_in_source, evidence_mismatch",
    "tax_total": "tax_total_rates",
    "total": "currency: the total's line decides between currencies",
}
"""Each field `invoice-strict-v2` judges a quote of, with the checks that judge it."""

REQUIRED_BY_V1 = ("invoice_number", "supplier.iban", "lines[i].amount", "subtotal", "tax_total", "total")
"""The quotes `invoice-strict-v1` fails without (evidence_missing)."""


def _system() -> str:
    return prompting.messages(text="Total 1.00 EUR", schema="invoice.v1", nonce="n0")[0]["content"]


def test_the_model_is_asked_to_quote_every_field_the_policies_ground() -> None:
    system = _system()
    for path in [*GROUNDED_BY_V2, *REQUIRED_BY_V1]:
        assert path in prompting.EVIDENCE_PATHS, path
        assert path in system, path
    assert "i = 0, 1, ... for each line" in system


def test_the_model_is_told_how_to_quote_a_currency_and_what_to_leave_out() -> None:
    system = _system()
    assert 'as printed beside an amount ("1.469,06 EUR") or in a currency field' in system
    assert "leave out the quote of a field the document does not show" in system


def test_the_evidence_rule_stays_one_compact_paragraph() -> None:
    [rule] = [line for line in _system().splitlines() if line.startswith("- evidence ")]
    assert len(rule) < 700, len(rule)
