"""
The individual checks of the invoice policies: pure functions from an extracted result to
the list of rules it breaks. No I/O, no clock, no state; every check reports all of its
failures and never changes the result.

Which checks a policy runs, and in what order, is decided in `lading.validation.policies`;
the check ids below are stable (dashboards and reviewers' filters key on them).

Arithmetic is exact `Decimal` arithmetic; each comparison allows `TOLERANCE` so that a line
rounded to cents still adds up.

Evidence is what makes a hallucination visible. The schema only says a value is well-formed;
`evidence[path]` is the model's quote of the source text that the value was read from. A
quote must (1) exist, (2) occur in the source once runs of whitespace are collapsed to one
space, without cutting a number in two (`"1.234,5"` is not a quote of `"1.234,56"`), and (3)
contain the value. Numbers are compared as numbers, whatever their format:

    "1.234,56"  "1,234.56"  "1234.56"  "1 234,56"  "1'234.56"   all mean Decimal("1234.56")
    "1.234"     may mean 1234 or 1.234: both readings count, the value picks one

so an IBAN that fits the schema perfectly but appears nowhere in the document fails with
`evidence_not_in_source` (or `evidence_mismatch` when the quote is real but another IBAN).
"""

from __future__ import annotations

import decimal
import functools
import re
from collections.abc import Iterator, Sequence
from typing import Any, Final

import pydantic

from lading.models import invoice
from lading.validation import verdicts

# Stable check ids (`FailedCheck.check`).
SCHEMA: Final = "schema"
LINE_AMOUNT: Final = "line_amount"
LINES_SUM_SUBTOTAL: Final = "lines_sum_subtotal"
TOTAL_SUM: Final = "total_sum"
CURRENCY_ALLOWED: Final = "currency_allowed"
DUE_AFTER_ISSUE: Final = "due_after_issue"
DATE_PLAUSIBLE: Final = "date_plausible"
IBAN_CHECKSUM: Final = "iban_checksum"
VAT_ID_FORMAT: Final = "vat_id_format"
EVIDENCE_MISSING: Final = "evidence_missing"
EVIDENCE_NOT_IN_SOURCE: Final = "evidence_not_in_source"
EVIDENCE_MISMATCH: Final = "evidence_mismatch"

TOLERANCE: Final = decimal.Decimal("0.01")
"""Largest difference accepted by each arithmetic comparison (line amount, sum of lines,
total): one cent, the rounding a correctly issued invoice can show per comparison."""

ALLOWED_CURRENCIES: Final = frozenset({"TRY", "EUR", "USD", "GBP", "CHF", "JPY"})
"""Currencies the ERP books. Anything else goes to a human, even when it is a real ISO code."""

EARLIEST_YEAR: Final = 2000
LATEST_YEAR: Final = 2100
"""Invoice dates outside [EARLIEST_YEAR, LATEST_YEAR] are misreadings (`02.03.24` as year 24)."""

IBAN_LENGTHS: Final = {"TR": 26, "DE": 22, "GB": 22, "FR": 27, "NL": 18}
"""Country-specific IBAN lengths (ISO 13616 registry). Other countries: IBAN_LENGTH_RANGE."""
IBAN_LENGTH_RANGE: Final = range(15, 35)

VAT_ID_FORMATS: Final = {
    "TR": (re.compile(r"TR(?:[0-9]{10}|[0-9]{11})"), "TR + 10 digits (VKN) or 11 digits (TCKN)"),
    "DE": (re.compile(r"DE[0-9]{9}"), "DE + 9 digits"),
    "GB": (re.compile(r"GB(?:[0-9]{9}|[0-9]{12})"), "GB + 9 or 12 digits"),
    "FR": (re.compile(r"FR[0-9A-Z]{2}[0-9]{9}"), "FR + 2 letters or digits + 9 digits"),
    "NL": (re.compile(r"NL[0-9]{9}B[0-9]{2}"), "NL + 9 digits + B + 2 digits"),
}
"""VAT id formats by country prefix, matched after removing spaces, dots and dashes and
upper-casing. Ids without a known prefix (including Turkish VKN/TCKN, printed as bare digits)
need only be 4..14 letters and digits after any two-letter prefix."""
_VAT_ID_OTHER = re.compile(r"[0-9A-Z]{4,14}")
_VAT_ID_NOISE = re.compile(r"[\s.\-]")
_COUNTRY_PREFIX = re.compile(r"[A-Z]{2}")
_IBAN_SHAPE = re.compile(r"[A-Z]{2}[0-9]{2}[0-9A-Z]+")
_IBAN_LETTERS = str.maketrans({chr(code): str(code - ord("A") + 10) for code in range(ord("A"), ord("Z") + 1)})
"""ISO 13616 letter values for the mod-97 check: A=10 ... Z=35."""

