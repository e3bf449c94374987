"""
Where things are on an invoice: the source text indexed once, so that `invoice-strict-v2` can
ask of any quote "which line is it on, under which heading, next to which label?".

An index is built per validation, in one linear pass over the text (plus one regex pass for
the cues of `lading.validation.cues`); every question after that is a dictionary or bisect
lookup, or one `str.find` over the index's normalised or compacted text. Nothing here judges:
`lading.validation.strict_v2` decides what a role or a label means for a field.

    lines     the text's lines; a quote's position maps back to its (1-based) line number
    blocks    runs of non-blank lines: a party's name, address and VAT id share a block
    cues      party and bank headings at the start of a field ("Bill To:", "Sayın",
              "Bankverbindung:"), with their column, so that side-by-side blocks
              (`Supplier:        Buyer:`) give each column its own role
    quotes    found whitespace-insensitively (runs of whitespace are one space), never cutting
              a number in two (`1.234,5` is not in `1.234,56`)
    compact   identifiers found with spaces, dots and dashes ignored (`GB 636 8905 03` is
              GB636890503) but only on whole tokens (a VAT id is not the start of an IBAN)

A role is read like a person reads it: the nearest heading above the value in its block (or
before it on its line) whose column is not right of the value's; with no heading, the first
block of the document that is not only a title is the supplier's letterhead, and a block that
holds the supplier's IBAN is the supplier's. On a document with no buyer heading at all, a
block before the first amount is the addressee (a letter's address field): the buyer.
Anything else has no role.
"""

# ruff: noqa: RUF001, RUF002  (the Turkish dotless i and the en dash are meant, not confusables)

from __future__ import annotations

import bisect
import dataclasses
import re
from collections.abc import Iterable, Sequence
from typing import Final

from lading.validation import cues

BANK: Final = "bank"
"""Role of a payment-details heading (`Bank details:`): the payee's account, not a party block."""

_MAX_ROLE_LOOKUP_LINES = 16
"""How far above a value a heading still counts: a party block is never taller."""
_COLUMN_SLACK = 2
"""A heading may start this many characters right of the value under it (OCR column drift)."""
_DIGITS = frozenset("0123456789")
_NUMBER_JOINERS = frozenset(".,'\u2019")
_FIELD_BREAK = re.compile(r"(?:[ \t]{2,}|\t|[|·•;])[ \t]*$")
_LABEL_TAIL = re.compile(r"(?:[^\W\d_][^\s]*)(?: [^\W\d_][^\s]*){0,5}$")
_LABEL_STRIP = " \t:.#-–|·•;,"
_CHUNK = re.compile(r"\S+(?: \S+)*")
_TOKEN = re.compile(r"\S+")
_ALNUM_RUN = re.compile(r"[^\W_]+")
"""Letters and digits: what identifiers are compared on (spaces, dots, dashes, slashes ignored)."""
_MONEY = re.compile(r"\d[.,]\d{2}(?![\d.,])")
_COLUMN_GAP = re.compile(r"[ \t]{3,}")
"""Three or more blanks inside a line separate side-by-side columns (a label and its value are
separated by at most two)."""


def lowered(text: str) -> str:
    """Lower case with every character kept in place (`İ` would otherwise become two characters)."""
    lower = text.replace("İ", "i").lower()
    if len(lower) == len(text):
        return lower
    return "".join(char if len(char.lower()) != 1 else char.lower() for char in text.replace("İ", "i"))


def _alternation(words: Iterable[str]) -> str:
    ordered = sorted(set(words), key=len, reverse=True)
    return "|".join(r"[ \t]+".join(re.escape(part) for part in word.split()) for word in ordered)


