"""The `invoice-strict-v1` policy: which extracted invoices succeed and which go to review, and why."""

from __future__ import annotations

import copy
import decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lading import errors, validation
from lading.validation import checks

POLICY = validation.STRICT_V1

# A realistic, correctly extracted Turkish invoice, German number format, ragged whitespace.
SOURCE = """\
ACME Tekstil A.S.
Vergi No: 1234567890
IBAN: TR33 0006 1005 1978 6457 8413 26

INVOICE No: INV-2025-0042
Date: 15.03.2025        Due: 14.04.2025

Buyer: Lading GmbH, USt-IdNr. DE123456789

Description        Qty   Unit price     Amount
Cotton fabric      10    1.250,00       12.500,00
Shipping           1       350,50          350,50

Subtotal                                12.850,50
VAT 20%                                  2.570,10
Total                                   15.420,60 TRY
"""

RESULT: dict[str, Any] = {
    "invoice_number": "INV-2025-0042",
    "issue_date": "2025-03-15",
    "due_date": "2025-04-14",
    "currency": "TRY",
    "supplier": {"name": "ACME Tekstil A.S.", "vat_id": "1234567890", "iban": "TR330006100519786457841326"},
    "buyer": {"name": "Lading GmbH", "vat_id": "DE123456789"},
    "lines": [
        {"description": "Cotton fabric", "quantity": "10", "unit_price": "1250.00", "amount": "12500.00",
         "tax_rate": "20"},
        {"description": "Shipping", "quantity": "1", "unit_price": "350.50", "amount": "350.50",
         "tax_rate": "20"},
    ],
    "subtotal": "12850.50",
    "tax_total": "2570.10",
    "total": "15420.60",
    "evidence": {
        "invoice_number": "INVOICE No: INV-2025-0042",
        "supplier.iban": "IBAN: TR33 0006 1005 1978 6457 8413 26",
        "lines[0].amount": "Cotton fabric 10 1.250,00 12.500,00",
        "lines[1].amount": "Shipping           1       350,50          350,50",
        "subtotal": "Subtotal 12.850,50",
        "tax_total": "VAT 20% 2.570,10",
        "total": "Total 15.420,60 TRY",
        "buyer.vat_id": "USt-IdNr. DE123456789",
    },
}


def _result() -> dict[str, Any]:
    return copy.deepcopy(RESULT)


def _failures(result: dict[str, Any], source: str = SOURCE) -> list[tuple[str, str | None]]:
    verdict = validation.validate(result, source_text=source, policy=POLICY)
    assert verdict.passed is (not verdict.failed)
    return [(failure.check, failure.field) for failure in verdict.failed]


# Rendering a faithful document of any (possibly wrong) invoice, so that a test breaking an
# arithmetic rule breaks only that rule and not the evidence checks too.

_FORMATS = {
    "de": (".", ","),
    "en": (",", "."),
    "fr": (" ", ","),
    "fr-nbsp": ("\u00a0", ","),
    "fr-narrow-nbsp": ("\u202f", ","),
    "ch": ("'", "."),
    "plain": ("", "."),
    "plain-comma": ("", ","),
}


def _format(value: str, number_format: str) -> str:
    grouping, point = _FORMATS[number_format]
    amount = decimal.Decimal(value)
    digits, _, fraction = f"{abs(amount):f}".partition(".")
    groups: list[str] = []
    while len(digits) > 3:
        groups.insert(0, digits[-3:])
        digits = digits[:-3]
    groups.insert(0, digits)
    sign = "-" if amount < 0 else ""
    return sign + grouping.join(groups) + (point + fraction if fraction else "")


def _rendered(result: dict[str, Any], number_format: str = "de") -> tuple[dict[str, Any], str]:
    rows = {"invoice_number": f"Invoice number: {result['invoice_number']}"}
    if result["supplier"].get("iban") is not None:
        rows["supplier.iban"] = f"IBAN: {result['supplier']['iban']}"
    for index, line in enumerate(result["lines"]):
        rows[f"lines[{index}].amount"] = f"Line {index + 1}: {_format(line['amount'], number_format)}"
    rows["subtotal"] = f"Net: {_format(result['subtotal'], number_format)}"
    rows["tax_total"] = f"VAT: {_format(result['tax_total'], number_format)}"
    rows["total"] = f"Gross: {_format(result['total'], number_format)} {result['currency']}"
    return {**result, "evidence": rows}, "Invoice\n" + "\n\n".join(rows.values()) + "\nThank you.\n"