_EXACT = decimal.Context(prec=100, traps=[decimal.InvalidOperation, decimal.Overflow, decimal.DivisionByZero])
"""Enough digits for any product or sum of DecimalStrings (15 + 6 digits), so nothing rounds."""

_MAX_SCHEMA_LOCATIONS = 10
_MAX_NAME = 64
_DIGIT_STRING = "0123456789"
_DIGITS = frozenset(_DIGIT_STRING)
_APOSTROPHE = "\u2019"  # typographic apostrophe, a Swiss thousands separator
_MINUS = "\u2212"  # typographic minus sign
_NUMBER_JOINERS = frozenset(".,'" + _APOSTROPHE)
_SIGNS = ("-", _MINUS)
_NUMBER_RUN = re.compile(r"[0-9]+(?:[.,' \u2019][0-9]+)*")
_NUMBER_SEPARATOR = re.compile(r"([.,' \u2019])")
_MAX_SPACE_GROUPS = 6
"""A space-grouped number has at most 6 space-separated parts (15 integer digits + decimals)."""


# ---------------------------------------------------------------------------------------------
# schema
# ---------------------------------------------------------------------------------------------

def schema(result: Any) -> tuple[invoice.Invoice | None, list[verdicts.FailedCheck]]:
    """The result as an `invoice.Invoice`, or None and one `schema` failure naming where it is invalid."""
    try:
        return invoice.Invoice.model_validate(result), []
    except pydantic.ValidationError as exc:
        errors = exc.errors(include_url=False, include_input=False, include_context=False)
    places = [f"{_location(error['loc'])} ({error['type']})" for error in errors]
    more = len(places) - _MAX_SCHEMA_LOCATIONS
    listed = ", ".join(places[:_MAX_SCHEMA_LOCATIONS]) + (f" and {more} more" if more > 0 else "")
    message = f"not a valid {invoice.SCHEMA_NAME} document: {listed}"
    return None, [verdicts.FailedCheck(check=SCHEMA, field=None, message=message)]


def _location(loc: Sequence[int | str]) -> str:
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{_shortened(part)}" if path else _shortened(part)
    return path or "(document)"


def _shortened(name: str) -> str:
    """A name from the result (a dict key) cut short: it may be anything, even document text."""
    return name if len(name) <= _MAX_NAME else name[:_MAX_NAME] + "..."


# ---------------------------------------------------------------------------------------------
# arithmetic
# ---------------------------------------------------------------------------------------------

def line_amounts(inv: invoice.Invoice) -> list[verdicts.FailedCheck]:
    """Every line's amount is its quantity times unit price."""
    failures = []
    for index, line in enumerate(inv.lines):
        expected = _EXACT.multiply(invoice.money(line.quantity), invoice.money(line.unit_price))
        if not _close(invoice.money(line.amount), expected):
            failures.append(verdicts.FailedCheck(
                check=LINE_AMOUNT,
                field=f"lines[{index}].amount",
                message=(
                    f"amount {line.amount} is not quantity {line.quantity} * unit_price {line.unit_price}"
                    f" = {expected} (tolerance {TOLERANCE})"
                ),
            ))
    return failures


def lines_sum_subtotal(inv: invoice.Invoice) -> list[verdicts.FailedCheck]:
    """The line amounts add up to the subtotal."""
    lines_sum = decimal.Decimal(0)
    for line in inv.lines:
        lines_sum = _EXACT.add(lines_sum, invoice.money(line.amount))
    if _close(invoice.money(inv.subtotal), lines_sum):
        return []
    return [verdicts.FailedCheck(
        check=LINES_SUM_SUBTOTAL,
        field="subtotal",
        message=(
            f"subtotal {inv.subtotal} is not the sum of the line amounts {lines_sum} (tolerance {TOLERANCE})"
        ),
    )]


def total_sum(inv: invoice.Invoice) -> list[verdicts.FailedCheck]:
    """Subtotal plus tax total is the total."""
    expected = _EXACT.add(invoice.money(inv.subtotal), invoice.money(inv.tax_total))
    if _close(invoice.money(inv.total), expected):
        return []
    return [verdicts.FailedCheck(
        check=TOTAL_SUM,
        field="total",
        message=(
            f"total {inv.total} is not subtotal {inv.subtotal} + tax_total {inv.tax_total}"
            f" = {expected} (tolerance {TOLERANCE})"
        ),
    )]