_PARTY_ROLE: Final = {word: role for role, words in cues.PARTY_CUES.items() for word in words}
_CUE_ROLE: Final = {**_PARTY_ROLE, **{word: BANK for word in cues.BANK_CUES}}
_CUE: Final = re.compile(rf"(?:{_alternation(_CUE_ROLE)})(?![\w.])")
_AFTER_CUE: Final = re.compile(r"[ \t]*:|[ \t]*$|[ \t]{2,}|[ \t]*\(")
_TITLE: Final = re.compile(rf"[ \t]*(?:(?:{_alternation(cues.TITLE_CUES)})[ \t]*)+[:.]?[ \t]*")
_DEBIT: Final = re.compile(rf"(?<!\w)(?:{_alternation(cues.DEBIT_CUES)})(?!\w)")


@dataclasses.dataclass(frozen=True)
class Cue:
    line: int
    """0-based line index."""
    column: int
    role: str
    """`supplier`, `buyer` or `bank`."""
    text: str
    """The heading as printed."""


@dataclasses.dataclass(frozen=True)
class Role:
    role: str | None
    """`supplier`, `buyer`, `bank`, or None when nothing says."""
    why: str
    """How the role was read, for messages: `under "Bill To:" (line 7)`, `the letterhead`."""


class Document:
    """One source text, indexed for `invoice-strict-v2` (see the module docstring)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.lower = lowered(text)
        self.line_starts = [0]
        self.line_starts.extend(match.end() for match in re.finditer(r"\n", text))
        self._blank = [not self._line_text(index).strip() for index in range(len(self.line_starts))]
        self.block_start = self._blocks()
        self.cues = self._cues()
        self._cues_by_line: dict[int, list[Cue]] = {}
        for cue in self.cues:
            self._cues_by_line.setdefault(cue.line, []).append(cue)
        self.letterhead = self._letterhead()
        self._buyer_headings = any(cue.role == cues.BUYER for cue in self.cues)
        amount = _MONEY.search(text)
        self._first_amount_line = self.line_of(amount.start()) if amount is not None else len(self.line_starts)
        tokens = list(_TOKEN.finditer(text))
        self.normal = " ".join(token.group() for token in tokens)
        self._normal_starts: list[int] = []
        self._original_starts: list[int] = []
        position = 0
        for token in tokens:
            self._normal_starts.append(position)
            self._original_starts.append(token.start())
            position += len(token.group()) + 1
        compact: list[str] = []
        self._compact_offsets: list[int] = []
        for run in _ALNUM_RUN.finditer(text):
            compact.append(_upper(run.group()))
            self._compact_offsets.extend(range(run.start(), run.end()))
        self.compact = "".join(compact)

    # -- lines -------------------------------------------------------------------------------

    def line_of(self, offset: int) -> int:
        """0-based index of the line holding `offset`."""
        return bisect.bisect_right(self.line_starts, offset) - 1

    def line_number(self, offset: int) -> int:
        """1-based line number, as an editor shows it."""
        return self.line_of(offset) + 1

    def column_of(self, offset: int) -> int:
        return offset - self.line_starts[self.line_of(offset)]

    def _line_text(self, index: int) -> str:
        start = self.line_starts[index]
        end = self.line_starts[index + 1] - 1 if index + 1 < len(self.line_starts) else len(self.text)
        return self.text[start:end].rstrip("\r")

    def line_text(self, index: int) -> str:
        return self._line_text(index)

    def _blocks(self) -> list[int]:
        starts: list[int] = []
        current = 0
        for index, blank in enumerate(self._blank):
            if blank or index == 0 or self._blank[index - 1]:
                current = index
            starts.append(current)
        return starts

    def same_block(self, a: int, b: int) -> bool:
        """Whether offsets `a` and `b` are in one block of non-blank lines."""
        line_a, line_b = self.line_of(a), self.line_of(b)
        return not self._blank[line_a] and self.block_start[line_a] == self.block_start[line_b]

    # -- cues and roles ----------------------------------------------------------------------

    def _cues(self) -> list[Cue]:
        found = []
        for match in _CUE.finditer(self.lower):
            start = match.start()
            if start > 0 and (self.lower[start - 1].isalnum() or self.lower[start - 1] in "_-"):
                continue
            line = self.line_of(start)
            before = self.text[self.line_starts[line]:start]
            if before.strip() and not _FIELD_BREAK.search(before):
                continue
            word = " ".join(match.group().split())
            after = _AFTER_CUE.match(self.text, match.end())
            colon = after is not None and ":" in after.group()
            if word in cues.COLON_ONLY_CUES and not colon:
                continue
            if after is None and word not in cues.INLINE_CUES:
                continue
            found.append(Cue(line=line, column=start - self.line_starts[line], role=_CUE_ROLE[word],
                             text=self.text[start:match.end()]))
        return found

    def _letterhead(self) -> int | None:
        """Block start line of the letterhead: the first block that is not only titles."""
        index = 0
        while index < len(self.line_starts):
            if self._blank[index]:
                index += 1
                continue
            start = index
            titles = True
            while index < len(self.line_starts) and not self._blank[index]:
                titles = titles and _TITLE.fullmatch(lowered(self._line_text(index))) is not None
                index += 1
            if not titles:
                return start
        return None

    def role_at(self, offset: int, *, supplier_marks: Sequence[int] = ()) -> Role:
        """The party role of the text at `offset` (see the module docstring). `supplier_marks`:
        offsets of the supplier's IBAN, whose block is the supplier's."""
        line = self.line_of(offset)
        column = offset - self.line_starts[line]
        top = max(self.block_start[line], line - _MAX_ROLE_LOOKUP_LINES)
        for index in range(line, top - 1, -1):
            candidates = [
                cue for cue in self._cues_by_line.get(index, ())
                if (cue.column < column if index == line else cue.column <= column + _COLUMN_SLACK)
            ]
            if candidates:
                cue = max(candidates, key=lambda c: c.column)
                return Role(cue.role, f'under "{cue.text.strip()}" (line {cue.line + 1})')
        if self.letterhead is not None and self.block_start[line] == self.letterhead and not self._blank[line]:
            return Role(cues.SUPPLIER, f"in the letterhead (lines from {self.letterhead + 1})")
        for mark in supplier_marks:
            if self.same_block(offset, mark):
                return Role(cues.SUPPLIER, f"in the block holding the supplier's IBAN (line {self.line_number(mark)})")
        if not self._buyer_headings and line < self._first_amount_line and not self._blank[line]:
            return Role(cues.BUYER, "the addressee: a block with no heading before the items, on a document "
                                    "with no buyer heading")
        return Role(None, "under no supplier or buyer heading")

    def debit_line(self, offset: int) -> bool:
        """Whether the text around `offset` on its line (its column, when the line holds side-by-side
        columns) speaks of a direct debit: the account there is the buyer's."""
        line = self.line_of(offset)
        start = self.line_starts[line]
        text = lowered(self._line_text(line))
        column = offset - start
        left = max((gap.end() for gap in _COLUMN_GAP.finditer(text, 0, column)), default=0)
        right = next((gap.start() for gap in _COLUMN_GAP.finditer(text, column)), len(text))
        return _DEBIT.search(text, left, right) is not None

    # -- labels ------------------------------------------------------------------------------

    def label_at(self, offset: int) -> str:
        """
        The label of the value at `offset`, lower case: the words right before it on its line
        (`Invoice Date: 05.06.2026`), or else the chunk above it in its column (labels printed
        over their values). Empty when there is none.
        """
        line = self.line_of(offset)
        start = self.line_starts[line]
        raw = self.text[start:offset]
        if not raw.strip() or _FIELD_BREAK.search(raw):  # the value starts a field: a label above?
            above = self._label_above(line, offset - start)
            if above is not None:
                return above
        tail = _LABEL_TAIL.search(raw.rstrip(_LABEL_STRIP))
        return _label_key(tail.group()) if tail is not None else ""

    def _label_above(self, line: int, column: int) -> str | None:
        """The chunk right above `column` on the previous line of the same block (labels over values)."""
        if line == 0 or self._blank[line - 1]:
            return None
        for chunk in _CHUNK.finditer(self._line_text(line - 1)):
            if abs(chunk.start() - column) <= _COLUMN_SLACK and not any(c.isdigit() for c in chunk.group()):
                return _label_key(chunk.group())
        return None

    # -- finding -----------------------------------------------------------------------------

    def find_quote(self, quote: str) -> list[tuple[int, int]]:
        """Source spans where `quote` (whitespace-insensitive) occurs without cutting a number."""
        normal = " ".join(quote.split())
        if not normal:
            return []
        found = []
        start = self.normal.find(normal)
        while start != -1:
            end = start + len(normal)
            cuts_before = normal[0] in _DIGITS and _continues_number(self.normal[max(0, start - 2):start][::-1])
            cuts_after = normal[-1] in _DIGITS and _continues_number(self.normal[end:end + 2])
            if not (cuts_before or cuts_after):
                found.append((self.original(start), self.original(end - 1) + 1))
            start = self.normal.find(normal, start + 1)
        return found

    def original(self, normal_offset: int) -> int:
        """The source offset of a position in the normalised text."""
        index = bisect.bisect_right(self._normal_starts, normal_offset) - 1
        if index < 0:
            return 0
        return self._original_starts[index] + (normal_offset - self._normal_starts[index])

    def find_compact(self, value: str, *, within: tuple[int, int] | None = None) -> list[int]:
        """Source offsets of `value` read with spaces, dots, dashes and case ignored, on whole tokens."""
        needle = _upper("".join(_ALNUM_RUN.findall(value)))
        if not needle:
            return []
        found = []
        position = self.compact.find(needle)
        while position != -1:
            first = self._compact_offsets[position]
            last = self._compact_offsets[position + len(needle) - 1]
            clean_start = first == 0 or _ALNUM_RUN.match(self.text, first - 1) is None
            clean_end = last + 1 >= len(self.text) or _ALNUM_RUN.match(self.text, last + 1) is None
            inside = within is None or (within[0] <= first and last < within[1])
            if clean_start and clean_end and inside:
                found.append(first)
            position = self.compact.find(needle, position + 1)
        return found