def _rendered_failures(result: dict[str, Any]) -> list[tuple[str, str | None]]:
    faithful, source = _rendered(result)
    return _failures(faithful, source)


# ---------------------------------------------------------------------------------------------
# passing
# ---------------------------------------------------------------------------------------------

def test_clean_invoice_passes() -> None:
    verdict = validation.validate(_result(), source_text=SOURCE, policy=POLICY)
    assert verdict == validation.Verdict(policy="invoice-strict-v1", passed=True, failed=())
    assert verdict.to_json() == {"policy": "invoice-strict-v1", "passed": True, "failed_checks": []}


def test_faithfully_rendered_invoice_passes() -> None:
    assert _rendered_failures(_result()) == []


def test_validation_never_changes_the_result() -> None:
    result = _result()
    result["total"] = "1.00"
    validation.validate(result, source_text=SOURCE, policy=POLICY)
    assert result["total"] == "1.00"
    assert result["supplier"]["iban"] == RESULT["supplier"]["iban"]


# ---------------------------------------------------------------------------------------------
# one test per check
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "broken",
    [
        pytest.param({"total": "15.420,60"}, id="locale-formatted-money"),
        pytest.param({"total": 15420.60}, id="float-money"),
        pytest.param({"issue_date": "15.03.2025"}, id="bad-date"),
        pytest.param({"lines": []}, id="no-lines"),
        pytest.param({"unexpected": "field"}, id="extra-field"),
    ],
)
def test_schema_violation_is_one_failure_and_stops(broken: dict[str, Any]) -> None:
    result = {**_result(), **broken, "subtotal": "1.00"}  # the arithmetic is wrong too: not reported
    verdict = validation.validate(result, source_text=SOURCE, policy=POLICY)
    assert [(failure.check, failure.field) for failure in verdict.failed] == [("schema", None)]
    assert not verdict.passed
    assert next(iter(broken)) in verdict.failed[0].message


def test_schema_failure_names_nested_locations() -> None:
    result = _result()
    del result["supplier"]["name"]
    result["lines"][1]["amount"] = "350,50"
    (failure,) = validation.validate(result, source_text=SOURCE, policy=POLICY).failed
    assert failure.check == "schema"
    assert "supplier.name (missing)" in failure.message
    assert "lines[1].amount (string_pattern_mismatch)" in failure.message


def test_schema_failure_never_quotes_the_input() -> None:
    secret = "CONFIDENTIAL " * 100
    verdict = validation.validate({"invoice_number": 42, "notes": secret}, source_text="", policy=POLICY)
    (failure,) = verdict.failed
    assert "CONFIDENTIAL" not in failure.message


def test_line_amount_must_be_quantity_times_unit_price() -> None:
    result = _result()
    result["lines"][0]["unit_price"] = "1200.00"
    assert _rendered_failures(result) == [("line_amount", "lines[0].amount")]


def test_line_amounts_must_add_up_to_the_subtotal() -> None:
    result = _result()
    result["subtotal"] = "12850.00"
    result["tax_total"] = "2570.60"
    assert _rendered_failures(result) == [("lines_sum_subtotal", "subtotal")]


def test_subtotal_plus_tax_must_be_the_total() -> None:
    result = _result()
    result["total"] = "15420.70"
    assert _rendered_failures(result) == [("total_sum", "total")]


@pytest.mark.parametrize(
    ("total", "passes"),
    [("15420.60", True), ("15420.61", True), ("15420.59", True), ("15420.62", False), ("15420.58", False)],
)
def test_arithmetic_tolerance_is_one_cent(total: str, passes: bool) -> None:
    result = _result()
    result["total"] = total
    assert (_rendered_failures(result) == []) is passes


def test_currency_must_be_allowed() -> None:
    result = _result()
    result["currency"] = "SEK"
    assert _rendered_failures(result) == [("currency_allowed", "currency")]


