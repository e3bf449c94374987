"""The receiver skips the walk over every parsed value when the raw body shows it is not needed
(`app._storable_as_parsed`): that shortcut must never let through what the walk would refuse,
nor change a value the exact parse would give."""

from __future__ import annotations

import json
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st
from lading_webhook_receiver import app

from lading import storable

_CHARACTERS = st.characters(min_codepoint=0, max_codepoint=0x10FFFF, blacklist_categories=["Cs"])
_leaves = (
    st.none() | st.booleans() | st.integers() | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(alphabet=_CHARACTERS)
    | st.sampled_from(["\x00", "a\x00b", "\\u0000", "9223372036854775807", "x" * 19])
)  # fmt: skip
_values = st.recursive(
    _leaves,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=5), children, max_size=4),
    max_leaves=20,
)


@given(_values)
@settings(max_examples=400, deadline=None)
def test_the_shortcut_never_passes_what_the_full_check_refuses(value: Any) -> None:
    body = json.dumps({"data": value}).encode()
    if not app._storable_as_parsed(body):
        return
    parsed = orjson.loads(body)
    assert storable.unstorable_reason(parsed) is None
    assert parsed == app._loads(body)  # no integer changed on the way in


def test_the_bodies_that_need_the_full_check_are_sent_to_it() -> None:
    assert not app._storable_as_parsed(b'{"name": "Kuzey\\u0000 Tekstil"}')
    assert not app._storable_as_parsed(b'{"\\u0000": 1}')
    assert not app._storable_as_parsed(b'{"quantity": 9223372036854775808}')
    assert not app._storable_as_parsed(b'{"quantity": -18446744073709551616}')
    assert app._storable_as_parsed(b'{"quantity": 922337203685477580, "name": "Kuzey \\u00e7"}')
