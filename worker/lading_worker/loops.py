"""Small helpers every loop shares: interruptible waits and jitter."""

from __future__ import annotations

import asyncio
import contextlib
import random


async def wait_or_stop(stop: asyncio.Event, timeout_s: float, *, wake: asyncio.Event | None = None) -> None:
    """Sleep up to `timeout_s`, returning early when `stop` (or `wake`) is set."""
    events = [stop] if wake is None else [stop, wake]
    waiters = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waiters, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await waiter


def jittered(interval_s: float, *, spread: float = 0.2) -> float:
    """`interval_s` ± `spread`, so replicas started together do not poll in lockstep."""
    return interval_s * (1 + random.uniform(-spread, spread))
