"""
The `invoice-strict-v2` policy: every field the ERP books is grounded in the document, in its role.

`invoice-strict-v1` proves that quoted amounts, the IBAN and the invoice number occur in the
document and add up. A model's answer can do all that and still book the wrong vendor, the
wrong currency or the wrong period. v2 runs every v1 check and then asks, for each booked
field, where on the page it came from and whether that place supports it in its role:

    currency             an ISO code or an unambiguous symbol next to the amounts (or in a
                         `Currency:` field) shows the booked currency; a document showing none
                         needs a default currency named by its pool; several
                         currencies are decided by the total's own line
    parties              supplier and buyer names and VAT ids occur in the document (VAT ids
                         with spaces, dots and dashes ignored) under their own role: a buyer
                         heading ("Bill to", "Rechnung an", "Sayın", "Facturé à", ...) for the
                         buyer; a seller heading, the letterhead, or the block holding the IBAN
                         for the supplier. Supplier and buyer differ. No role: review
    dates                issue and due date are printed dates that read as the booked date; a
                         date that reads two ways (04/03/2025) is read by the document's locale
                         (the supplier's country from its VAT id or IBAN, the document's
                         language) or goes to review; a date under another date's label
                         (delivery date as the issue date) fails; a due date printed nowhere
                         may follow from payment terms (`30 days`)
    tax                  each line's rate is printed (or follows from the totals when every
                         line has the same one); tax_total = sum of amount x rate within a
                         rounding cent per line
    identifiers          the IBAN is not in the buyer's block nor on a direct-debit line; the
                         invoice number is labelled as an invoice number, not an order or
                         customer number

Where the model quoted a field (`evidence[path]`), the quote is judged: it must occur in the
document and contain the value, and its place must support the role. Where it did not, the
policy finds the value in the document itself and judges the places it finds. Every failure
names the field, the quote and the document line (`FailedCheck.quote`, `.line`), so a
reviewer sees at once what to look at.

The cue words are in `lading.validation.cues`, the geometry in `.layout`, the date forms in
`.dates`. Everything here is linear in the document's size: one index per validation, then
lookups.
"""

# ruff: noqa: RUF001, RUF002  (the Turkish dotless i and the en dash are meant, not confusables)

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import functools
import re
from collections.abc import Callable, Sequence
from typing import Final

from lading.models import invoice
from lading.validation import checks, cues, dates, layout, verdicts

NAME: Final = "invoice-strict-v2"

# Stable check ids (`FailedCheck.check`) added by v2; v1's ids keep their meaning.
CURRENCY_NOT_SHOWN: Final = "currency_not_shown"
CURRENCY_NOT_GROUNDED: Final = "currency_not_grounded"
CURRENCY_AMBIGUOUS: Final = "currency_ambiguous"
PARTY_NOT_IN_SOURCE: Final = "party_not_in_source"
PARTY_ROLE: Final = "party_role"
PARTIES_IDENTICAL: Final = "parties_identical"
DATE_NOT_IN_SOURCE: Final = "date_not_in_source"
DATE_MISREAD: Final = "date_misread"
DATE_AMBIGUOUS: Final = "date_ambiguous"
DATE_ROLE: Final = "date_role"
TAX_RATE_NOT_IN_SOURCE: Final = "tax_rate_not_in_source"
TAX_TOTAL_RATES: Final = "tax_total_rates"
IDENTIFIER_ROLE: Final = "identifier_role"

TAX_TOLERANCE_PER_LINE: Final = decimal.Decimal("0.005")
"""Rounding one line's tax to cents moves the sum by at most half a cent; added to
checks.TOLERANCE per line when tax_total is compared with sum(amount x rate)."""

