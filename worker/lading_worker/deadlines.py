"""
Attempt timeouts by the granule: one timer per `granularity_s` of deadlines, shared by every model
call due in it, instead of one timer per call.

`asyncio.timeout` schedules a timer per call and cancels it when the call returns: a TimerHandle,
a push onto the event loop's heap and a cancelled handle left for the loop to sweep, about 8 % of a
worker's CPU per attempt when calls return at once (the no-op provider of `hack/bench.py`). Here a
call joins the set of calls due in its granule (a set insertion and removal); the granule's single
timer cancels whatever is still in it. A call is cancelled at most `granularity_s` after its
timeout, never before.

    async with deadlines.within(timeout_s):   # TimeoutError when the call outlived timeout_s
        outcome = await provider.extract(...)

As with `asyncio.timeout`, the cancellation is the task's own (`Task.cancel`, undone by
`Task.uncancel` on the way out), so a cancellation from elsewhere (shutdown, a lost lease) that
arrives meanwhile still propagates as CancelledError.
"""

from __future__ import annotations

import asyncio
import math
from types import TracebackType

GRANULARITY_DEFAULT_S = 0.1
"""How late a timeout may fire: short beside any attempt timeout (seconds to minutes), long enough
that thousands of calls a second share a few timers."""


class Deadlines:
    """The calls of one event loop, grouped by the granule their deadline falls in."""

    def __init__(self, *, granularity_s: float = GRANULARITY_DEFAULT_S) -> None:
        self._granularity_s = granularity_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._due: dict[int, set[Within]] = {}

    def within(self, timeout_s: float) -> Within:
        """An async context manager that raises TimeoutError when its body runs past `timeout_s`."""
        return Within(self, timeout_s)

    def _join(self, call: Within, deadline: float) -> set[Within]:
        """Add `call` to the set of its deadline's granule, scheduling the granule's timer when new."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # first use, or another loop (tests): the old timers are not ours
            self._loop, self._due = loop, {}
        granule = math.ceil(deadline / self._granularity_s)
        due = self._due.get(granule)
        if due is None:
            due = self._due[granule] = set()
            loop.call_at(granule * self._granularity_s, self._expire, granule)
        due.add(call)
        return due

    def _expire(self, granule: int) -> None:
        for call in self._due.pop(granule, ()):
            call.expire()


class Within:
    """One call's timeout (`Deadlines.within`)."""

    __slots__ = ("_cancelling", "_deadlines", "_due", "_expired", "_task", "_timeout_s")

    def __init__(self, deadlines: Deadlines, timeout_s: float) -> None:
        self._deadlines = deadlines
        self._timeout_s = timeout_s
        self._task: asyncio.Task[object] | None = None
        self._cancelling = 0
        self._due: set[Within] | None = None
        self._expired = False

    async def __aenter__(self) -> Within:
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("Deadlines.within() must be used inside a task")
        self._task = task
        self._cancelling = task.cancelling()
        self._due = self._deadlines._join(self, asyncio.get_running_loop().time() + self._timeout_s)
        return self

    async def __aexit__(
            self,
            exc_type: type[BaseException] | None,
            exc: BaseException | None,
            tb: TracebackType | None,
    ) -> None:
        if self._due is not None:
            self._due.discard(self)
        if self._expired and self._task is not None:
            # Undo our own cancellation; only when no one else cancelled meanwhile is it a timeout.
            if self._task.uncancel() <= self._cancelling and exc_type is asyncio.CancelledError:
                raise TimeoutError from exc

    def expire(self) -> None:
        """The granule's timer: cancel the call, which leaves the body as TimeoutError."""
        if self._task is not None and not self._task.done():
            self._expired = True
            self._task.cancel()
