"""
Printed dates and what they can mean: the date reader of `invoice-strict-v2`.

`find(text)` returns every date printed in a text, in one regex pass, each with the dates it
can be read as:

    2025-03-04  2025/03/04              year first: one reading
    04.03.2025  04/03/2025  04-03-2025  4 March or 3 April: two readings, unless one of the
    4.3.25  4/3/25                      numbers is above 12 (dots are the European habit, but
                                        not a rule: a US supplier may print 03.04.2025 too)
    4 March 2025  March 4, 2025  4. März 2025  4 Mart 2025  4 mars 2025  4 maart 2025
    4 de marzo de 2025  4 marzo 2025  4-Mar-2025  1st March 2025
                                        a month name (or its abbreviation) in en, de, tr, fr,
                                        nl, es or it: one reading

A date with two readings is resolved only by the document's own locale (`resolve(...,
day_first=...)`: the supplier's country, the document's language; see `lading.validation.cues`);
with no locale it stays unresolved and the policy sends it to review. Two-digit years are
20yy. Nothing here guesses.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
from typing import Final

from lading.validation import cues, layout

_MONTH_NUMBER: Final[dict[str, int]] = {}
for _names in cues.MONTHS.values():
    for _number, _spellings in enumerate(_names, start=1):
        for _spelling in _spellings:
            if _MONTH_NUMBER.setdefault(_spelling, _number) != _number:  # pragma: no cover - a table error
                raise ValueError(f"month name {_spelling!r} means two months")

_MONTH: Final = layout.alternation(_MONTH_NUMBER)
_DAY: Final = r"(?P<{}>[0-3]?\d)(?:st|nd|rd|th|er|º|°)?"
_PATTERN: Final = re.compile(
    r"(?<![\w.,/-])(?:"
    r"(?P<iy>\d{4})(?P<isep>[-/.])(?P<im>[01]?\d)(?P=isep)(?P<id>[0-3]?\d)"
    r"|(?P<na>[0-3]?\d)(?P<nsep>[./-])(?P<nb>[0-3]?\d)(?P=nsep)(?P<ny>\d{4}|\d{2})"
    rf"|{_DAY.format('td')}[ \t]*[.\-/]?[ \t]*(?:de[ \t]+)?(?P<tm>{_MONTH})\.?[ \t]*[,\-/]?[ \t]*(?:de[ \t]+)?"
    r"(?P<ty>\d{4})"
    rf"|(?P<mm>{_MONTH})\.?[ \t]+{_DAY.format('md')},?[ \t]+(?P<my>\d{{4}})"
    r")(?![\w/-]|[.,]\d)"
)


@dataclasses.dataclass(frozen=True)
class PrintedDate:
    start: int
    end: int
    day_first: dt.date | None
    """The reading with the day first (or the only reading)."""
    month_first: dt.date | None
    """The reading with the month first, when the form allows one and it differs."""

    @property
    def readings(self) -> frozenset[dt.date]:
        return frozenset(d for d in (self.day_first, self.month_first) if d is not None)

    @property
    def ambiguous(self) -> bool:
        return self.day_first is not None and self.month_first is not None


def find(lowered_text: str, *, start: int = 0, end: int | None = None) -> list[PrintedDate]:
    """Every date printed in `lowered_text` (lower case, as `layout.lowered` gives it), or in its
    part [start, end). A printed date never spans two lines, so the dates of a whole line are the
    same whether that line or the whole text is read: the part read should be whole lines."""
    found = []
    for match in _PATTERN.finditer(lowered_text, start, len(lowered_text) if end is None else end):
        printed = _printed(match)
        if printed is not None:
            found.append(printed)
    return found


def resolve(printed: PrintedDate, *, day_first: bool | None) -> dt.date | None:
    """The date `printed` means in a document whose locale writes day first (True), month
    first (False) or is unknown (None); None when it stays ambiguous."""
    if not printed.ambiguous:
        return printed.day_first or printed.month_first
    if day_first is None:
        return None
    return printed.day_first if day_first else printed.month_first


def _printed(match: re.Match[str]) -> PrintedDate | None:
    start, end = match.span()
    if match.group("iy") is not None:
        iso = _date(int(match.group("iy")), int(match.group("im")), int(match.group("id")))
        return None if iso is None else PrintedDate(start, end, iso, None)
    if match.group("na") is not None:
        a, b, year = int(match.group("na")), int(match.group("nb")), _year(match.group("ny"))
        dmy, mdy = _date(year, b, a), _date(year, a, b)
        if dmy is None and mdy is None:
            return None
        if dmy is None:
            return PrintedDate(start, end, mdy, None)
        return PrintedDate(start, end, dmy, None if mdy == dmy else mdy)
    if match.group("tm") is not None:
        named = _date(int(match.group("ty")), _MONTH_NUMBER[match.group("tm")], int(match.group("td")))
    else:
        named = _date(int(match.group("my")), _MONTH_NUMBER[match.group("mm")], int(match.group("md")))
    return None if named is None else PrintedDate(start, end, named, None)


def _year(text: str) -> int:
    return 2000 + int(text) if len(text) == 2 else int(text)


def _date(year: int, month: int, day: int) -> dt.date | None:
    try:
        return dt.date(year, month, day)
    except ValueError:
        return None