def _close(a: decimal.Decimal, b: decimal.Decimal) -> bool:
    return _EXACT.abs(_EXACT.subtract(a, b)) <= TOLERANCE


# ---------------------------------------------------------------------------------------------
# currency and dates
# ---------------------------------------------------------------------------------------------

def currency_allowed(inv: invoice.Invoice) -> list[verdicts.FailedCheck]:
    """The currency is one the ERP books."""
    if inv.currency in ALLOWED_CURRENCIES:
        return []
    return [verdicts.FailedCheck(
        check=CURRENCY_ALLOWED,
        field="currency",
        message=f"currency {inv.currency} is not one of {', '.join(sorted(ALLOWED_CURRENCIES))}",
    )]


def dates(inv: invoice.Invoice) -> list[verdicts.FailedCheck]:
    """Dates are plausible invoice dates, and the due date is not before the issue date."""
    failures = []
    for field, date in (("issue_date", inv.issue_date), ("due_date", inv.due_date)):
        if date is not None and not EARLIEST_YEAR <= date.year <= LATEST_YEAR:
            failures.append(verdicts.FailedCheck(
                check=DATE_PLAUSIBLE,
                field=field,
                message=f"{field} {date.isoformat()} is not between {EARLIEST_YEAR} and {LATEST_YEAR}",
            ))
    if inv.due_date is not None and inv.due_date < inv.issue_date:
        failures.append(verdicts.FailedCheck(
            check=DUE_AFTER_ISSUE,
            field="due_date",
            message=f"due_date {inv.due_date.isoformat()} is before issue_date {inv.issue_date.isoformat()}",
        ))
    return failures


# ---------------------------------------------------------------------------------------------
# IBAN and VAT id
# ---------------------------------------------------------------------------------------------

def iban(inv: invoice.Invoice) -> list[verdicts.FailedCheck]:
    """The supplier's IBAN, when given, is well-formed and passes its checksum."""
    if inv.supplier.iban is None:
        return []
    problem = iban_problem(inv.supplier.iban)
    if problem is None:
        return []
    message = f"supplier.iban {problem}"
    return [verdicts.FailedCheck(check=IBAN_CHECKSUM, field="supplier.iban", message=message)]


IDENTIFIER_CACHE_SIZE: Final = 4096
"""IBANs and VAT ids whose verdict is kept (`iban_problem`, `vat_id_problem`: pure functions of the
string). A batch's invoices name few distinct parties (the buyer is most often the company itself,
suppliers recur), and judging one costs a few µs per invoice; 4,096 short strings are a few hundred KB."""


@functools.lru_cache(maxsize=IDENTIFIER_CACHE_SIZE)
def iban_problem(value: str) -> str | None:
    """
    What is wrong with an IBAN (spaces and case ignored), or None if it is valid: ISO 13616
    shape, the country's length, and the mod-97 checksum (move the first four characters to
    the end, replace letters by numbers A=10..Z=35, the number mod 97 must be 1).
    """
    compact = "".join(value.split()).upper()
    if not _IBAN_SHAPE.fullmatch(compact):
        return "is not shaped like an IBAN (2 letters, 2 check digits, then letters and digits)"
    country = compact[:2]
    length = IBAN_LENGTHS.get(country)
    if length is not None and len(compact) != length:
        return f"has {len(compact)} characters; {country} IBANs have {length}"
    if length is None and len(compact) not in IBAN_LENGTH_RANGE:
        return f"has {len(compact)} characters; IBANs have 15 to 34"
    rearranged = compact[4:] + compact[:4]
    if int(rearranged.translate(_IBAN_LETTERS)) % 97 != 1:
        return "fails the ISO 13616 mod-97 checksum"
    return None


def iban_is_valid(value: str) -> bool:
    return iban_problem(value) is None


def vat_ids(inv: invoice.Invoice) -> list[verdicts.FailedCheck]:
    """Each party's VAT id, when given, has the format of its country prefix."""
    failures = []
    for field, vat_id in (("supplier.vat_id", inv.supplier.vat_id), ("buyer.vat_id", inv.buyer.vat_id)):
        problem = None if vat_id is None else vat_id_problem(vat_id)
        if problem is not None:
            message = f"{field} {problem}"
            failures.append(verdicts.FailedCheck(check=VAT_ID_FORMAT, field=field, message=message))
    return failures