@pytest.mark.parametrize("currency", sorted(checks.ALLOWED_CURRENCIES))
def test_allowed_currencies_pass(currency: str) -> None:
    result = _result()
    result["currency"] = currency
    assert _rendered_failures(result) == []


def test_due_date_must_not_be_before_issue_date() -> None:
    result = _result()
    result["due_date"] = "2025-03-14"
    assert _rendered_failures(result) == [("due_after_issue", "due_date")]


def test_due_date_on_issue_date_and_absent_due_date_pass() -> None:
    result = _result()
    result["due_date"] = "2025-03-15"
    assert _rendered_failures(result) == []
    del result["due_date"]
    assert _rendered_failures(result) == []


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        pytest.param({"issue_date": "1925-03-15"}, "issue_date", id="issue-year-misread"),
        pytest.param({"issue_date": "2101-01-01", "due_date": None}, "issue_date", id="issue-far-future"),
        pytest.param({"due_date": "2125-04-14"}, "due_date", id="due-far-future"),
    ],
)
def test_dates_must_be_plausible(changes: dict[str, Any], field: str) -> None:
    assert _rendered_failures({**_result(), **changes}) == [("date_plausible", field)]


@pytest.mark.parametrize(
    "iban",
    [
        pytest.param("TR330006100519786457841327", id="checksum"),
        pytest.param("TR33000610051978645784132", id="length"),
        pytest.param("33TR0006100519786457841326", id="shape"),
        pytest.param("", id="empty"),
    ],
)
def test_supplier_iban_must_pass_its_checksum(iban: str) -> None:
    result = _result()
    result["supplier"]["iban"] = iban
    assert ("iban_checksum", "supplier.iban") in _rendered_failures(result)


def test_absent_iban_needs_no_checksum_and_no_evidence() -> None:
    result = _result()
    result["supplier"]["iban"] = None
    del result["evidence"]["supplier.iban"]
    assert _failures(result) == []


@pytest.mark.parametrize(
    ("party", "vat_id"),
    [
        ("buyer", "DE12345678"),
        ("buyer", "GB1234567890"),
        ("buyer", "NL123456789B1"),
        ("buyer", "FR1234567890"),
        ("supplier", "TR123456789"),
        ("supplier", "123"),
        ("supplier", ""),
    ],
)
def test_vat_id_must_match_its_country_format(party: str, vat_id: str) -> None:
    result = _result()
    result[party]["vat_id"] = vat_id
    assert _rendered_failures(result) == [("vat_id_format", f"{party}.vat_id")]


@pytest.mark.parametrize(
    "path",
    [
        "invoice_number", "supplier.iban", "lines[0].amount", "lines[1].amount",
        "subtotal", "tax_total", "total",
    ],
)
def test_required_evidence_must_be_present(path: str) -> None:
    result = _result()
    del result["evidence"][path]
    assert _failures(result) == [("evidence_missing", path)]


def test_blank_evidence_counts_as_missing() -> None:
    result = _result()
    result["evidence"]["total"] = " \n "
    assert _failures(result) == [("evidence_missing", "total")]


def test_evidence_must_occur_in_the_source() -> None:
    result = _result()
    result["evidence"]["tax_total"] = "VAT 2.570,10"  # the document says "VAT 20% 2.570,10"
    assert _failures(result) == [("evidence_not_in_source", "tax_total")]


def test_evidence_for_any_other_field_must_occur_in_the_source_too() -> None:
    result = _result()
    result["evidence"]["buyer.name"] = "Buyer: Lading AG"
    assert _failures(result) == [("evidence_not_in_source", "buyer.name")]


def test_long_evidence_paths_are_cut_short() -> None:
    result = _result()
    result["evidence"]["x" * 1000] = "not in the document"
    (failure,) = validation.validate(result, source_text=SOURCE, policy=POLICY).failed
    assert failure.check == "evidence_not_in_source"
    assert failure.field is not None
    assert len(failure.field) < 100
    assert len(failure.message) < 200


