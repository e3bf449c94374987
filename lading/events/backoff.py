"""
Waits between reconnection (and retry) attempts: exponential with full jitter, capped, and
interruptible by a stop event. The core cannot import the worker's loop helpers, so the two
event loops share these.
"""

from __future__ import annotations

import asyncio
import contextlib
import random


def full_jitter(failures: int, *, base_s: float, cap_s: float) -> float:
    """A random wait in [0, min(cap, base * 2^(failures-1))]: replicas that lost the broker
    together do not come back in lockstep."""
    exponent = min(max(failures - 1, 0), 30)
    return random.uniform(0, min(cap_s, base_s * 2**exponent))


async def wait_or_stop(stop: asyncio.Event, timeout_s: float) -> None:
    """Sleep up to `timeout_s`, returning early when `stop` is set."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=max(timeout_s, 0.0))