@functools.lru_cache(maxsize=IDENTIFIER_CACHE_SIZE)
def vat_id_problem(value: str) -> str | None:
    """What is wrong with a VAT id (spaces, dots, dashes and case ignored), or None if it looks valid."""
    compact = _VAT_ID_NOISE.sub("", value).upper()
    prefix = compact[:2] if _COUNTRY_PREFIX.match(compact) else ""
    known = VAT_ID_FORMATS.get(prefix)
    if known is not None:
        pattern, description = known
        return None if pattern.fullmatch(compact) else f"does not have the {prefix} format: {description}"
    if _VAT_ID_OTHER.fullmatch(compact[len(prefix):]):
        return None
    return "is not 4 to 14 letters and digits after its country prefix"


# ---------------------------------------------------------------------------------------------
# evidence
# ---------------------------------------------------------------------------------------------

def evidence(inv: invoice.Invoice, *, source_text: str) -> list[verdicts.FailedCheck]:
    """
    Every amount, the supplier's IBAN (when given) and the invoice number are quoted from the
    source, and the quote contains the value. Quotes for other fields must occur in the source
    too (a quote that is not in the document is a fabrication, whatever field it is for).
    """
    source = _Source(source_text)
    failures: list[verdicts.FailedCheck] = []
    required: dict[str, tuple[str, str]] = {}  # path -> (kind, value)
    required["invoice_number"] = ("text", inv.invoice_number)
    if inv.supplier.iban is not None:
        required["supplier.iban"] = ("iban", inv.supplier.iban)
    for index, line in enumerate(inv.lines):
        required[f"lines[{index}].amount"] = ("money", line.amount)
    for field in ("subtotal", "tax_total", "total"):
        required[field] = ("money", getattr(inv, field))

    for path, (kind, value) in required.items():
        quote = normalise_whitespace(inv.evidence.get(path, ""))
        if not quote:
            failures.append(verdicts.FailedCheck(
                check=EVIDENCE_MISSING, field=path, message=f"no evidence quotes the source for {path}",
            ))
        elif not source.quotes(quote):
            failures.append(_not_in_source(path, quote))
        elif not _supports(kind=kind, value=value, quote=quote):
            shown = "" if kind == "iban" else f" {value}"
            failures.append(verdicts.FailedCheck(
                check=EVIDENCE_MISMATCH,
                field=path,
                message=f"the evidence for {path} does not contain the extracted value{shown}",
            ))
    for path in sorted(inv.evidence.keys() - required.keys()):
        quote = normalise_whitespace(inv.evidence[path])
        if quote and not source.quotes(quote):
            failures.append(_not_in_source(_shortened(path), quote))
    return failures


class _Source:
    """The source text as `evidence` looks quotes up in it: as written first, whitespace-normalised
    only for a quote not found as written. A quote is usually copied from the document as it is, and
    normalising a whole document (about 1 KB) cost more than judging all of its quotes.

    The answer is `quoted_in(quote, normalise_whitespace(text))` either way: a normalised quote
    found as written, at a place that does not cut a number, is in the normalised text too (its
    single spaces between non-blank characters are runs of one, which normalising keeps) and
    cuts no number there either (a neighbour that is a digit or a separator is not blank, so it
    is the same neighbour in both texts; a blank neighbour is a space in both, or the text's end)."""

    __slots__ = ("_normalised", "_text")

    def __init__(self, text: str) -> None:
        self._text = text
        self._normalised: str | None = None

    def quotes(self, quote: str) -> bool:
        """Whether the (whitespace-normalised) `quote` occurs in the text: see `quoted_in`."""
        if quoted_in(quote, self._text):
            return True
        if self._normalised is None:
            self._normalised = normalise_whitespace(self._text)
        return quoted_in(quote, self._normalised)


def _not_in_source(path: str, quote: str) -> verdicts.FailedCheck:
    return verdicts.FailedCheck(
        check=EVIDENCE_NOT_IN_SOURCE,
        field=path,
        message=f"the evidence for {path} ({len(quote)} characters) does not occur in the source text",
    )


def _supports(*, kind: str, value: str, quote: str) -> bool:
    """Whether `quote` (whitespace-normalised: `evidence` normalised it already) contains `value`."""
    if kind == "money":
        # `in` over the readings stops at the first that equals the value: number_values(quote)
        # would give the same answer after reading every number of the quote.
        return invoice.money(value) in _number_readings(quote)
    if kind == "iban":
        return _compact(value).upper() in _compact(quote).upper()
    return _compact(value) in _compact(quote)


def _compact(text: str) -> str:
    return "".join(text.split())