def test_evidence_must_not_cut_a_number_of_the_source() -> None:
    result = _result()
    result["total"] = "15420.6"
    result["evidence"]["total"] = "Total 15.420,6"  # a prefix of "Total 15.420,60"
    assert ("evidence_not_in_source", "total") in _failures(result)
    result["evidence"]["total"] = "5.420,60"  # a suffix of "15.420,60"
    assert ("evidence_not_in_source", "total") in _failures(result)


def test_evidence_must_contain_the_value() -> None:
    result = _result()
    result["evidence"]["total"] = "Subtotal 12.850,50"  # a real quote, of another number
    assert _failures(result) == [("evidence_mismatch", "total")]


def test_invoice_number_evidence_ignores_whitespace() -> None:
    result = _result()
    source = SOURCE.replace("INV-2025-0042", "INV- 2025 -0042")
    result["evidence"]["invoice_number"] = "INVOICE No: INV- 2025 -0042"
    assert _failures(result, source) == []
    result["invoice_number"] = "INV-2025-0043"
    assert _failures(result, source) == [("evidence_mismatch", "invoice_number")]


def test_iban_evidence_ignores_spaces_and_case() -> None:
    result = _result()
    source = SOURCE.replace("TR33 0006 1005 1978 6457 8413 26", "tr33 0006 1005 1978 6457 8413 26")
    result["evidence"]["supplier.iban"] = "IBAN: tr33 0006 1005 1978 6457 8413 26"
    assert _failures(result, source) == []


# ---------------------------------------------------------------------------------------------
# hallucinated IBAN: schema-perfect, checksum-perfect, and nowhere in the document
# ---------------------------------------------------------------------------------------------

def test_hallucinated_iban_with_invented_evidence_fails() -> None:
    result = _result()
    result["supplier"]["iban"] = "GB82WEST12345698765432"
    result["evidence"]["supplier.iban"] = "IBAN: GB82 WEST 1234 5698 7654 32"
    verdict = validation.validate(result, source_text=SOURCE, policy=POLICY)
    assert not verdict.passed
    assert [(f.check, f.field) for f in verdict.failed] == [("evidence_not_in_source", "supplier.iban")]
    assert "GB82" not in verdict.failed[0].message


def test_hallucinated_iban_with_a_real_quote_fails() -> None:
    result = _result()
    result["supplier"]["iban"] = "GB82WEST12345698765432"
    assert _failures(result) == [("evidence_mismatch", "supplier.iban")]


def test_hallucinated_iban_without_evidence_fails() -> None:
    result = _result()
    result["supplier"]["iban"] = "GB82WEST12345698765432"
    del result["evidence"]["supplier.iban"]
    assert _failures(result) == [("evidence_missing", "supplier.iban")]


# ---------------------------------------------------------------------------------------------
# collecting, policies, verdict JSON
# ---------------------------------------------------------------------------------------------

def test_all_failures_are_collected_in_policy_order() -> None:
    result = _result()
    result["lines"][0]["unit_price"] = "1200.00"
    result["currency"] = "SEK"
    result["buyer"]["vat_id"] = "DE1"
    del result["evidence"]["total"]
    assert _failures(result) == [
        ("line_amount", "lines[0].amount"),
        ("currency_allowed", "currency"),
        ("vat_id_format", "buyer.vat_id"),
        ("evidence_missing", "total"),
    ]


def test_failed_verdict_to_json() -> None:
    result = _result()
    result["currency"] = "SEK"
    verdict = validation.validate(result, source_text=SOURCE, policy=POLICY)
    assert verdict.to_json() == {
        "policy": "invoice-strict-v1",
        "passed": False,
        "failed_checks": [
            {
                "check": "currency_allowed",
                "field": "currency",
                "message": "currency SEK is not one of CHF, EUR, GBP, JPY, TRY, USD",
            },
        ],
    }


def test_unknown_policy_is_a_permanent_error() -> None:
    with pytest.raises(errors.UnknownPolicy, match="invoice-lenient-v9") as caught:
        validation.validate(_result(), source_text=SOURCE, policy="invoice-lenient-v9")
    assert isinstance(caught.value, errors.PermanentError)
    assert caught.value.known == validation.known_policies()


def test_default_policy_is_known() -> None:
    assert validation.known_policies() == frozenset({"invoice-strict-v1", "invoice-strict-v2"})
    assert validation.DEFAULT_POLICY in validation.known_policies()


