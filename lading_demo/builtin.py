"""
The builtin provider: a deterministic, offline, rule-based invoice extractor.

It exists so that Lading can be demonstrated, tested and benchmarked on a laptop with no
model server: `provider: builtin` in an InferencePool. It is NOT the product's model path
and makes no claim to read arbitrary invoices; it reads the layouts that
`lading_demo.generator` renders (and ones built the same way) with regular expressions
and line parsing, from the text alone. It never sees the generator's ground truth.

What it reads, in this order:

    table        the first line items table: a whitespace-aligned table under a header
                 row ("Description  Qty  Unit Price  VAT %  Amount"), a boxed `| ... |`
                 table, or numbered records under an "Items:" heading
                 ("2 pcs x 149.90 = 299.80 (VAT 20%)"); a line without numbers right after
                 an item continues its description; a table without a rate column takes
                 the rate of the document's only tax line ("VAT 20%")
    totals       lines after the table ending in an amount whose label (rates and
                 punctuation removed) is a known subtotal / tax / total label
    header       "Label: value" fields, two per line, or a label with its value below it
                 (columns); a label counts only where a field can start (line start, after
                 two spaces or a `|`), so "Delivery Date" is not read as "Date"
    parties      labelled blocks ("Supplier:", "Bill To:", side by side or stacked), or an
                 unlabelled letterhead on top for the supplier; VAT ids by block
    IBAN         the first "IBAN" followed by an IBAN of its country's length

Every value comes with `evidence[path]`: the exact substring of the source text it was read
from (a description continued on the next line quotes the whole span). Amounts are returned
as "1234.56" whatever the document's separators. Nothing is checked here: arithmetic,
checksums and evidence are the validation policy's business, so a misprinted total is
extracted as printed. A document missing a required field is TERMINAL
`UNREADABLE_DOCUMENT`; error messages name fields, never document text.

The token counts it reports are estimates (about four characters per token), so that rate
limits and metrics have something to count in demos.
"""

# ruff: noqa: RUF001  (the Turkish dotless i and the multiplication sign are meant, not confusables)

from __future__ import annotations

import asyncio
import bisect
import datetime as dt
import decimal
import functools
import json
import re
from collections.abc import Iterable, Sequence
from typing import Any

import pydantic

from lading.models import invoice
from lading.providers import base

UNSUPPORTED_SCHEMA = base.UNSUPPORTED_SCHEMA
UNREADABLE_DOCUMENT = "UNREADABLE_DOCUMENT"

CHARS_PER_TOKEN = 4
"""For the estimated token counts: a common rule of thumb for Latin-script text."""


class BuiltinProvider:
    """The offline demo/test extractor behind `provider: builtin` (see the module docstring)."""

    def __init__(self, *, latency_s: float = 0.0) -> None:
        self.latency_s = latency_s
        """Simulated model latency per call, for demos and benchmarks; 0 answers at once."""

    async def extract(self, document: base.Document, *, schema: str, policy: str) -> base.Outcome:
        """Extract `document`; `policy` is not consulted (validation runs after any provider)."""
        if schema != invoice.SCHEMA_NAME:
            return base.Outcome.failed(
                base.OutcomeClass.TERMINAL,
                error_class=UNSUPPORTED_SCHEMA,
                error=f"the builtin provider only extracts {invoice.SCHEMA_NAME}",
            )
        if self.latency_s > 0:
            await asyncio.sleep(self.latency_s)
        return extract_text(document.text)


