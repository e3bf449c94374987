"""The storable-value rules and the bisecting writer, without a database."""

from __future__ import annotations

from collections.abc import Sequence

import asyncpg
import pytest
from hypothesis import given
from hypothesis import strategies as st

from lading import storable


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("a\x00b", "U+0000"),
        ("a\ud800b", "lone surrogate U+D800"),
        ({"k\x00": 1}, "a key contains U+0000"),
        ({"a": [1, 2**63]}, "value.a[1]: integer out of range"),
        ({"a": float("nan")}, "not a finite number"),
        ([float("inf")], "value[0]"),
    ],
)
def test_unstorable_values_are_named(value: object, fragment: str) -> None:
    reason = storable.unstorable_reason(value)
    assert reason is not None and fragment in reason


def test_storable_values_pass() -> None:
    assert storable.unstorable_reason({"a": ["ü", 2**63 - 1, -(2**63), 1.5, None, True]}) is None


def test_deep_nesting_is_checked_without_recursion() -> None:
    value: object = "\x00"
    for _ in range(10_000):
        value = [value]
    assert storable.unstorable_reason(value) is not None


@given(st.text())
def test_escaped_is_always_storable_and_identity_on_clean_text(text: str) -> None:
    out = storable.escaped(text)
    assert storable.unstorable_reason(out) is None
    if storable.unstorable_reason(text) is None:
        assert out == text


def test_data_errors_are_told_from_unavailability() -> None:
    assert storable.is_data_error(asyncpg.exceptions.CharacterNotInRepertoireError("nul"))
    assert storable.is_data_error(asyncpg.exceptions.ProgramLimitExceededError("too big"))
    assert not storable.is_data_error(asyncpg.exceptions.DeadlockDetectedError("deadlock"))
    assert not storable.is_data_error(asyncpg.exceptions.CannotConnectNowError("starting"))
    assert not storable.is_data_error(OSError("reset"))


@given(st.lists(st.integers(min_value=0, max_value=50), max_size=40), st.sets(st.integers(min_value=0, max_value=50)))
async def test_isolate_writes_every_good_item_and_refuses_each_bad_one(items: list[int], bad: set[int]) -> None:
    written: list[int] = []

    async def apply(group: Sequence[int]) -> int:
        if any(item in bad for item in group):
            raise asyncpg.exceptions.CharacterNotInRepertoireError("bad row")
        written.extend(group)
        return len(group)

    outcome = await storable.isolate(items, apply)
    assert sorted(written) == sorted(i for i in items if i not in bad)
    assert sorted(item for item, _ in outcome.refused) == sorted(i for i in items if i in bad)
    assert sum(outcome.results) == len(written)


async def test_isolate_propagates_other_errors() -> None:
    async def apply(group: Sequence[int]) -> None:
        raise asyncpg.exceptions.DeadlockDetectedError("deadlock")

    with pytest.raises(asyncpg.exceptions.DeadlockDetectedError):
        await storable.isolate([1, 2], apply)