# ---------------------------------------------------------------------------------------------
# number formats, IBANs, VAT ids
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1.234,56", "1234.56"),
        ("1,234.56", "1234.56"),
        ("1234.56", "1234.56"),
        ("1234,56", "1234.56"),
        ("1 234,56", "1234.56"),
        ("1\u00a0234,56", "1234.56"),
        ("1\u202f234,56", "1234.56"),
        ("1'234.56", "1234.56"),
        ("1\u2019234.56", "1234.56"),
        ("1.234.567,89", "1234567.89"),
        ("1,234,567.89", "1234567.89"),
        ("1 234 567,89 EUR", "1234567.89"),
        ("1.234", "1234"),
        ("1.234", "1.234"),
        ("12.500,00", "12500"),
        ("EUR1,234.56", "1234.56"),
        ("1.234,56€", "1234.56"),
        ("Total: -1.234,56", "-1234.56"),
        ("Total: \u22121.234,56", "-1234.56"),
        ("(1,234.56)", "-1234.56"),
        ("(1,234.56)", "1234.56"),
        ("Qty 2 10,00", "10"),
        ("Qty 2 10,00", "2"),
        ("0,50", "0.5"),
        ("7", "7.00"),
    ],
)
def test_number_formats_are_read_as_the_same_decimal(text: str, value: str) -> None:
    assert decimal.Decimal(value) in checks.number_values(text)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1.234,56", "234.56"),      # a group is not a number on its own
        ("1.234,56", "1.23456"),
        ("1,234.56", "1.23456"),
        ("INV-100", "-100"),         # a hyphen is not a minus sign
        ("2024-100", "-100"),
        ("1.234,56", "-1234.56"),
        ("15.03.2025", "15.03"),     # a date is not an amount
        ("1,2,3", "1.2"),
    ],
)
def test_number_formats_do_not_invent_values(text: str, value: str) -> None:
    assert decimal.Decimal(value) not in checks.number_values(text)


@pytest.mark.parametrize(
    "iban",
    [
        "GB82WEST12345698765432",
        "DE89370400440532013000",
        "TR330006100519786457841326",
        "NL91ABNA0417164300",
        "FR1420041010050500013M02606",
        "CH9300762011623852957",
        "GB82 WEST 1234 5698 7654 32",
        "gb82west12345698765432",
    ],
)
def test_valid_ibans(iban: str) -> None:
    assert checks.iban_is_valid(iban)


@pytest.mark.parametrize(
    "iban",
    [
        "GB82WEST12345698765433",        # checksum
        "GB28WEST12345698765432",        # transposed check digits
        "DE89370400440532013001",
        "TR330006100519786457841325",
        "DE8937040044053201300",         # DE is 22 characters
        "TR3300061005197864578413260",   # TR is 26
        "NL91ABNA041716430",             # NL is 18
        "XX8212345678901",               # unknown country: checksum still applies
        "XX12123",                       # unknown country: at least 15 characters
        "GB82-WEST-1234-5698-7654-32",   # dashes are not spaces
        "82GBWEST12345698765432",
        "",
    ],
)
def test_invalid_ibans(iban: str) -> None:
    assert not checks.iban_is_valid(iban)


@pytest.mark.parametrize(
    ("vat_id", "valid"),
    [
        ("1234567890", True),
        ("12345678901", True),
        ("TR1234567890", True),
        ("TR12345678901", True),
        ("TR123456789", False),
        ("DE123456789", True),
        ("DE 123 456 789", True),
        ("de123456789", True),
        ("DE12345678X", False),
        ("GB123456789", True),
        ("GB123456789012", True),
        ("GB1234567890", False),
        ("FRXX123456789", True),
        ("FR12123456789", True),
        ("FR1212345678", False),
        ("NL123456789B01", True),
        ("NL123456789C01", False),
        ("ATU12345678", True),
        ("CHE-123.456.789 MWST", True),
        ("ESX1234567X", True),
        ("X1", False),
        ("ABCDEFGHIJKLMNOPQ", False),
        ("DE12345678é", False),
    ],
)
def test_vat_id_formats(vat_id: str, valid: bool) -> None:
    assert (checks.vat_id_problem(vat_id) is None) is valid


