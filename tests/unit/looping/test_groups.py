"""
`lading.grouping.Groups`: what arrives while a group is applied is applied together next, each
caller gets its own item's outcome, and items of one identity never share a group.

Each test holds the first group inside `apply` on an event it sets itself, so what counts as
"arrived meanwhile" is decided by the test, not by timing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

import pytest

from lading import grouping
from tests.support import waiting


class Recorder:
    """An `apply` that records each group and holds the first one until `release` is set."""

    def __init__(self, *, hold_first: bool = True) -> None:
        self.groups: list[list[str]] = []
        self.release = asyncio.Event()
        if not hold_first:
            self.release.set()
        self.fail: dict[str, Exception] = {}

    async def __call__(self, items: Sequence[str]) -> list[str | Exception]:
        self.groups.append(list(items))
        if len(self.groups) == 1:
            await self.release.wait()
        return [self.fail.get(item, f"done:{item}") for item in items]


async def _until(check: Callable[[], bool]) -> None:
    async def met() -> bool:
        return check()

    await waiting.until(met, timeout_s=5, every_s=0.001)


def _groups(apply: Recorder, *, max_items: int = 100, concurrency: int = 1) -> grouping.Groups[str, str]:
    return grouping.Groups(apply, identity=lambda item: item.split("#")[0], max_items=max_items,
                           concurrency=concurrency)  # fmt: skip


async def test_an_item_on_an_idle_group_is_applied_at_once_alone() -> None:
    apply = Recorder(hold_first=False)
    groups = _groups(apply)
    assert await groups.run("a") == "done:a"
    assert apply.groups == [["a"]]
    assert (groups.applied_groups, groups.applied_items) == (1, 1)


async def test_items_that_arrive_while_a_group_is_applied_form_the_next_group_in_arrival_order() -> None:
    apply = Recorder()
    groups = _groups(apply)
    first = asyncio.create_task(groups.run("a"))
    await _until(lambda: len(apply.groups) == 1)
    later = [asyncio.create_task(groups.run(item)) for item in ("c", "b", "d")]
    await _until(lambda: groups.waiting == 3)
    apply.release.set()
    assert await first == "done:a"
    assert [await task for task in later] == ["done:c", "done:b", "done:d"]
    assert apply.groups == [["a"], ["c", "b", "d"]]
    assert groups.waiting == 0


async def test_a_group_holds_at_most_max_items() -> None:
    apply = Recorder()
    groups = _groups(apply, max_items=2)
    first = asyncio.create_task(groups.run("a"))
    await _until(lambda: len(apply.groups) == 1)
    later = [asyncio.create_task(groups.run(item)) for item in ("b", "c", "d", "e", "f")]
    await _until(lambda: groups.waiting == 5)
    apply.release.set()
    await asyncio.gather(first, *later)
    assert apply.groups == [["a"], ["b", "c"], ["d", "e"], ["f"]]


async def test_items_of_one_identity_never_share_a_group_and_keep_their_order() -> None:
    apply = Recorder()
    groups = _groups(apply)
    first = asyncio.create_task(groups.run("x"))
    await _until(lambda: len(apply.groups) == 1)
    later = [asyncio.create_task(groups.run(item)) for item in ("k#1", "y", "k#2", "z", "k#3")]
    await _until(lambda: groups.waiting == 5)
    apply.release.set()
    await asyncio.gather(first, *later)
    assert apply.groups == [["x"], ["k#1", "y", "z"], ["k#2"], ["k#3"]]


async def test_an_item_that_failed_alone_fails_only_its_caller() -> None:
    apply = Recorder()
    apply.fail["b"] = ValueError("b is wrong")
    groups = _groups(apply)
    first = asyncio.create_task(groups.run("a"))
    await _until(lambda: len(apply.groups) == 1)
    later = [asyncio.create_task(groups.run(item)) for item in ("b", "c")]
    await _until(lambda: groups.waiting == 2)
    apply.release.set()
    await first
    with pytest.raises(ValueError, match="b is wrong"):
        await later[0]
    assert await later[1] == "done:c"


async def test_an_exception_apply_raises_is_every_items_outcome_and_the_next_group_still_runs() -> None:
    calls: list[list[str]] = []

    async def apply(items: Sequence[str]) -> list[str | Exception]:
        calls.append(list(items))
        if len(calls) == 1:
            raise ConnectionError("database went away")
        return [f"done:{item}" for item in items]

    groups: grouping.Groups[str, str] = grouping.Groups(apply, identity=str, max_items=10, concurrency=1)
    with pytest.raises(ConnectionError):
        await groups.run("a")
    assert await groups.run("b") == "done:b"


async def test_apply_giving_the_wrong_number_of_outcomes_fails_the_whole_group() -> None:
    async def apply(items: Sequence[str]) -> list[str | Exception]:
        return []

    groups: grouping.Groups[str, str] = grouping.Groups(apply, identity=str, max_items=10, concurrency=1)
    with pytest.raises(AssertionError, match="apply gave 0 outcomes for 1 items"):
        await groups.run("a")


async def test_a_cancelled_caller_never_cancels_its_group() -> None:
    apply = Recorder()
    groups = _groups(apply)
    first = asyncio.create_task(groups.run("a"))
    await _until(lambda: len(apply.groups) == 1)
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    second = asyncio.create_task(groups.run("b"))
    apply.release.set()
    assert await second == "done:b"
    assert apply.groups == [["a"], ["b"]], "the first group ran to its end although its caller left"
    assert groups.applied_items == 2


async def test_concurrency_bounds_the_groups_applied_at_once() -> None:
    entered = 0
    most = 0
    gate = asyncio.Event()

    async def apply(items: Sequence[str]) -> list[str | Exception]:
        nonlocal entered, most
        entered += 1
        most = max(most, entered)
        await gate.wait()
        entered -= 1
        return [f"done:{item}" for item in items]

    groups: grouping.Groups[str, str] = grouping.Groups(apply, identity=str, max_items=1, concurrency=2)
    tasks = [asyncio.create_task(groups.run(str(n))) for n in range(5)]
    await _until(lambda: entered == 2 and groups.waiting == 3)
    gate.set()
    assert [await task for task in tasks] == [f"done:{n}" for n in range(5)]
    assert most == 2


def test_a_group_needs_room_for_an_item_and_a_runner() -> None:
    async def apply(items: Sequence[str]) -> list[str | Exception]:
        return list(items)

    with pytest.raises(ValueError, match="max_items=0"):
        grouping.Groups(apply, identity=str, max_items=0, concurrency=1)
    with pytest.raises(ValueError, match="concurrency=0"):
        grouping.Groups(apply, identity=str, max_items=1, concurrency=0)
