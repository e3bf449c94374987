"""
Group commit for concurrent callers: items that arrive while a group is being applied are applied
together in the next one, and each caller is answered with its own item's outcome once its group
is done.

    groups = Groups(apply, identity=lambda item: item.key, max_items=256, concurrency=2)
    outcome = await groups.run(item)      # the outcome apply gave this item, or its exception

Nothing waits on a timer: an idle `Groups` applies an item at once, alone; under load a group is
what arrived while the groups before it were applied (up to `max_items`, `concurrency` groups at
once), so the wait for a group never exceeds the time the group before it took. Items with the
same identity never share a group: a later one waits for a later group (callers use this for
idempotency keys, which must be decided one after the other).

`apply` gets the group's items in arrival order and returns one outcome per item, an Exception
where that item alone failed; an exception it raises is every item's outcome. Cancelling a caller
never cancels its group (the group may already have committed its item).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
from collections.abc import Awaitable, Callable, Hashable, Sequence
from typing import Generic, TypeVar

I = TypeVar("I")  # noqa: E741 - the item
O = TypeVar("O")  # noqa: E741 - its outcome


@dataclasses.dataclass
class _Waiting(Generic[I, O]):
    item: I
    identity: Hashable
    answer: asyncio.Future[O]


class Groups(Generic[I, O]):
    def __init__(
            self,
            apply: Callable[[Sequence[I]], Awaitable[Sequence[O | Exception]]],
            *,
            identity: Callable[[I], Hashable],
            max_items: int,
            concurrency: int,
    ) -> None:
        if max_items < 1 or concurrency < 1:
            raise ValueError(f"a group needs room for an item and a runner, got {max_items=}, {concurrency=}")
        self._apply = apply
        self._identity = identity
        self.max_items = max_items
        self.concurrency = concurrency
        self._waiting: collections.deque[_Waiting[I, O]] = collections.deque()
        self._running = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self.applied_groups = 0
        self.applied_items = 0
        """Counts since start: their ratio is the mean group size."""

    @property
    def waiting(self) -> int:
        """Items not yet in a group being applied."""
        return len(self._waiting)

    async def run(self, item: I) -> O:
        """`item`'s outcome once its group is applied (raised when it is an exception)."""
        answer: asyncio.Future[O] = asyncio.get_running_loop().create_future()
        self._waiting.append(_Waiting(item, self._identity(item), answer))
        self._start()
        # Awaited bare: cancelling the caller cancels this future alone, never the group's runner,
        # which then skips the answer (no shield, whose outer future costs a few per cent per item).
        return await answer

    def _start(self) -> None:
        while self._waiting and self._running < self.concurrency:
            self._running += 1
            task = asyncio.create_task(self._run_while_waiting())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _run_while_waiting(self) -> None:
        try:
            while self._waiting:
                await self._run_group(self._next_group())
        finally:
            self._running -= 1
            self._start()  # what arrived as this runner stopped

    def _next_group(self) -> list[_Waiting[I, O]]:
        group: list[_Waiting[I, O]] = []
        seen: set[Hashable] = set()
        later: list[_Waiting[I, O]] = []
        while self._waiting and len(group) < self.max_items:
            waiting = self._waiting.popleft()
            if waiting.identity in seen:
                later.append(waiting)
            else:
                seen.add(waiting.identity)
                group.append(waiting)
        self._waiting.extendleft(reversed(later))
        return group

    async def _run_group(self, group: list[_Waiting[I, O]]) -> None:
        outcomes: Sequence[O | Exception]
        try:
            outcomes = await self._apply([waiting.item for waiting in group])
            if len(outcomes) != len(group):
                raise AssertionError(f"apply gave {len(outcomes)} outcomes for {len(group)} items")
        except Exception as exc:
            outcomes = [exc] * len(group)
        except BaseException:
            for waiting in group:
                waiting.answer.cancel()
            raise
        self.applied_groups += 1
        self.applied_items += len(group)
        for waiting, outcome in zip(group, outcomes, strict=True):
            if waiting.answer.done():  # its caller was cancelled
                continue
            if isinstance(outcome, Exception):
                waiting.answer.set_exception(outcome)
            else:
                waiting.answer.set_result(outcome)
