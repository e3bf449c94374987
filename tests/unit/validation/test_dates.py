"""The date reader of `invoice-strict-v2`: every common printed form, and which read two ways."""

from __future__ import annotations

import datetime as dt

import pytest

from lading.validation import dates, layout

MARCH_4 = dt.date(2025, 3, 4)
APRIL_3 = dt.date(2025, 4, 3)


@pytest.mark.parametrize(
    "printed",
    [
        "2025-03-04", "2025/03/04",
        "4 March 2025", "March 4, 2025", "Mar 4, 2025", "4th March 2025", "04-Mar-2025",  # en
        "4. März 2025", "4. Mär. 2025",  # de
        "4 Mart 2025",  # tr
        "4 mars 2025",  # fr
        "4 maart 2025",  # nl
        "4 de marzo de 2025",  # es
        "4 marzo 2025",  # it
    ],
)
def test_one_reading(printed: str) -> None:
    (found,) = dates.find(layout.lowered(f"Date: {printed} "))
    assert found.readings == {MARCH_4} and not found.ambiguous
    assert dates.resolve(found, day_first=None) == MARCH_4


@pytest.mark.parametrize("printed", ["04/03/2025", "04-03-2025", "4/3/25", "04.03.2025", "4.3.2025", "04.03.25"])
def test_slashes_and_dashes_read_two_ways_until_a_locale_decides(printed: str) -> None:
    (found,) = dates.find(f"{printed}")
    assert found.readings == {MARCH_4, APRIL_3} and found.ambiguous
    assert dates.resolve(found, day_first=None) is None
    assert dates.resolve(found, day_first=True) == MARCH_4
    assert dates.resolve(found, day_first=False) == APRIL_3


def test_a_number_above_twelve_decides_the_order() -> None:
    (found,) = dates.find("03/24/2025")
    assert found.readings == {dt.date(2025, 3, 24)} and not found.ambiguous


def test_dots_read_two_ways_like_slashes() -> None:
    (found,) = dates.find("12.25.2025")
    assert found.readings == {dt.date(2025, 12, 25)}
    (found,) = dates.find("05.06.2025")
    assert found.readings == {dt.date(2025, 6, 5), dt.date(2025, 5, 6)}


@pytest.mark.parametrize("text", ["1.234,56", "12.500,00", "INV-2025-0042", "31.02.2025", "2025-13-01", "10.05.20250"])
def test_amounts_numbers_and_impossible_dates_are_not_dates(text: str) -> None:
    assert dates.find(text) == []


def test_spans_point_at_the_printed_date() -> None:
    text = "Invoice Date: 4 March 2025   Due: 03/04/2025"
    first, second = dates.find(layout.lowered(text))
    assert text[first.start:first.end] == "4 March 2025"
    assert text[second.start:second.end] == "03/04/2025"
