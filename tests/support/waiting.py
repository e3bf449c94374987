"""Wait on a condition with a timeout, never sleep and hope."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable


async def until(condition: Callable[[], Awaitable[bool]], *, timeout_s: float = 30.0, every_s: float = 0.05) -> None:
    deadline = time.monotonic() + timeout_s
    while not await condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"condition not met within {timeout_s} s")
        await asyncio.sleep(every_s)