def _upper(text: str) -> str:
    """`text` upper-cased character for character (`ß` stays `ß`; `i` and `ı` become `I`), so
    that offsets into it are offsets into `text`."""
    upper = text.upper()
    if len(upper) == len(text):
        return upper
    return "".join(char.upper() if len(char.upper()) == 1 else char for char in text)


def _continues_number(neighbours: str) -> bool:
    """`neighbours`: the (up to) two characters next to a quote's edge, nearest first."""
    if neighbours[:1] in _DIGITS:
        return True
    return len(neighbours) == 2 and neighbours[0] in _NUMBER_JOINERS and neighbours[1] in _DIGITS


def _label_key(label: str) -> str:
    return " ".join(lowered(label).strip(_LABEL_STRIP).split())


def classify_by_occurrence(label: str, tables: dict[str, Sequence[str]]) -> str | None:
    """The table with the cue that occurs earliest in `label` (the longer one on a tie), or None."""
    best: tuple[int, int, str] | None = None
    for name, words in tables.items():
        for word in words:
            position = label.find(word)
            if position != -1 and (best is None or (position, -len(word)) < (best[0], best[1])):
                best = (position, -len(word), name)
    return best[2] if best is not None else None


def classify_label(label: str, tables: dict[str, Sequence[str]]) -> str | None:
    """The table whose longest cue starts `label` as whole words (`invoice date` is a date, not
    an invoice number), or None."""
    best: tuple[int, str] | None = None
    for name, words in tables.items():
        for word in words:
            if label == word or (label.startswith(word) and not label[len(word)].isalnum()):
                if best is None or len(word) > best[0]:
                    best = (len(word), name)
    return best[1] if best is not None else None
