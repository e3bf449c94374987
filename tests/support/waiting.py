"""Wait on a condition with a timeout, never sleep and hope."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable


async def until(condition: Callable[[], Awaitable[bool]], *, timeout_s: float = 30.0, every_s: float = 0.05) -> None:
    deadline = time.monotonic() + timeout_s
    while not await condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"condition not met within {timeout_s} s")
        await asyncio.sleep(every_s)


@contextlib.asynccontextmanager
async def running(coroutine_factory: Callable[[asyncio.Event], Awaitable[None]]) -> AsyncIterator[asyncio.Event]:
    """Run a loop (e.g. `worker.run`) for the body of a `with`; always stop and await it, even on failure."""
    stop = asyncio.Event()
    task = asyncio.create_task(coroutine_factory(stop))  # type: ignore[arg-type]
    try:
        yield stop
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