# ---------------------------------------------------------------------------------------------
# properties
# ---------------------------------------------------------------------------------------------

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=30),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=20,
)
_paths = st.sampled_from(
    ["total", "subtotal", "tax_total", "lines[0].amount", "supplier.iban", "invoice_number"],
)


@st.composite
def _mangled_results(draw: st.DrawFn) -> dict[str, Any]:
    """The clean invoice with some keys replaced by arbitrary JSON, or new ones added."""
    result = _result()
    for key in draw(st.lists(st.sampled_from([*RESULT, "extra"]), max_size=3)):
        result[key] = draw(_json)
    return result


@st.composite
def _arbitrary_evidence(draw: st.DrawFn) -> dict[str, Any]:
    """A schema-valid invoice whose evidence is arbitrary text: exercises every evidence path."""
    result = _result()
    quotes = st.text() | st.text(alphabet="0123456789.,' -()\u2212\u00a0\u202fTRGB")
    result["evidence"] = draw(st.dictionaries(_paths | st.text(max_size=10), quotes, max_size=8))
    return result


@given(
    result=(
        st.dictionaries(st.text(max_size=20), _json, max_size=6) | _mangled_results() | _arbitrary_evidence()
    ),
    source_text=st.text() | st.just(SOURCE),
)
@settings(max_examples=300)
def test_validate_never_raises(result: dict[str, Any], source_text: str) -> None:
    verdict = validation.validate(result, source_text=source_text, policy=POLICY)
    assert isinstance(verdict, validation.Verdict)
    assert verdict.passed is (not verdict.failed)
    if verdict.passed:
        total, subtotal, tax_total = (decimal.Decimal(result[k]) for k in ("total", "subtotal", "tax_total"))
        assert abs(total - (subtotal + tax_total)) <= checks.TOLERANCE


_cents = st.decimals(min_value=-10_000, max_value=10_000_000, places=2, allow_nan=False, allow_infinity=False)


@st.composite
def _rendered_invoices(draw: st.DrawFn) -> tuple[dict[str, Any], str, bool]:
    """A faithfully rendered invoice in any number format; `consistent` if its arithmetic holds."""
    lines = []
    for index in range(draw(st.integers(min_value=1, max_value=4))):
        quantity = draw(st.decimals(min_value=0, max_value=1000, places=draw(st.integers(0, 3))))
        unit_price = draw(st.decimals(min_value=-1000, max_value=100_000, places=2))
        amount = (quantity * unit_price).quantize(decimal.Decimal("0.01"), rounding=decimal.ROUND_HALF_UP)
        lines.append({
            "description": f"Item {index}",
            "quantity": f"{quantity:f}",
            "unit_price": f"{unit_price:f}",
            "amount": f"{amount:f}",
            "tax_rate": "20",
        })
    subtotal = sum((decimal.Decimal(line["amount"]) for line in lines), decimal.Decimal(0))
    tax_total = draw(_cents)
    total = subtotal + tax_total + draw(st.just(decimal.Decimal(0)) | _cents)
    result = {
        **_result(),
        "lines": lines,
        "subtotal": f"{subtotal:f}",
        "tax_total": f"{tax_total:f}",
        "total": f"{total:f}",
    }
    faithful, source = _rendered(result, draw(st.sampled_from(sorted(_FORMATS))))
    consistent = abs(total - subtotal - tax_total) <= checks.TOLERANCE
    return faithful, source, consistent


@given(invoice=_rendered_invoices())
@settings(max_examples=300)
def test_only_a_total_that_adds_up_passes(invoice: tuple[dict[str, Any], str, bool]) -> None:
    result, source, consistent = invoice
    verdict = validation.validate(result, source_text=source, policy=POLICY)
    if verdict.passed:
        total = decimal.Decimal(result["total"])
        subtotal = decimal.Decimal(result["subtotal"])
        tax_total = decimal.Decimal(result["tax_total"])
        assert abs(total - (subtotal + tax_total)) <= checks.TOLERANCE
    # A faithful document passes in every number format: the evidence reader is not the weak link.
    assert verdict.passed is consistent, verdict.failed