def normalise_whitespace(text: str) -> str:
    """Collapse every run of whitespace (newlines, tabs, no-break spaces) to one space; strip the ends."""
    return " ".join(text.split())


def quoted_in(quote: str, source: str) -> bool:
    """
    Whether `quote` occurs in `source` (both whitespace-normalised) somewhere it does not cut a
    number in two: a quote that starts or ends with a digit must not continue a digit run of
    the source (`1.234,5` in `1.234,56`, `34,56` in `1.234,56`). A space does not join numbers
    here, since it also separates them (`Qty 2 10,00`).
    """
    if not quote:
        return True
    start = source.find(quote)
    while start != -1:
        end = start + len(quote)
        cuts_before = quote[0] in _DIGITS and _continues_number(source[max(0, start - 2):start][::-1])
        cuts_after = quote[-1] in _DIGITS and _continues_number(source[end:end + 2])
        if not (cuts_before or cuts_after):
            return True
        start = source.find(quote, start + 1)
    return False


def _continues_number(neighbours: str) -> bool:
    """`neighbours`: the (up to) two characters next to a quote's edge, nearest first."""
    if neighbours[:1] in _DIGITS:
        return True
    return len(neighbours) == 2 and neighbours[0] in _NUMBER_JOINERS and neighbours[1] in _DIGITS


def number_values(text: str) -> frozenset[decimal.Decimal]:
    """
    Every number `text` can be read as, whatever the locale's separators: `1.234,56`,
    `1,234.56`, `1234.56`, `1 234,56` and `1'234.56` all give 1234.56. An ambiguous token
    gives each reading (`1.234` gives 1234 and 1.234). A minus sign right before a number
    makes it negative unless it is a hyphen (`INV-100`, `2024-100`); a parenthesised number
    (accounting style) counts both ways.
    """
    return frozenset(_number_readings(normalise_whitespace(text)))


def _number_readings(text: str) -> Iterator[decimal.Decimal]:
    """The values of `number_values(text)` one by one, some more than once; `text` whitespace-normalised."""
    for match in _NUMBER_RUN.finditer(text):
        start = match.start()
        previous = text[start - 1] if start else ""
        negative = previous in _SIGNS and not text[max(0, start - 2):start - 1].isalnum()  # not a hyphen: `INV-100`
        parenthesised = previous == "(" and text[match.end():match.end() + 1] == ")"
        token = match.group()
        if " " not in token:  # the usual case: one group, read whole
            for value in _readings(token):
                yield -value if negative else value
                if parenthesised:
                    yield -value
            continue
        parts = token.split(" ")
        for first in range(len(parts)):
            for last in range(first + 1, min(first + _MAX_SPACE_GROUPS, len(parts)) + 1):
                signed = first == 0 and negative
                whole = first == 0 and last == len(parts) and parenthesised
                for value in _readings(" ".join(parts[first:last])):
                    yield -value if signed else value
                    if whole:
                        yield -value


def _readings(token: str) -> list[decimal.Decimal]:
    """Each way to read a token of digit groups and separators (`.`, `,`, apostrophes, space)."""
    if token.isdigit():  # no separator (the token holds ASCII digits and separators only)
        return [decimal.Decimal(token)]
    separator = token.strip(_DIGIT_STRING)
    if len(separator) == 1:  # one separator: what the general case below gives, without the regex
        head, _, tail = token.partition(separator)
        readings = [decimal.Decimal(head + tail)] if len(head) <= 3 and len(tail) == 3 else []
        if separator in ".,":
            readings.append(decimal.Decimal(head + "." + tail))
        return readings
    pieces = _NUMBER_SEPARATOR.split(token)
    groups, separators = pieces[0::2], pieces[1::2]
    readings = []
    if _grouped(groups, separators):  # every separator groups thousands
        readings.append(decimal.Decimal("".join(groups)))
    point = separators[-1]
    if point in ".," and (
        len(separators) == 1 or (_grouped(groups[:-1], separators[:-1]) and point not in separators[:-1])
    ):  # the last separator is the decimal point, the others group thousands
        readings.append(decimal.Decimal("".join(groups[:-1]) + "." + groups[-1]))
    return readings


def _grouped(groups: Sequence[str], separators: Sequence[str]) -> bool:
    """One kind of separator, a first group of 1-3 digits and groups of 3 after it."""
    if not separators or separators.count(separators[0]) != len(separators) or not 1 <= len(groups[0]) <= 3:
        return False
    return all(len(group) == 3 for group in groups[1:])
