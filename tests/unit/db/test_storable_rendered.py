"""`storable.unstorable_reason` skips the walk when orjson's rendering shows a dict or list
storable: that shortcut must give the walk's answer for every value, the refused ones included."""

from __future__ import annotations

import collections
import dataclasses
import datetime as dt
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lading import storable

_leaves = (
    st.none() | st.booleans() | st.integers() | st.integers(min_value=-(2**70), max_value=2**70)
    | st.sampled_from([2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63), -(2**63) - 1, 10**18, -(10**18)])
    | st.floats() | st.text() | st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)
    | st.sampled_from(["\x00", "a\x00b", "\\u0000", "null", ":9223372036854775808", "DE89370400440532013000"])
)  # fmt: skip
_keys = st.text(max_size=5) | st.sampled_from(["\x00", "\ud800"]) | st.integers(min_value=-3, max_value=3)
_values = st.recursive(
    _leaves,
    lambda children: (
        st.lists(children, max_size=4) | st.tuples(children, children) | st.dictionaries(_keys, children, max_size=4)
    ),
    max_leaves=20,
)


@given(_values)
@settings(max_examples=2000, deadline=None)
def test_the_rendered_shortcut_gives_the_walks_answer(value: Any) -> None:
    assert storable.unstorable_reason(value, where="v") == storable._walked_reason(value, where="v")


def _nested(leaf: Any, depth: int) -> Any:
    for _ in range(depth):
        leaf = [leaf]
    return leaf


@dataclasses.dataclass
class _Record:
    text: str


@pytest.mark.parametrize(
    "value",
    [
        {"a": None, "b": float("nan")},
        [None, [float("-inf")]],
        {"n": 2**63},
        {"n": [-(2**63) - 1]},
        {"k\x00": None},
        {"a": "x\ud800"},
        {1: "\x00"},
        collections.OrderedDict(a="\x00"),
        {"when": dt.date(2026, 1, 1), "text": "\x00"},
        {"record": _Record("\x00")},  # orjson renders it; the walk does not look inside
        _nested("\x00", 300),  # past orjson's depth limit
    ],
)
def test_values_the_rendering_cannot_clear_are_walked(value: Any) -> None:
    assert storable.unstorable_reason(value, where="v") == storable._walked_reason(value, where="v")


def test_a_typical_result_is_cleared_by_its_rendering() -> None:
    result = {"invoice_number": "INV-1", "due_date": None, "lines": [{"amount": "1.00"}], "n": 10**17}
    assert storable._storable_as_rendered(result)
    assert storable.unstorable_reason(result) is None