def extract_text(text: str) -> base.Outcome:
    """Read an invoice.v1 result from OCR text; the whole provider minus latency, synchronous."""
    reader = _Reader(text)
    missing = reader.read()
    if missing:
        return base.Outcome.failed(
            base.OutcomeClass.TERMINAL,
            error_class=UNREADABLE_DOCUMENT,
            error="could not find " + ", ".join(missing),
        )
    try:
        result = invoice.Invoice.model_validate(reader.result()).to_json()
    except pydantic.ValidationError as exc:
        errors = exc.errors(include_input=False)
        places = sorted({".".join(str(part) for part in error["loc"]) for error in errors})
        return base.Outcome.failed(
            base.OutcomeClass.TERMINAL,
            error_class=UNREADABLE_DOCUMENT,
            error="what was read does not fit invoice.v1 at " + ", ".join(places[:10]),
        )
    tokens_out = len(json.dumps(result, ensure_ascii=False)) // CHARS_PER_TOKEN + 1
    return base.Outcome.ok(result, tokens_in=len(text) // CHARS_PER_TOKEN + 1, tokens_out=tokens_out)


# ---------------------------------------------------------------------------------------------
# vocabulary
# ---------------------------------------------------------------------------------------------

_HEADER_LABELS = {
    "invoice_number": (
        "Invoice No", "Invoice Number", "Invoice #", "Invoice Nr", "Fatura No",
        "Fatura Numarası", "Belge No", "Rechnungsnummer", "Rechnung Nr.", "Rechnungs-Nr.", "Rechnungsnr.",
    ),
    "issue_date": (
        "Invoice Date", "Issue Date", "Date", "Fatura Tarihi", "Düzenleme Tarihi", "Tarih", "Rechnungsdatum",
        "Datum",
    ),
    "due_date": (
        "Due Date", "Payment Due", "Due", "Vade Tarihi", "Son Ödeme Tarihi", "Vade", "Fällig am",
        "Fälligkeitsdatum", "Zahlbar bis", "Fällig",
    ),
    "currency": ("Currency", "Para Birimi", "Döviz Cinsi", "Döviz", "Währung"),
}
_PARTY_LABELS = {
    "supplier": (
        "Supplier", "From", "Seller", "Vendor", "Satıcı", "Düzenleyen", "Lieferant", "Verkäufer",
        "Rechnungssteller",
    ),
    "buyer": (
        "Bill To", "Billed To", "Customer", "Buyer", "Sold To", "Alıcı", "Sayın", "Müşteri",
        "Rechnungsempfänger", "Kunde", "An",
    ),
}
_VAT_LABELS = (
    "VAT ID", "VAT No", "VAT Number", "VAT Reg. No", "VAT Reg No", "VAT Registration No", "Tax ID", "VKN",
    "V.K.N.", "Vergi No", "Vergi Kimlik No", "Vergi Numarası", "USt-IdNr.", "USt-ID", "USt.-IdNr.", "UID",
)
_TOTAL_LABELS = {
    "subtotal": (
        "subtotal", "sub total", "net amount", "net total", "total excl vat", "ara toplam",
        "mal hizmet toplam tutarı", "toplam tutar kdv hariç", "zwischensumme", "nettobetrag", "summe netto",
    ),
    "tax": (
        "vat", "tax", "kdv", "hesaplanan kdv", "mwst", "ust", "umsatzsteuer", "zzgl mwst", "zzgl ust",
        "zzgl umsatzsteuer",
    ),
    "tax_total": (
        "total vat", "vat total", "total tax", "tax total", "toplam kdv", "kdv toplamı", "mwst gesamt",
        "summe mwst", "umsatzsteuer gesamt", "ust gesamt",
    ),
    "total": (
        "total", "total due", "amount due", "grand total", "total incl vat", "genel toplam", "ödenecek tutar",
        "vergiler dahil toplam tutar", "gesamtbetrag", "rechnungsbetrag", "summe brutto", "endbetrag",
    ),
}
_COLUMN_LABELS = {
    "desc": (
        "Description", "Item", "Article", "Product", "Açıklama", "Mal Hizmet", "Ürün", "Beschreibung",
        "Bezeichnung", "Artikel", "Leistung",
    ),
    "qty": ("Qty", "Quantity", "Miktar", "Menge", "Anzahl", "Anz."),
    "price": ("Unit Price", "Price", "Birim Fiyat", "Einzelpreis", "E-Preis", "Preis"),
    "rate": (
        "VAT %", "VAT", "VAT Rate", "Tax %", "Tax", "KDV %", "KDV Oranı", "KDV", "MwSt.", "MwSt. %", "MwSt",
        "USt. %", "USt.", "USt",
    ),
    "tax": ("KDV Tutarı", "VAT Amount", "Tax Amount", "MwSt.-Betrag", "USt.-Betrag"),
    "amount": (
        "Amount", "Line Total", "Total", "Tutar", "Mal Hizmet Tutarı", "Betrag", "Gesamtpreis", "Gesamt",
    ),
    "no": ("#", "No", "No.", "Sıra No", "Sıra", "Pos.", "Pos"),
}
_ITEMS_HEADINGS = frozenset({
    "items", "line items", "products", "services", "kalemler", "mal ve hizmetler", "positionen", "leistungen",
})
_MONTHS = {
    name: number
    for names in (
        ("january", "february", "march", "april", "may", "june", "july", "august", "september", "october",
         "november", "december"),
        ("ocak", "şubat", "mart", "nisan", "mayıs", "haziran", "temmuz", "ağustos", "eylül", "ekim", "kasım",
         "aralık"),
        ("januar", "februar", "märz", "april", "mai", "juni", "juli", "august", "september", "oktober",
         "november", "dezember"),
    )
    for number, name in enumerate(names, start=1)
}
_CURRENCY_MARKS = {"TL": "TRY", "₺": "TRY", "€": "EUR", "$": "USD", "£": "GBP"}
_IBAN_LENGTHS = {"TR": 26, "DE": 22, "GB": 22, "FR": 27, "NL": 18, "AT": 20, "CH": 21, "IT": 27, "ES": 24}


def _key(label: str) -> str:
    """A label as a lookup key: lower case (Turkish İ too), single spaces."""
    return " ".join(label.replace("İ", "i").lower().split())


def _alternation(labels: Iterable[str], *, blanks: str = r"[ \t]+") -> str:
    """
    Lower-case labels, longest first (`Due Date` wins over `Due`), `blanks` between words.
    Label patterns run over the lower-cased text: re.IGNORECASE is several times slower.
    """
    ordered = sorted({_key(label) for label in labels}, key=len, reverse=True)
    return "|".join(blanks.join(re.escape(word) for word in label.split()) for label in ordered)


def _flat(table: dict[str, tuple[str, ...]]) -> list[str]:
    return [label for labels in table.values() for label in labels]


def _lookup(table: dict[str, tuple[str, ...]]) -> dict[str, str]:
    return {_key(label): role for role, labels in table.items() for label in labels}


_HEADER_ROLE = _lookup(_HEADER_LABELS)
_PARTY_ROLE = _lookup(_PARTY_LABELS)
_TOTAL_ROLE = {label: role for role, labels in _TOTAL_LABELS.items() for label in labels}
_COLUMN_ROLE = _lookup(_COLUMN_LABELS)

# ---------------------------------------------------------------------------------------------
# patterns
# ---------------------------------------------------------------------------------------------

_MONEY = r"(?<![\d.,])(?:\d{1,3}(?:\.\d{3})+,\d{2}|\d{1,3}(?:,\d{3})+\.\d{2}|\d+[.,]\d{2})(?!\d)"
_QTY = r"\d{1,6}(?:[.,]\d{1,3})?"
_RATE = r"(?:%[ \t]?\d{1,2}(?:[.,]\d{1,2})?|\d{1,2}(?:[.,]\d{1,2})?[ \t]?%)"
_CUR = r"(?:(?<![A-Za-z])(?:TRY|EUR|USD|GBP|CHF|JPY|TL)(?![A-Za-z])|[€$£₺])"

_AMOUNT_AT_END = re.compile(
    rf"(?:(?P<pre>{_CUR})[ \t]*)?(?P<money>{_MONEY})(?:[ \t]*(?P<post>{_CUR}))?[ \t.]*$")
_AMOUNT_TAIL = 40
"""Characters at the end of a line that can hold an amount with its currency (15 digits, groups, mark)."""
_RATE_IN_LABEL = re.compile(r"%\s*\d+(?:[.,]\d+)?|\d+(?:[.,]\d+)?\s*%")
_NOT_LETTERS = re.compile(r"[\W\d_]+")
_CURRENCY_ANYWHERE = re.compile(_CUR)

_HEADER_LABEL = re.compile(  # no (?<!\w) here: it defeats the regex engine's first-character scan
    rf"(?:{_alternation(_flat(_HEADER_LABELS))})(?!\w)",
)
_SEPARATOR = re.compile(r"[ \t]*[.:#;,]*[ \t]*")
_NUMBER_VALUE = re.compile(r"(?=[A-Z0-9/\-]*\d)[A-Z0-9](?:[A-Z0-9]|[\-/](?=[A-Z0-9])){2,40}(?![\w\-/])")
_DATE_VALUE = re.compile(
    r"(?P<d>\d{1,2})\.(?P<m>\d{1,2})\.(?P<y>\d{4})(?!\d)"
    r"|(?P<Y>\d{4})-(?P<M>\d{1,2})-(?P<D>\d{1,2})(?!\d)"
    r"|(?P<ld>\d{1,2})\.?[ \t]+(?P<mon>[^\W\d_]{3,10})\.?[ \t]+(?P<ly>\d{4})(?!\d)"
)
_CURRENCY_VALUE = re.compile(r"[A-Z]{3}(?![A-Za-z])")
_VALUE_PATTERNS = {
    "invoice_number": _NUMBER_VALUE,
    "issue_date": _DATE_VALUE,
    "due_date": _DATE_VALUE,
    "currency": _CURRENCY_VALUE,
}
_CHUNK = re.compile(r"\S+(?: \S+)*")

_PARTY_LINE = re.compile(
    rf"[ \t]*(?P<label>{_alternation(_flat(_PARTY_LABELS))})"
    r"[ \t]*(?::[ \t]*(?P<rest>.*?))?[ \t]*$",
)
_PARTY_PAIR = re.compile(
    rf"[ \t]*(?P<left>{_alternation(_flat(_PARTY_LABELS))})[ \t]*:?"
    rf"[ \t]{{2,}}(?P<right>{_alternation(_flat(_PARTY_LABELS))})"
    r"[ \t]*:?[ \t]*$",
)
_VAT_LABEL = re.compile(rf"(?:{_alternation(_VAT_LABELS)})(?!\w)")
_VAT_VALUE = re.compile(r"[ \t]*[.:#]*[ \t]*(?P<value>(?:[A-Z]{2}[ \t]?)?\d(?:[ \t]?\d){7,13})(?!\d)")
_IBAN_LABEL = re.compile(r"iban(?!\w)[ \t]*(?:no\.?)?[ \t]*[:.]?[ \t]*")
_DIGIT = re.compile(r"\d")
_IBAN_START = re.compile(r"[A-Z]{2}\d{2}")

_COLUMN_LABEL = re.compile(  # one blank inside a column header: two or more separate columns
    rf"(?:{_alternation(_flat(_COLUMN_LABELS), blanks=' ')})(?!\w)",
)
_RULE = re.compile(r"[ \t]*[-=_+|.]{3,}[ \t]*|[ \t]*\+[-=+]*\+?[ \t]*")
_RECORD_START = re.compile(r"[ \t]*\d{1,3}[.)][ \t]+(?P<desc>\S.*?)[ \t]*$")
_RECORD_NUMBERS = re.compile(
    rf"[ \t]*(?P<qty>{_QTY})(?:[ \t]*[^\W\d_][^\s]*)?[ \t]*[x×*][ \t]*(?:{_CUR}[ \t]*)?(?P<price>{_MONEY})"
    rf"(?:[ \t]*{_CUR})?[ \t]*=[ \t]*(?:{_CUR}[ \t]*)?(?P<amount>{_MONEY})(?:[ \t]*{_CUR})?[ \t]*"
    rf"[(\[]?[ \t]*(?:[^\W\d_][^\s%()]*[ \t]*)?(?P<rate>{_RATE})[ \t]*[)\]]?[ \t]*$"
)
_ROLE_PATTERNS = {
    "no": r"\d{1,4}\.?",
    "desc": r"\S(?:.*?\S)?",
    "qty": _QTY,
    "price": _MONEY,
    "rate": _RATE,
    "tax": _MONEY,
    "amount": _MONEY,
}
_CELL_PATTERNS = {role: re.compile(pattern) for role, pattern in _ROLE_PATTERNS.items()}
_NUMERIC_ROLES = ("qty", "price", "rate", "tax", "amount")


@functools.lru_cache(maxsize=64)
def _row_pattern(roles: tuple[str, ...]) -> re.Pattern[str]:
    """One table row for these columns, anchored at both ends; the description is lazy."""
    parts = [r"[ \t]*"]
    for index, role in enumerate(roles):
        if index:
            wide = "desc" in (role, roles[index - 1]) or roles[index - 1] == "no"
            parts.append(r"[ \t]{2,}" if wide else r"[ \t]+")
        parts.append(f"(?P<{role}>{_ROLE_PATTERNS[role]})")
    parts.append(r"[ \t]*$")
    return re.compile("".join(parts))


# ---------------------------------------------------------------------------------------------
# reading
# ---------------------------------------------------------------------------------------------

Span = tuple[int, int]


class _Item:
    def __init__(self, *, desc: list[Span], qty: Span, price: Span, rate: Span | None, amount: Span) -> None:
        self.desc = desc
        self.qty = qty
        self.price = price
        self.rate = rate
        self.amount = amount


class _Reader:
    """One pass over one text; `read()` fills values and evidence and says what is missing."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.lower = _lowered(text)
        self.lines = _line_spans(text)
        self.values: dict[str, Any] = {}
        self.evidence: dict[str, str] = {}
        self.items: list[_Item] = []
        self.tax_rates: list[Span] = []
        """Rates printed in tax lines (`VAT 20%`): the line rate when the table has no rate column."""
        self.point = "."

    # -- the steps -----------------------------------------------------------------------------

    def read(self) -> list[str]:
        header_at, kind, roles = self._find_table()
        totals_at = self._read_totals(after=header_at)
        if header_at is not None and kind is not None:
            self._read_items(kind=kind, roles=roles, start=header_at + 1, stop=totals_at)
        skip = (self.lines[header_at][0], self._line_start(totals_at)) if header_at is not None else (0, 0)
        self._read_header_fields(skip=skip)
        self._read_parties(stop=header_at if header_at is not None else len(self.lines))
        self._read_iban()
        if "currency" not in self.values:
            self._read_currency_marks(start=header_at or 0)
        required = ("invoice_number", "issue_date", "currency", "supplier.name", "buyer.name", "subtotal",
                    "tax_total", "total")
        missing = [field for field in required if field not in self.values]
        if not self.items:
            missing.append("lines")
        elif any(item.rate is None for item in self.items):
            if len({_rate(self._slice(span)) for span in self.tax_rates}) == 1:
                for item in self.items:
                    item.rate = item.rate or self.tax_rates[0]
            else:
                missing.append("lines[].tax_rate")
        return missing

    def result(self) -> dict[str, Any]:
        """The invoice.v1 document with its evidence; only after `read()` found nothing missing."""
        values = self.values
        lines = []
        for index, item in enumerate(self.items):
            description = " ".join(self._slice(span) for span in item.desc)
            lines.append({
                "description": description,
                "quantity": _quantity(self._slice(item.qty), point=self.point),
                "unit_price": _money(self._slice(item.price)),
                "amount": _money(self._slice(item.amount)),
                "tax_rate": _rate(self._slice(item.rate or (0, 0))),  # read() has set every rate
            })
            self.evidence[f"lines[{index}].description"] = self.text[item.desc[0][0]:item.desc[-1][1]]
            for field, span in (("quantity", item.qty), ("unit_price", item.price), ("amount", item.amount),
                                ("tax_rate", item.rate or (0, 0))):
                self.evidence[f"lines[{index}].{field}"] = self._slice(span)
        return {
            "invoice_number": values["invoice_number"],
            "issue_date": values["issue_date"],
            "due_date": values.get("due_date"),
            "currency": values["currency"],
            "supplier": {
                "name": values["supplier.name"],
                "vat_id": values.get("supplier.vat_id"),
                "iban": values.get("supplier.iban"),
            },
            "buyer": {"name": values["buyer.name"], "vat_id": values.get("buyer.vat_id")},
            "lines": lines,
            "subtotal": values["subtotal"],
            "tax_total": values["tax_total"],
            "total": values["total"],
            "evidence": self.evidence,
        }

    # -- table ---------------------------------------------------------------------------------

    def _find_table(self) -> tuple[int | None, str | None, tuple[str, ...]]:
        for index, (start, end) in enumerate(self.lines):
            line = self.text[start:end]
            stripped = line.strip()
            if not stripped:
                continue
            if stripped.startswith("|"):
                cells = [self._slice(span) for span in _pipe_cells(line, start)]
                roles = tuple(_COLUMN_ROLE.get(_key(cell), "") for cell in cells)
                if _usable_columns(roles):
                    return index, "pipe", roles
                continue
            if len(stripped) < 24 and _key(stripped.rstrip(":")) in _ITEMS_HEADINGS:
                return index, "records", ()
            if _DIGIT.search(line):
                continue
            lower = self.lower[start:end]
            matches = [m for m in _COLUMN_LABEL.finditer(lower) if not _inside_word(lower, m.start())]
            if len(matches) >= 4 and not _leftover(line, matches):
                roles = tuple(_COLUMN_ROLE.get(_key(match.group()), "") for match in matches)
                if _usable_columns(roles):
                    return index, "plain", roles
        return None, None, ()

    def _read_items(self, *, kind: str, roles: tuple[str, ...], start: int, stop: int) -> None:
        if kind == "records":
            self._read_records(start=start, stop=stop)
        elif kind == "pipe":
            self._read_pipe_rows(roles=roles, start=start, stop=stop)
        else:
            self._read_plain_rows(roles=roles, start=start, stop=stop)

    def _read_plain_rows(self, *, roles: tuple[str, ...], start: int, stop: int) -> None:
        pattern = _row_pattern(roles)
        for line_start, line_end in self.lines[start:stop]:
            line = self.text[line_start:line_end]
            if not line.strip() or _RULE.fullmatch(line):
                if self.items:
                    return
                continue
            match = pattern.match(line)
            if match is not None:
                spans = {role: (line_start + match.start(role), line_start + match.end(role))
                         for role in roles}
                self.items.append(_Item(desc=[spans["desc"]], qty=spans["qty"], price=spans["price"],
                                        rate=spans.get("rate"), amount=spans["amount"]))
            elif self.items:
                self.items[-1].desc.append(_stripped(line, line_start))

    def _read_pipe_rows(self, *, roles: tuple[str, ...], start: int, stop: int) -> None:
        for line_start, line_end in self.lines[start:stop]:
            line = self.text[line_start:line_end]
            if _RULE.fullmatch(line):
                continue
            if not line.lstrip().startswith("|"):
                if self.items:
                    return
                continue
            cells = _pipe_cells(line, line_start)
            if len(cells) != len(roles):
                continue
            spans = dict(zip(roles, cells, strict=True))
            numbers = {role: self._slice(span) for role, span in spans.items() if role in _NUMERIC_ROLES}
            if not self._slice(spans["desc"]):
                continue
            if not any(numbers.values()):
                if self.items:
                    self.items[-1].desc.append(spans["desc"])
                continue
            if all(_CELL_PATTERNS[role].fullmatch(value) for role, value in numbers.items()):
                self.items.append(_Item(desc=[spans["desc"]], qty=spans["qty"], price=spans["price"],
                                        rate=spans.get("rate"), amount=spans["amount"]))

    def _read_records(self, *, start: int, stop: int) -> None:
        pending: list[Span] | None = None
        for line_start, line_end in self.lines[start:stop]:
            line = self.text[line_start:line_end]
            numbers = _RECORD_NUMBERS.match(line)
            if numbers is not None:
                if pending:
                    spans = {role: (line_start + numbers.start(role), line_start + numbers.end(role))
                             for role in ("qty", "price", "rate", "amount")}
                    self.items.append(_Item(desc=pending, qty=spans["qty"], price=spans["price"],
                                            rate=spans["rate"], amount=spans["amount"]))
                pending = None
                continue
            first = _RECORD_START.match(line)
            if first is not None:
                pending = [(line_start + first.start("desc"), line_start + first.end("desc"))]
            elif pending is not None and line.strip():
                pending.append(_stripped(line, line_start))

    # -- totals --------------------------------------------------------------------------------

    def _read_totals(self, *, after: int | None) -> int:
        """Subtotal, tax total and total; returns the index of the first totals line."""
        first = len(self.lines)
        taxes: list[Span] = []
        tax_total: Span | None = None
        currency_spans: list[tuple[str, Span]] = []
        begin = 0 if after is None else after + 1
        for index in range(begin, len(self.lines)):
            start, end = self.lines[index]
            line = self.text[start:end]
            last = line.rstrip(" \t.")[-1:]
            if not (last.isdigit() or last.isupper() or last in "€$£₺"):
                continue
            tail = max(0, len(line) - _AMOUNT_TAIL)  # searching only the tail keeps this linear
            match = _AMOUNT_AT_END.search(line, tail)
            if match is None:
                continue
            role = _TOTAL_ROLE.get(_label_key(line[:match.start()]))
            if role is None:
                continue
            first = min(first, index)
            span = (start + match.start("money"), start + match.end("money"))
            for group in ("pre", "post"):
                if match.group(group) is not None:
                    currency_spans.append((role, (start + match.start(group), start + match.end(group))))
            if role in ("tax", "tax_total"):
                rate = _RATE_IN_LABEL.search(line, 0, match.start())
                if rate is not None:
                    self.tax_rates.append((start + rate.start(), start + rate.end()))
            if role == "tax":
                taxes.append(span)
            elif role == "tax_total":
                tax_total = tax_total or span
            elif role not in self.values:
                self._set(role, _money(self._slice(span)), span)
                if role == "total":
                    self.point = self._slice(span)[-3]
        if tax_total is None and len(taxes) == 1:
            tax_total = taxes[0]
        if tax_total is not None:
            self._set("tax_total", _money(self._slice(tax_total)), tax_total)
        currency_spans.sort(key=lambda pair: pair[0] != "total")
        if currency_spans:
            role, span = currency_spans[0]
            self._set_currency(span)
        return first

    # -- header fields -------------------------------------------------------------------------

    def _read_header_fields(self, *, skip: Span) -> None:
        starts = [start for start, _ in self.lines]
        for match in _HEADER_LABEL.finditer(self.lower):
            if skip[0] <= match.start() < skip[1] or _inside_word(self.lower, match.start()):
                continue
            field = _HEADER_ROLE.get(_key(match.group()))
            if field is None or field in self.values:
                continue
            index = bisect.bisect_right(starts, match.start()) - 1
            if _field_start(self.text[starts[index]:match.start()]):
                self._read_field(field, line_index=index, label_start=match.start(), label_end=match.end())

    def _read_field(self, field: str, *, line_index: int, label_start: int, label_end: int) -> None:
        pattern = _VALUE_PATTERNS[field]
        line_end = self.lines[line_index][1]
        after = _SEPARATOR.match(self.text, label_end, line_end)
        position = after.end() if after is not None else label_end
        value = pattern.match(self.text, position, line_end)
        if value is None or not self._accept(field, value):
            value = None
            below = self._value_below(line_index=line_index, column=label_start - self.lines[line_index][0])
            if below is not None:
                value = pattern.match(self.text, below[0], below[1])
                if value is None or value.end() != below[1] or not self._accept(field, value):
                    value = None
        if value is None:
            return
        span = value.span()
        if field == "currency":
            self._set("currency", value.group(), span)
        else:
            self._set(field, value.group() if field == "invoice_number" else _date(value), span)

    def _accept(self, field: str, value: re.Match[str]) -> bool:
        return field not in ("issue_date", "due_date") or _date(value) is not None

    def _value_below(self, *, line_index: int, column: int) -> Span | None:
        """The chunk of the next non-blank line that starts under `column` (labels above values)."""
        for start, end in self.lines[line_index + 1:line_index + 3]:
            line = self.text[start:end]
            if not line.strip():
                continue
            for chunk in _CHUNK.finditer(line):
                if abs(chunk.start() - column) <= 2:
                    return start + chunk.start(), start + chunk.end()
            return None
        return None

    # -- parties -------------------------------------------------------------------------------

    def _read_parties(self, *, stop: int) -> None:
        segments = self._segments(stop=stop)
        labelled = any(
            (match := _PARTY_LINE.match(self.lower, start, end)) is not None
            and _PARTY_ROLE.get(_key(match.group("label"))) == "supplier"
            for start, end in segments
        )
        context: str | None = None if labelled else "supplier"
        awaiting: str | None = None
        for start, end in segments:
            segment = self.text[start:end]
            if not segment.strip():
                if awaiting is None:
                    context = None
                continue
            party = _PARTY_LINE.match(self.lower, start, end)
            if party is not None:
                role = _PARTY_ROLE.get(_key(party.group("label")))
                if role is not None:
                    context = role
                    rest = self._slice(party.span("rest")) if party.group("rest") else ""
                    if rest.strip(" .,;:'`·"):
                        self._read_inline_party(role, start=party.start("rest"), end=end)
                        awaiting = None
                    else:
                        awaiting = role
                    continue
            if awaiting is not None:
                span = _stripped(segment, start)
                self._set_once(f"{awaiting}.name", self._slice(span), span)
                awaiting = None
                continue
            if context == "supplier" and not labelled and "supplier.name" not in self.values:
                span = _stripped(segment, start)
                self._set_once("supplier.name", self._slice(span), span)
                continue
            if context is not None and f"{context}.vat_id" not in self.values:
                self._read_vat_id(context, start=start, end=end)

    def _read_inline_party(self, party: str, *, start: int, end: int) -> None:
        """`Buyer: Lading GmbH, USt-IdNr. DE123456789`: the name up to a VAT label, then the VAT id."""
        name_end = end
        for label in _VAT_LABEL.finditer(self.lower, start, end):
            if not _inside_word(self.lower, label.start()):
                name_end = label.start()
                break
        name = self.text[start:name_end].rstrip(" \t,;·(")
        if name:
            self._set_once(f"{party}.name", name, (start, start + len(name)))
        if f"{party}.vat_id" not in self.values:
            self._read_vat_id(party, start=name_end, end=end)

    def _read_vat_id(self, party: str, *, start: int, end: int) -> None:
        for label in _VAT_LABEL.finditer(self.lower, start, end):
            if _inside_word(self.lower, label.start()):
                continue
            value = _VAT_VALUE.match(self.text, label.end(), end)
            if value is not None:
                self._set(f"{party}.vat_id", "".join(value.group("value").split()), value.span("value"))
                return

    def _segments(self, *, stop: int) -> list[Span]:
        """Lines before the table; a side-by-side party block becomes its left then its right column."""
        segments: list[Span] = []
        index = 0
        while index < stop:
            start, end = self.lines[index]
            pair = _PARTY_PAIR.match(self.lower, start, end)
            if pair is None:
                segments.append((start, end))
                index += 1
                continue
            column = pair.start("right") - start
            left: list[Span] = [(start, pair.start("right"))]
            right: list[Span] = [(pair.start("right"), end)]
            index += 1
            while index < stop:
                start, end = self.lines[index]
                if not self.text[start:end].strip():
                    break
                left.append((start, min(start + column, end)))
                if end - start > column:
                    right.append((start + column, end))
                index += 1
            segments += [*left, (start, start), *right]
        return segments

    # -- IBAN and currency ----------------------------------------------------------------------

    def _read_iban(self) -> None:
        for label in _IBAN_LABEL.finditer(self.lower):
            if _inside_word(self.lower, label.start()):
                continue
            found = _read_iban(self.text, label.end())
            if found is not None:
                start, end, compact = found
                self._set("supplier.iban", compact, (start, end))
                return

    def _read_currency_marks(self, *, start: int) -> None:
        offset = self.lines[start][0] if start < len(self.lines) else 0
        mark = _CURRENCY_ANYWHERE.search(self.text, offset) or _CURRENCY_ANYWHERE.search(self.text)
        if mark is not None:
            self._set_currency(mark.span())

    def _set_currency(self, span: Span) -> None:
        mark = self._slice(span)
        self._set("currency", _CURRENCY_MARKS.get(mark, mark), span)

    # -- bookkeeping ---------------------------------------------------------------------------

    def _line_start(self, index: int) -> int:
        return self.lines[index][0] if index < len(self.lines) else len(self.text)

    def _slice(self, span: Span) -> str:
        return self.text[span[0]:span[1]]

    def _set(self, field: str, value: Any, span: Span) -> None:
        self.values[field] = value
        self.evidence[field] = self._slice(span)

    def _set_once(self, field: str, value: Any, span: Span) -> None:
        if field not in self.values:
            self._set(field, value, span)


# ---------------------------------------------------------------------------------------------
# small pure helpers
# ---------------------------------------------------------------------------------------------

def _lowered(text: str) -> str:
    """Lower case with every character kept in place (`İ` would otherwise become two)."""
    lower = text.replace("İ", "i").lower()
    if len(lower) == len(text):
        return lower
    return "".join(char if len(char.lower()) != 1 else char.lower() for char in text.replace("İ", "i"))


def _line_spans(text: str) -> list[Span]:
    """(start, end) of every line, without its line break (`\r\n` too)."""
    spans = []
    position = 0
    for line in text.split("\n"):
        end = position + len(line)
        spans.append((position, end - 1 if line.endswith("\r") else end))
        position = end + 1
    return spans


def _inside_word(text: str, position: int) -> bool:
    """Whether a match at `position` continues a word (the label patterns do not check this)."""
    return position > 0 and (text[position - 1].isalnum() or text[position - 1] == "_")


def _field_start(before: str) -> bool:
    """A label counts at a line start, after two blanks or after a `|` (`before`: the line up to it)."""
    return not before.strip() or before.endswith(("  ", "\t")) or before.rstrip().endswith("|")


def _leftover(line: str, matches: Sequence[re.Match[str]]) -> bool:
    """Whether anything but the matched labels, blanks and punctuation is on the line."""
    position = 0
    for match in matches:
        if line[position:match.start()].strip(" \t.:#|"):
            return True
        position = match.end()
    return bool(line[position:].strip(" \t.:#|"))


def _usable_columns(roles: Sequence[str]) -> bool:
    needed = {"desc", "qty", "price", "amount"}  # without a rate column, the one rate of the tax line
    return needed <= set(roles) and "" not in roles and len(set(roles)) == len(roles)


def _pipe_cells(line: str, offset: int) -> list[Span]:
    """Stripped cell spans between the first and last `|` of a boxed table row."""
    first, last = line.find("|"), line.rfind("|")
    cells = []
    position = first + 1
    while position <= last:
        bar = line.find("|", position)
        cell = line[position:bar]
        lead = len(cell) - len(cell.lstrip())
        cells.append((offset + position + lead, offset + position + len(cell.rstrip())
                      if cell.strip() else offset + position + lead))
        position = bar + 1
        if bar == last:
            break
    return cells


def _stripped(line: str, offset: int) -> Span:
    lead = len(line) - len(line.lstrip())
    return offset + lead, offset + len(line.rstrip())


def _label_key(label: str) -> str:
    """`Tax (20%):` -> `tax`, `zzgl. 19 % MwSt.` -> `zzgl mwst`, dot leaders gone."""
    label = _RATE_IN_LABEL.sub(" ", label.replace("İ", "i").lower())
    return _NOT_LETTERS.sub(" ", label).strip()


def _money(token: str) -> str:
    """`1.234,56` / `1,234.56` / `1234.56` -> `1234.56` (always two decimals)."""
    whole = token[:-3].replace(".", "").replace(",", "").lstrip("0") or "0"
    return f"{whole}.{token[-2:]}"


def _quantity(token: str, *, point: str) -> str:
    """A quantity in the document's convention (`point` from its total) -> `2.5`, `1500`."""
    grouping = "," if point == "." else "."
    plain = token.replace(grouping, "").replace(point, ".")
    try:
        return format(decimal.Decimal(plain).normalize(), "f")
    except decimal.InvalidOperation:
        return plain


def _rate(token: str) -> str:
    plain = token.replace("%", "").replace(",", ".").strip()
    try:
        return format(decimal.Decimal(plain).normalize(), "f")
    except decimal.InvalidOperation:
        return plain


def _date(match: re.Match[str]) -> dt.date | None:
    groups = match.groupdict()
    try:
        if groups["d"] is not None:
            return dt.date(int(groups["y"]), int(groups["m"]), int(groups["d"]))
        if groups["Y"] is not None:
            return dt.date(int(groups["Y"]), int(groups["M"]), int(groups["D"]))
        month = _MONTHS.get(groups["mon"].replace("İ", "i").lower())
        if month is None:
            return None
        return dt.date(int(groups["ly"]), month, int(groups["ld"]))
    except ValueError:
        return None


def _read_iban(text: str, position: int) -> tuple[int, int, str] | None:
    """An IBAN starting at `position`, blanks between groups allowed; None if it is not one."""
    if _IBAN_START.match(text, position) is None:
        return None
    country = text[position:position + 2]
    wanted = _IBAN_LENGTHS.get(country)
    limit = wanted or 34
    characters: list[str] = []
    index = end = position
    while index < len(text) and len(characters) < limit:
        char = text[index]
        if char.isascii() and (char.isdigit() or char.isupper()):
            characters.append(char)
            index += 1
            end = index
        elif (char == " " and text[index + 1:index + 2].isascii() and text[index + 1:index + 2].isalnum()
              and (wanted is not None or len(characters) % 4 == 0)):
            index += 1
        else:
            break
    if (wanted is not None and len(characters) != wanted) or len(characters) < 15:
        return None
    return position, end, "".join(characters)
