"""
The evidence check looks a quote up in the source as written before normalising the source's
whitespace (`checks._Source`); its answer must be the one of the look-up in the normalised source
(`checks.quoted_in(quote, checks.normalise_whitespace(source))`) for any source and quote.
"""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from lading.validation import checks

_ALPHABET = st.sampled_from(list("0123456789 .,'\u2019\t\n\r\u00a0ab-:"))
_TEXT = st.text(_ALPHABET, max_size=40)


def _normalised_answer(quote: str, source: str) -> bool:
    return checks.quoted_in(quote, checks.normalise_whitespace(source))


@settings(max_examples=3000, deadline=None)
@given(source=_TEXT, raw_quote=_TEXT)
@example(source="Total:   1.234,56", raw_quote="Total: 1.234,56")  # found only once normalised
@example(source="1.234,56", raw_quote="34,56")  # cuts a number as written and normalised
@example(source="12 34,5 \n 1.234,5", raw_quote="1.234,5")  # first occurrence cut, a later one not
@example(source="a 1\t\t2", raw_quote="1 2")
def test_the_lookup_as_written_answers_as_the_normalised_one(source: str, raw_quote: str) -> None:
    quote = checks.normalise_whitespace(raw_quote)
    if not quote:
        return  # `evidence` judges an empty quote missing before looking it up
    assert checks._Source(source).quotes(quote) == _normalised_answer(quote, source)


@settings(max_examples=1000, deadline=None)
@given(words=st.lists(st.text(st.sampled_from(list("0123456789.,ab")), min_size=1, max_size=6), min_size=1,
                      max_size=8), gaps=st.lists(st.sampled_from([" ", "  ", "\n", "\t ", " \r\n"]), min_size=8,
                                                 max_size=8), start=st.integers(0, 7), length=st.integers(1, 8))
def test_quotes_taken_from_the_source_are_found_in_it(
        words: list[str], gaps: list[str], start: int, length: int
) -> None:
    source = "".join(word + gap for word, gap in zip(words, gaps, strict=False))
    quote = " ".join(words[start:start + length])
    if not quote:
        return
    assert checks._Source(source).quotes(quote) == _normalised_answer(quote, source)