_HUNDRED = decimal.Decimal(100)
_PERCENT = re.compile(r"%[ \t]?(?P<a>\d{1,2}(?:[.,]\d{1,2})?)(?!\d)|(?<![\d.,])(?P<b>\d{1,2}(?:[.,]\d{1,2})?)[ \t]?%")
_AMOUNT_ON_LINE = re.compile(r"\d[.,]\d{2}(?!\d)")
_ISO_MARK = re.compile(rf"(?<![A-Za-z])(?:{layout.alternation(cues.ISO_CURRENCIES)})(?![A-Za-z])")
_SYMBOL_MARK = re.compile(r"US\$|[€£₺$¥]|(?<![A-Za-z])TL(?![A-Za-z])")
_MARK = re.compile(
    rf"(?P<iso>(?:{layout.alternation(cues.ISO_CURRENCIES)})(?<![A-Za-z][A-Z]{{3}})(?![A-Za-z]))"
    r"|(?P<symbol>US\$|[€£₺$¥]|TL(?<![A-Za-z]TL)(?![A-Za-z]))"
)
"""_ISO_MARK and _SYMBOL_MARK in one pass: no text is both (an ISO code is three letters, a symbol
holds no three letters) and none starts inside another, so the pass finds what the two patterns
find. The letter before a code is checked after the code (a cheap miss at most positions)."""
_TERM = re.compile(rf"(?<!\d)(?P<days>\d{{1,3}})[ \t]*(?:{'|'.join(cues.TERM_DAYS)})(?!\w)")
_LANGUAGE_WORDS: Final[dict[str, tuple[str, ...]]] = {}
for _language, _words in cues.LANGUAGE_CUES.items():
    for _word in _words:
        _LANGUAGE_WORDS[_word] = (*_LANGUAGE_WORDS.get(_word, ()), _language)
_LANGUAGE = re.compile(rf"(?<!\w)(?:{layout.alternation(_LANGUAGE_WORDS, blank=re.escape(' '))})(?!\w)")
_NUMBER_LABELS: Final[dict[str, Sequence[str]]] = {
    "invoice": cues.INVOICE_NUMBER_CUES,
    "other": cues.OTHER_NUMBER_CUES,
}
_DATE_LABELS: Final[dict[str, Sequence[str]]] = {
    "issue": cues.ISSUE_DATE_CUES,
    "due": cues.DUE_DATE_CUES,
    "other": cues.OTHER_DATE_CUES,
    "number": cues.INVOICE_NUMBER_CUES + cues.OTHER_NUMBER_CUES,
}
_CURRENCY_LABELS: Final[dict[str, Sequence[str]]] = {"currency": cues.CURRENCY_LABELS}


def run(result: object, source_text: str, *, default_currency: str | None = None) -> list[verdicts.FailedCheck]:
    """Every failed check of `invoice-strict-v2` (module docstring), in a stable order."""
    inv, failures = checks.schema(result)
    if inv is None:
        return failures
    judge = _Judge(inv, layout.Document(source_text), default_currency=default_currency)
    v1 = [
        *checks.line_amounts(inv),
        *checks.lines_sum_subtotal(inv),
        *checks.total_sum(inv),
        *checks.currency_allowed(inv),
        *checks.dates(inv),
        *checks.iban(inv),
        *checks.vat_ids(inv),
        *checks.evidence(inv, source_text=source_text),
    ]
    return [
        *(judge.located(failure) for failure in v1),
        *judge.currency(),
        *judge.parties(),
        *judge.dates(),
        *judge.tax(),
        *judge.identifiers(),
    ]


@dataclasses.dataclass(frozen=True)
class _Found:
    """Where a field's value is: in its quote's occurrences, or found in the document."""

    offsets: list[int]
    quote: str | None
    """The model's quote, or None when the policy searched the document itself."""
    failure: verdicts.FailedCheck | None = None
    """Why there is nowhere to judge (already reported by v1, or reported here)."""


