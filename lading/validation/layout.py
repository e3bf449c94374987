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
import itertools
import operator
import re
from collections.abc import Iterable, Sequence
from typing import Any, Final

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
_ALNUM_SPLIT = re.compile(r"([\W_]+)")
"""What separates runs of letters and digits (_ALNUM_RUN), kept by `split`."""
_BLANK_SPLIT = re.compile(r"(\s+)")
"""What separates tokens (_TOKEN), kept by `split`: str.split and whitespace in regexes agree on every character."""
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


_BLANKS = r"[ \t]+"


def alternation(words: Iterable[str], *, blank: str = _BLANKS) -> str:
    """
    A regex matching any of `words` (literal text; a space between words matches `blank`), the
    longest first, as the plain alternation of the words sorted longest first would, but written
    as a prefix tree (`mar(?:zo|ch|t|s)?`): the regex engine then tries a handful of first letters
    at each position instead of every word. Two words that match at one position are always a
    prefix of each other, and the tree tries the longer first, so the matches are the same.
    """
    tree: dict[str, Any] = {}
    for word in set(words):
        node = tree
        for index, part in enumerate(word.split()):
            if index:
                node = node.setdefault(blank, {})
            for char in part:
                node = node.setdefault(re.escape(char), {})
        node[""] = {}
    return _branches(tree)


def _branches(node: dict[str, Any]) -> str:
    alternatives = [key + _branches(child) for key, child in sorted(node.items()) if key]
    if not alternatives:
        return ""
    body = alternatives[0] if len(alternatives) == 1 else "(?:" + "|".join(alternatives) + ")"
    if "" not in node:
        return body
    return f"(?:{body})?" if len(alternatives) > 1 or len(body) > 1 else f"{body}?"


_PARTY_ROLE: Final = {word: role for role, words in cues.PARTY_CUES.items() for word in words}
_CUE_ROLE: Final = {**_PARTY_ROLE, **{word: BANK for word in cues.BANK_CUES}}
_CUE: Final = re.compile(rf"(?:{alternation(_CUE_ROLE)})(?![\w.])")
_AFTER_CUE: Final = re.compile(r"[ \t]*:|[ \t]*$|[ \t]{2,}|[ \t]*\(")
_TITLE: Final = re.compile(rf"[ \t]*(?:(?:{alternation(cues.TITLE_CUES)})[ \t]*)+[:.]?[ \t]*")
_DEBIT: Final = re.compile(rf"(?<!\w)(?:{alternation(cues.DEBIT_CUES)})(?!\w)")


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
        self._lines = text.split("\n")
        self.line_starts = list(itertools.accumulate((len(line) + 1 for line in self._lines[:-1]), initial=0))
        self._blank = [not line.strip() for line in self._lines]
        self.block_start = self._blocks()
        self.cues = self._cues()
        self._cues_by_line: dict[int, list[Cue]] = {}
        for cue in self.cues:
            self._cues_by_line.setdefault(cue.line, []).append(cue)
        self.letterhead = self._letterhead()
        self._buyer_headings = any(cue.role == cues.BUYER for cue in self.cues)
        amount = _MONEY.search(text)
        self._first_amount_line = self.line_of(amount.start()) if amount is not None else len(self.line_starts)
        # Both copies map back by runs (a token, a run of letters and digits), not by character:
        # an offset in a copy is its run's start in the source plus the offset inside the run.
        tokens, self._original_starts = _pieces(_BLANK_SPLIT.split(text))
        self.normal = " ".join(tokens)
        self._normal_starts: list[int] = list(map(operator.add, _starts(tokens), range(len(tokens))))  # one blank each
        runs, self._compact_original_starts = _pieces(_ALNUM_SPLIT.split(text))
        self.compact = _upper("".join(runs))  # _upper keeps every character in its place
        self._compact_starts = _starts(runs)

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
        return self._lines[index].rstrip("\r")

    def line_text(self, index: int) -> str:
        return self._line_text(index)

    def line_span(self, index: int) -> tuple[int, int]:
        """[start, end) of line `index` in the text, without its newline (a `\r` before it included)."""
        start = self.line_starts[index]
        return start, start + len(self._lines[index])

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
            first = self._compact_original(position)
            last = self._compact_original(position + len(needle) - 1)
            clean_start = first == 0 or _ALNUM_RUN.match(self.text, first - 1) is None
            clean_end = last + 1 >= len(self.text) or _ALNUM_RUN.match(self.text, last + 1) is None
            inside = within is None or (within[0] <= first and last < within[1])
            if clean_start and clean_end and inside:
                found.append(first)
            position = self.compact.find(needle, position + 1)
        return found

    def _compact_original(self, compact_offset: int) -> int:
        """The source offset of a character of the compacted text."""
        index = bisect.bisect_right(self._compact_starts, compact_offset) - 1
        return self._compact_original_starts[index] + (compact_offset - self._compact_starts[index])


def _starts(pieces: Sequence[str]) -> list[int]:
    """Where each of `pieces` starts once they are joined."""
    return list(itertools.accumulate(map(len, pieces[:-1]), initial=0)) if pieces else []


def _pieces(split: list[str]) -> tuple[list[str], list[int]]:
    """The pieces a capturing `re.split` kept between its separators, with their offsets in the
    text (a split alternates piece, separator, piece, ...; the first and last piece may be empty)."""
    starts = _starts(split)
    pieces, offsets = split[0::2], starts[0::2]
    if pieces and not pieces[-1]:
        del pieces[-1], offsets[-1]
    if pieces and not pieces[0]:
        del pieces[0], offsets[0]
    return pieces, offsets


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
    pattern, owner = _table_index(tables)
    found = pattern.search(label)  # leftmost, and the longest cue there: the alternation's order
    return owner[found.group()] if found is not None else None


def classify_label(label: str, tables: dict[str, Sequence[str]]) -> str | None:
    """The table whose longest cue starts `label` as whole words (`invoice date` is a date, not
    an invoice number), or None."""
    _, owner = _table_index(tables)
    if label in owner:
        return owner[label]
    for end in range(len(label) - 1, 0, -1):  # the longest cue first: it ends where a word does
        if not label[end].isalnum() and label[:end] in owner:
            return owner[label[:end]]
    return None


_TABLE_INDEXES: dict[int, tuple[dict[str, Sequence[str]], re.Pattern[str], dict[str, str]]] = {}


def _table_index(tables: dict[str, Sequence[str]]) -> tuple[re.Pattern[str], dict[str, str]]:
    """For cue tables (module constants, built once): a pattern finding any cue, and the table each
    cue belongs to (the first table listing it, as a scan of the tables in order finds it)."""
    cached = _TABLE_INDEXES.get(id(tables))
    if cached is None or cached[0] is not tables:
        owner: dict[str, str] = {}
        for name, words in tables.items():
            for word in words:
                owner.setdefault(word, name)
        cached = _TABLE_INDEXES[id(tables)] = (tables, re.compile(alternation(owner, blank=" ")), owner)
    return cached[1], cached[2]
