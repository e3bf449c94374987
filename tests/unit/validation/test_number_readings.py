"""
`checks.number_values` reads numbers as it always has, and the evidence check that stops at the
first reading equal to the value (`_supports`) answers as a look-up in the full set would.

The reference below is the reading as first written (a set built from every sub-range of
every number run); the faster one must agree with it on any text.
"""

from __future__ import annotations

import decimal
import re
from collections.abc import Iterator, Sequence

from hypothesis import example, given, settings
from hypothesis import strategies as st

from lading.validation import checks

_NUMBER_RUN = re.compile(r"[0-9]+(?:[.,' \u2019][0-9]+)*")
_NUMBER_SEPARATOR = re.compile(r"([.,' \u2019])")


def _reference(text: str) -> frozenset[decimal.Decimal]:
    text = " ".join(text.split())
    values: set[decimal.Decimal] = set()
    for match in _NUMBER_RUN.finditer(text):
        start, end = match.span()
        before = text[max(0, start - 2):start]
        negative = before[-1:] in ("-", "\u2212") and not before[:-1].isalnum()
        parenthesised = start > 0 and text[start - 1] == "(" and text[end:end + 1] == ")"
        parts = match.group().split(" ")
        for first in range(len(parts)):
            for last in range(first + 1, min(first + 6, len(parts)) + 1):
                signed = first == 0 and negative
                whole = first == 0 and last == len(parts) and parenthesised
                for value in _reference_readings(" ".join(parts[first:last])):
                    values.add(-value if signed else value)
                    if whole:
                        values.add(-value)
    return frozenset(values)


def _reference_readings(token: str) -> Iterator[decimal.Decimal]:
    pieces = _NUMBER_SEPARATOR.split(token)
    groups, separators = pieces[0::2], pieces[1::2]
    if not separators:
        yield decimal.Decimal(token)
        return
    if _reference_grouped(groups, separators):
        yield decimal.Decimal("".join(groups))
    point = separators[-1]
    if point in ".," and (
        len(separators) == 1
        or (_reference_grouped(groups[:-1], separators[:-1]) and point not in separators[:-1])
    ):
        yield decimal.Decimal("".join(groups[:-1]) + "." + groups[-1])


def _reference_grouped(groups: Sequence[str], separators: Sequence[str]) -> bool:
    return len(set(separators)) == 1 and 1 <= len(groups[0]) <= 3 and all(len(g) == 3 for g in groups[1:])


_texts = st.text(alphabet=st.sampled_from(list("0123456789012345.,' \u2019\u00a0\n-\u2212()aZ€:%")), max_size=40)
_digits = st.text(alphabet="0123456789", min_size=1, max_size=4)
_amounts = st.builds(
    lambda sign, whole, frac: f"{sign}{whole}" + (f".{frac}" if frac else ""),
    st.sampled_from(["", "-"]), _digits, st.one_of(st.just(""), _digits),
)


@given(_texts)
@settings(max_examples=3000, deadline=None)
@example("Fixed line 1 x 100.00 = 100.00")
@example("(1 234 567,89) -1.234.567 1'234\u2019567.5 2 3 4 5 6 7 8")
def test_number_values_read_as_the_reference_does(text: str) -> None:
    assert checks.number_values(text) == _reference(text)


@given(_amounts, _texts)
@settings(max_examples=3000, deadline=None)
@example("100", "Subtotal: 100.00")
@example("-1234.56", "(1 234,56)")
@example("1234", "1 234 5")
def test_evidence_of_an_amount_is_judged_as_by_the_full_set(value: str, quote: str) -> None:
    quote = checks.normalise_whitespace(quote)
    expected = decimal.Decimal(value) in _reference(quote)
    assert checks._supports(kind="money", value=value, quote=quote) is expected