class _Judge:
    def __init__(self, inv: invoice.Invoice, doc: layout.Document, *, default_currency: str | None) -> None:
        self.inv = inv
        self.doc = doc
        self.default_currency = default_currency
        self._printed_dates: list[dates.PrintedDate] | None = None
        self._country: tuple[str | None] | None = None
        self._locale: tuple[bool | None] | None = None
        self._amount_lines: dict[int, bool] = {}
        self._line_dates: dict[int, list[dates.PrintedDate]] = {}
        self._rates: set[decimal.Decimal] | None = None
        iban = inv.supplier.iban
        self.iban_offsets = doc.find_compact(iban) if iban else []

    # -- reporting ---------------------------------------------------------------------------

    def _quote_at(self, offset: int) -> str:
        return verdicts.shortened_quote(self.doc.line_text(self.doc.line_of(offset)))

    def _fail(
            self, check: str, field: str, message: str, *, quote: str | None = None, offset: int | None = None,
    ) -> verdicts.FailedCheck:
        shown = verdicts.shortened_quote(quote) if quote is not None else None
        if shown is None and offset is not None:
            shown = self._quote_at(offset)
        line = self.doc.line_number(offset) if offset is not None else None
        where = f' (quote "{shown}"' if shown is not None else ""
        if where:
            where += f", line {line})" if line is not None else ", not in the document)"
        elif line is not None:
            where = f" (line {line})"
        return verdicts.FailedCheck(check=check, field=field, message=f"{field}{where}: {message}",
                                    quote=shown, line=line)

    def located(self, failure: verdicts.FailedCheck) -> verdicts.FailedCheck:
        """A v1 failure with the quote of its field and the line the quote is on."""
        if failure.field is None:
            return failure
        quote = self.inv.evidence.get(failure.field)
        if not quote or not quote.strip():
            return failure
        spans = self.doc.find_quote(quote)
        line = self.doc.line_number(spans[0][0]) if spans else None
        return dataclasses.replace(failure, quote=verdicts.shortened_quote(quote), line=line)

    # -- finding values ----------------------------------------------------------------------

    def _find(self, path: str, finder: Callable[[tuple[int, int] | None], list[int]], what: str) -> _Found:
        quote = self.inv.evidence.get(path)
        if quote is not None and quote.strip():
            spans = self.doc.find_quote(quote)
            if not spans:
                return _Found([], quote, None)  # v1's evidence_not_in_source names it
            offsets = [offset for span in spans for offset in finder(span)]
            if not offsets:
                return _Found([], quote, self._fail(
                    checks.EVIDENCE_MISMATCH, path, f"the quote does not show the extracted {what}",
                    quote=quote, offset=spans[0][0],
                ))
            return _Found(offsets, quote)
        return _Found(finder(None), None)

    def _find_compact(self, value: str, within: tuple[int, int] | None) -> list[int]:
        return self.doc.find_compact(value, within=within)

    # -- currency ----------------------------------------------------------------------------

    def _supplier_country(self) -> str | None:
        if self._country is None:
            self._country = (self._read_supplier_country(),)
        return self._country[0]

    def _read_supplier_country(self) -> str | None:
        for value in (self.inv.supplier.vat_id, self.inv.supplier.iban):
            if value:
                compact = "".join(char for char in value if char.isalnum()).upper()
                if len(compact) > 2 and compact[:2].isalpha() and self.doc.find_compact(value):
                    return compact[:2]
        return None

    def _marks(self) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
        """(offset, currency) of each currency mark next to amounts or in a currency field, and
        (offset, mark) of marks that are ambiguous for this supplier (`$` in Canada)."""
        country = self._supplier_country()
        shown: list[tuple[int, str]] = []
        ambiguous: list[tuple[int, str]] = []
        text = self.doc.text
        matches = list(_MARK.finditer(text))
        for match in [m for m in matches if m.lastgroup == "iso"] + [m for m in matches if m.lastgroup != "iso"]:
            offset = match.start()  # ISO codes first, then symbols, each in document order
            if not self._amount_on_line(self.doc.line_of(offset)) and layout.classify_label(
                    self.doc.label_at(offset), _CURRENCY_LABELS) is None:
                continue
            mark = match.group()
            if (mark == "$" and country in cues.DOLLAR_COUNTRIES) or (mark == "¥" and country == "CN"):
                ambiguous.append((offset, mark))
            else:
                shown.append((offset, cues.CURRENCY_SYMBOLS.get(mark, mark)))
        return shown, ambiguous

    def _amount_on_line(self, line: int) -> bool:
        amounts = self._amount_lines.get(line)
        if amounts is None:
            amounts = self._amount_lines[line] = _AMOUNT_ON_LINE.search(self.doc.line_text(line)) is not None
        return amounts

    def currency(self) -> list[verdicts.FailedCheck]:
        inv = self.inv
        field = "currency"
        quote = inv.evidence.get(field)
        shown, ambiguous = self._marks()
        if quote is not None and quote.strip():
            spans = self.doc.find_quote(quote)
            if spans and not any(start <= offset < end and code == inv.currency
                                 for start, end in spans for offset, code in shown):
                return [self._fail(CURRENCY_NOT_GROUNDED, field,
                                   f"the quote shows no {inv.currency} code or symbol next to an amount",
                                   quote=quote, offset=spans[0][0])]
        codes = {code for _, code in shown}
        if not codes:
            if ambiguous:
                offset, mark = ambiguous[0]
                return [self._fail(CURRENCY_AMBIGUOUS, field,
                                   f"{mark} does not say which currency for a supplier in "
                                   f"{self._supplier_country()}; no ISO code is shown", offset=offset)]
            if self.default_currency is None:
                return [self._fail(CURRENCY_NOT_SHOWN, field,
                                   f"the document shows no currency code or symbol next to its amounts, and no "
                                   f"default currency is named; {inv.currency} is not grounded")]
            if self.default_currency != inv.currency:
                return [self._fail(CURRENCY_NOT_GROUNDED, field,
                                   f"the document shows no currency and the default currency is "
                                   f"{self.default_currency}, not {inv.currency}")]
            return []
        if inv.currency not in codes:
            offset, _ = shown[0]
            return [self._fail(CURRENCY_NOT_GROUNDED, field,
                               f"{inv.currency} is shown nowhere; the document shows {', '.join(sorted(codes))}",
                               offset=offset)]
        if len(codes) == 1:
            return []
        deciding = self._total_line_codes(shown)
        if deciding == {inv.currency}:
            return []
        offset, _ = shown[0]
        if deciding:
            return [self._fail(CURRENCY_NOT_GROUNDED, field,
                               f"the total is in {', '.join(sorted(deciding))}, not {inv.currency}", offset=offset)]
        return [self._fail(CURRENCY_AMBIGUOUS, field,
                           f"the document shows {', '.join(sorted(codes))} and neither its total's line nor a "
                           f"currency field says which one the invoice is in", offset=offset)]

    def _total_line_codes(self, shown: Sequence[tuple[int, str]]) -> set[str]:
        lines: set[int] = set()
        quote = self.inv.evidence.get("total")
        if quote:
            lines = {self.doc.line_of(start) for start, _ in self.doc.find_quote(quote)}
        codes = {code for offset, code in shown if self.doc.line_of(offset) in lines}
        if codes:
            return codes
        return {code for offset, code in shown
                if layout.classify_label(self.doc.label_at(offset), _CURRENCY_LABELS) is not None}

    # -- parties -----------------------------------------------------------------------------

    def parties(self) -> list[verdicts.FailedCheck]:
        inv = self.inv
        failures: list[verdicts.FailedCheck] = []
        wanted = (
            ("supplier.name", inv.supplier.name, cues.SUPPLIER, "name"),
            ("supplier.vat_id", inv.supplier.vat_id, cues.SUPPLIER, "VAT id"),
            ("buyer.name", inv.buyer.name, cues.BUYER, "name"),
            ("buyer.vat_id", inv.buyer.vat_id, cues.BUYER, "VAT id"),
        )
        for path, value, role, what in wanted:
            if value is None:
                continue
            found = self._find(path, functools.partial(self._find_compact, value), what)
            if found.failure is not None:
                failures.append(found.failure)
                continue
            if not found.offsets:
                if found.quote is None:
                    failures.append(self._fail(PARTY_NOT_IN_SOURCE, path,
                                               f"the {what} {_short(value)} does not occur in the document"))
                continue
            roles = [(offset, self.doc.role_at(offset, supplier_marks=self.iban_offsets))
                     for offset in found.offsets]
            if any(read.role == role for _, read in roles):
                continue
            offset, read = roles[0]
            if read.role is None:
                message = (f"the role of this {what} is unknown: it is {read.why}; a {role} must be quoted "
                           f"from {_ROLE_PLACES[role]}")
            else:
                message = f"this {what} is {read.why}, a {read.role} heading, not a {role}'s"
            failures.append(self._fail(PARTY_ROLE, path, message, quote=found.quote, offset=offset))
        if _same(inv.supplier.name, inv.buyer.name) or (
                inv.supplier.vat_id and inv.buyer.vat_id and _same(inv.supplier.vat_id, inv.buyer.vat_id)):
            failures.append(self._fail(PARTIES_IDENTICAL, "buyer.name",
                                       "supplier and buyer are the same party: an invoice has two",
                                       quote=inv.evidence.get("buyer.name")))
        return failures

    # -- dates -------------------------------------------------------------------------------

    def _dates(self) -> list[dates.PrintedDate]:
        """Every date printed in the document (read once, when a date is not quoted)."""
        if self._printed_dates is None:
            self._printed_dates = dates.find(self.doc.lower)
        return self._printed_dates

    def _dates_on_lines(self, spans: Sequence[tuple[int, int]]) -> list[dates.PrintedDate]:
        """The dates printed on the lines `spans` cover, in document order: a quoted date is looked
        for on its own lines only, each line read once per validation."""
        lines = sorted({line for start, end in spans
                        for line in range(self.doc.line_of(start), self.doc.line_of(max(start, end - 1)) + 1)})
        if self._printed_dates is not None:
            return [d for d in self._printed_dates if self.doc.line_of(d.start) in lines]
        found = []
        for line in lines:
            on_line = self._line_dates.get(line)
            if on_line is None:
                start, end = self.doc.line_span(line)
                on_line = self._line_dates[line] = dates.find(self.doc.lower, start=start, end=end)
            found.extend(on_line)
        return found

    def _day_first(self) -> bool | None:
        if self._locale is None:
            self._locale = (self._read_day_first(),)
        return self._locale[0]

    def _read_day_first(self) -> bool | None:
        country = self._supplier_country()
        if country is not None:
            return country not in cues.MONTH_FIRST_COUNTRIES
        counts: dict[str, int] = {}
        for match in _LANGUAGE.finditer(self.doc.lower):
            for language in _LANGUAGE_WORDS[match.group()]:
                counts[language] = counts.get(language, 0) + 1
        if not counts:
            return None
        top = max(counts.values())
        leaders = {language for language, count in counts.items() if count == top}
        return True if leaders <= cues.DAY_FIRST_LANGUAGES else None

    def dates(self) -> list[verdicts.FailedCheck]:
        inv = self.inv
        failures = []
        failure = self._date("issue_date", inv.issue_date, allowed={"issue", None, "number"})
        if failure is not None:
            failures.append(failure)
        if inv.due_date is not None:
            failure = self._date("due_date", inv.due_date, allowed={"due", None})
            if failure is not None and not self._due_from_terms():
                failures.append(failure)
        return failures

    def _date(self, path: str, value: dt.date, *, allowed: set[str | None]) -> verdicts.FailedCheck | None:
        quote = self.inv.evidence.get(path)
        if quote is not None and quote.strip():
            spans = self.doc.find_quote(quote)
            if not spans:
                return None  # v1's evidence_not_in_source names it
            candidates = [d for d in self._dates_on_lines(spans)
                          if any(start <= d.start and d.end <= end for start, end in spans)]
            if not candidates:
                return self._fail(DATE_NOT_IN_SOURCE, path, "the quote shows no date", quote=quote,
                                  offset=spans[0][0])
        else:
            candidates = [d for d in self._dates() if value in d.readings]
            if not candidates:
                return self._fail(DATE_NOT_IN_SOURCE, path, f"{value.isoformat()} is printed nowhere in the document")
        day_first = self._day_first() if any(d.ambiguous for d in candidates) else None  # only they need it
        reading = [(d, dates.resolve(d, day_first=day_first)) for d in candidates]
        fitting = [d for d, resolved in reading if resolved == value]
        labelled = [(d, layout.classify_label(self.doc.label_at(d.start), _DATE_LABELS))
                    for d in fitting]
        if any(label in allowed for _, label in labelled):
            return None
        if labelled:
            d, label = labelled[0]
            offset = d.start
            return self._fail(DATE_ROLE, path, f"the date is labelled as {_DATE_ROLE_NAMES.get(label, label)}",
                              quote=quote, offset=offset)
        unresolved = [d for d, resolved in reading if resolved is None and value in d.readings]
        if unresolved:
            d = unresolved[0]
            offset = d.start
            shown = self.doc.text[offset:offset + (d.end - d.start)]
            return self._fail(DATE_AMBIGUOUS, path,
                              f"{shown} reads as {_both(d)} and the document shows no locale (supplier country, "
                              f"language) that decides", quote=quote, offset=offset)
        d, resolved = reading[0]
        offset = d.start
        shown = self.doc.text[offset:offset + (d.end - d.start)]
        means = resolved.isoformat() if resolved is not None else _both(d)
        return self._fail(DATE_MISREAD, path, f"{shown} means {means} here, not {value.isoformat()}",
                          quote=quote, offset=offset)

    def _due_from_terms(self) -> bool:
        """Whether the due date is the issue date plus payment terms printed in the document."""
        inv = self.inv
        if inv.due_date is None:
            return False
        days = (inv.due_date - inv.issue_date).days
        return any(int(match.group("days")) == days for match in _TERM.finditer(self.doc.lower))

    # -- tax ---------------------------------------------------------------------------------

    def tax(self) -> list[verdicts.FailedCheck]:
        inv = self.inv
        failures = []
        rates = {invoice.money(line.tax_rate) for line in inv.lines}
        follows = len(rates) == 1 and self._rate_follows(next(iter(rates)))
        expected = decimal.Decimal(0)
        for index, line in enumerate(inv.lines):
            rate = invoice.money(line.tax_rate)
            expected += invoice.money(line.amount) * rate / _HUNDRED
            path = f"lines[{index}].tax_rate"
            quote = inv.evidence.get(path)
            if quote is not None and quote.strip():
                spans = self.doc.find_quote(quote)
                if spans and rate not in _percentages(quote) and rate not in checks.number_values(quote):
                    failures.append(self._fail(checks.EVIDENCE_MISMATCH, path,
                                               f"the quote does not show the rate {line.tax_rate}%",
                                               quote=quote, offset=spans[0][0]))
                continue
            if not follows and rate not in self._printed_rates():
                failures.append(self._fail(TAX_RATE_NOT_IN_SOURCE, path,
                                           f"the rate {line.tax_rate}% is printed nowhere and does not follow from "
                                           f"subtotal and tax_total"))
        tolerance = checks.TOLERANCE + TAX_TOLERANCE_PER_LINE * len(inv.lines)
        if abs(expected - invoice.money(inv.tax_total)) > tolerance:
            quote = inv.evidence.get("tax_total")
            spans = self.doc.find_quote(quote) if quote else []
            failures.append(self._fail(
                TAX_TOTAL_RATES, "tax_total",
                f"tax_total {inv.tax_total} is not the sum of line amount x rate "
                f"{expected.quantize(decimal.Decimal('0.01'))} (tolerance {tolerance})",
                quote=quote, offset=spans[0][0] if spans else None,
            ))
        return failures

    def _printed_rates(self) -> set[decimal.Decimal]:
        """Every percentage printed in the document, read once and only when a rate is not quoted:
        on the lines holding a `%` (a percentage never spans two lines)."""
        if self._rates is None:
            self._rates = set()
            text = self.doc.text
            lines: set[int] = set()
            sign = text.find("%")
            while sign != -1:
                lines.add(self.doc.line_of(sign))
                sign = text.find("%", sign + 1)
            for line in sorted(lines):
                start, end = self.doc.line_span(line)
                self._rates.update(_percentages(text, start=start, end=end))
        return self._rates

    def _rate_follows(self, rate: decimal.Decimal) -> bool:
        subtotal = invoice.money(self.inv.subtotal)
        tax_total = invoice.money(self.inv.tax_total)
        tolerance = checks.TOLERANCE + TAX_TOLERANCE_PER_LINE * len(self.inv.lines)
        return abs(subtotal * rate / _HUNDRED - tax_total) <= tolerance

    # -- identifiers -------------------------------------------------------------------------

    def identifiers(self) -> list[verdicts.FailedCheck]:
        inv = self.inv
        failures = []
        if inv.supplier.iban:
            iban = inv.supplier.iban
            found = self._find("supplier.iban", lambda within: self.doc.find_compact(iban, within=within), "IBAN")
            for offset in found.offsets[:1] if found.failure is None else ():
                read = self.doc.role_at(offset, supplier_marks=())
                if read.role == cues.BUYER or self.doc.debit_line(offset):
                    why = read.why if read.role == cues.BUYER else "on a direct-debit line"
                    failures.append(self._fail(IDENTIFIER_ROLE, "supplier.iban",
                                               f"this IBAN is {why}: it is the buyer's account, not the payee's",
                                               quote=found.quote, offset=offset))
        number = inv.invoice_number
        found = self._find("invoice_number", lambda within: self._find_number(number, within), "invoice number")
        if found.failure is None and found.quote is not None and found.offsets:  # unquoted: v1's evidence_missing
            labels = [(offset, layout.classify_by_occurrence(self.doc.label_at(offset), _NUMBER_LABELS))
                      for offset in found.offsets]
            if not any(label == "invoice" for _, label in labels):
                offset, label = labels[0]
                printed = self.doc.label_at(offset) or "none"
                why = (f"the number has no invoice-number label (label: {printed})" if label is None
                       else f"the number is labelled as another reference ({printed}), not the invoice number")
                failures.append(self._fail(IDENTIFIER_ROLE, "invoice_number", why, quote=found.quote, offset=offset))
        return failures

    def _find_number(self, number: str, within: tuple[int, int] | None) -> list[int]:
        found = self.doc.find_compact(number, within=within)
        if found:
            return found
        return [start for start, _ in self.doc.find_quote(number)
                if within is None or within[0] <= start < within[1]]


_ROLE_PLACES: Final = {
    cues.SUPPLIER: "under a seller heading, the letterhead or the block holding the IBAN",
    cues.BUYER: "under a buyer heading (Bill to, Rechnung an, Alıcı, Sayın, Facturé à, ...)",
}
_DATE_ROLE_NAMES: Final[dict[str | None, str]] = {
    "issue": "the issue date", "due": "the due date", "other": "another date (delivery, order)", "number": "a number",
}


def _percentages(text: str, *, start: int = 0, end: int | None = None) -> set[decimal.Decimal]:
    return {decimal.Decimal((m.group("a") or m.group("b")).replace(",", "."))
            for m in _PERCENT.finditer(text, start, len(text) if end is None else end)}


def _same(a: str, b: str) -> bool:
    return "".join(char for char in a.casefold() if char.isalnum()) == "".join(
        char for char in b.casefold() if char.isalnum())


def _short(value: str) -> str:
    return value if len(value) <= 64 else value[:63] + "\u2026"


def _both(printed: dates.PrintedDate) -> str:
    return " or ".join(sorted(d.isoformat() for d in printed.readings))
