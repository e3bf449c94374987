"""
The one shape of every background loop in Lading: run once, wait, run again, until stopped.

Every long-running loop (the worker's claimer, heartbeater, committer and reaper, the outbox
relay and the ingress consumer, the delivery dispatcher and its reaper and health refresh, the
limiter client, the gauge refresher, the operator's reconcile loops) is built from the pieces
here, so a loop reads the same in every component and a change to how loops wait or back off
is made once:

    wait_or_stop(stop, timeout_s, wake=...)  sleep, returning early on stop (or a wake-up)
    jittered(interval_s)                      interval ± 20 %: replicas do not poll in lockstep
    backoff_ceiling_s(n, base_s, cap_s)       min(cap, base * 2^(n-1)): the doubling, capped
    full_jitter(n, base_s, cap_s)             uniform in [0, ceiling]: a burst is spread out
    Backoff                                   consecutive failures -> the next wait; reset on success
    run_forever(step, stop, ...)              a step repeated until stop; transient errors back off
    spawn(named) / supervise(tasks, stop)     named tasks; any exit stops all, its error re-raised

What this module does not own: what a step does (each loop's `run_once`), and the job retry
decision (`lading.jobs.retry`, which uses the same doubling through `RetryPolicy`). Lock
conflicts inside one unit of work are retried by `lading.db.conflicts`, below any loop.

It imports nothing from Lading, so every layer of the core and every component may use it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import Any, Final, Literal, Protocol, TypeVar

T = TypeVar("T")

JITTER_SPREAD_DEFAULT: Final = 0.2
"""± this fraction around a polling interval: enough to de-synchronise replicas started together,
small enough that an interval still means what it says."""

EXPONENT_MAX: Final = 1000
"""Doubling stops growing here: 2.0 ** 1024 overflows a float, and any exponent this large is far
beyond every sane cap anyway."""

BUG_SQLSTATE_CLASSES: Final = frozenset({"0A", "23", "2B", "42", "P0", "XX"})
"""SQLSTATE classes a retry does not fix and that point at our code, not at the database being
away: feature not supported, integrity constraint violation (a key or check our statements
should have respected), dependent privilege, syntax error or access rule violation (a missing
migration or grant), a raised PL/pgSQL exception, internal error. A loop that lists the driver's
errors as transient still backs off from these (the process keeps its other loops: a worker's
heartbeats must go on), but logs them at ERROR with the traceback, not as a passing warning."""

Jitter = Literal["full", "none"]
"""How a backoff wait is drawn below its ceiling: `full` (uniform in [0, ceiling], AWS "Exponential
Backoff and Jitter") or `none` (exactly the ceiling, for loops where one instance backs off alone)."""


class Stop(Protocol):
    """What a loop waits on to end: an `asyncio.Event`, or kopf's `DaemonStopped` flag."""

    async def wait(self) -> Any: ...


# Waiting -------------------------------------------------------------------------------------


async def wait_or_stop(stop: Stop, timeout_s: float, *, wake: asyncio.Event | None = None) -> None:
    """Sleep up to `timeout_s` (a negative value counts as 0), returning early when `stop` (or
    `wake`) is set. It never clears `wake`: the loop that owns the event does."""
    waiters = [asyncio.ensure_future(stop.wait())]
    if wake is not None:
        waiters.append(asyncio.ensure_future(wake.wait()))
    try:
        await asyncio.wait(waiters, timeout=max(timeout_s, 0.0), return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
        for waiter in waiters:
            with contextlib.suppress(asyncio.CancelledError):
                await waiter


def jittered(
        interval_s: float, *, spread: float = JITTER_SPREAD_DEFAULT, rand: Callable[[], float] = random.random
) -> float:
    """`interval_s` ± `spread` (a fraction), so replicas started together do not poll in lockstep."""
    return interval_s * (1 + spread * (2 * rand() - 1))


# Backing off ---------------------------------------------------------------------------------


def backoff_ceiling_s(failures: int, *, base_s: float, cap_s: float) -> float:
    """The longest wait after `failures` consecutive failures: `min(cap_s, base_s * 2^(failures-1))`.
    `failures` below 1 counts as 1."""
    exponent = min(max(failures - 1, 0), EXPONENT_MAX)
    return min(cap_s, base_s * 2.0**exponent)


def full_jitter(failures: int, *, base_s: float, cap_s: float, rand: Callable[[], float] = random.random) -> float:
    """A uniform wait in [0, backoff_ceiling_s(failures)]: replicas that failed together do not come
    back in lockstep."""
    return rand() * backoff_ceiling_s(failures, base_s=base_s, cap_s=cap_s)


@dataclasses.dataclass
class Backoff:
    """Consecutive failures of one loop, and the wait each one earns.

        failed()     one more failure; returns the wait before the next try
        succeeded()  the streak is over; the next failure waits from `base_s` again
    """

    base_s: float
    """The ceiling of the first wait; doubled per consecutive failure."""
    cap_s: float
    """No wait is longer than this."""
    jitter: Jitter = "full"
    """`full` for anything many replicas do at once; `none` where one instance backs off alone."""
    rand: Callable[[], float] = dataclasses.field(default=random.random, repr=False)
    failures: int = 0
    """Consecutive failures so far."""

    def failed(self) -> float:
        self.failures += 1
        ceiling = backoff_ceiling_s(self.failures, base_s=self.base_s, cap_s=self.cap_s)
        return ceiling if self.jitter == "none" else self.rand() * ceiling

    def succeeded(self) -> None:
        self.failures = 0


# Running -------------------------------------------------------------------------------------


async def run_forever(
        step: Callable[[], Awaitable[T]],
        stop: Stop,
        *,
        name: str,
        pause_s: Callable[[T], float],
        transient: tuple[type[BaseException], ...],
        backoff: Backoff,
        logger: logging.Logger,
        wake: asyncio.Event | None = None,
        on_error: Callable[[BaseException], None] | None = None,
        unexpected: bool = False,
) -> None:
    """Run `step` until `stop` is set, waiting `pause_s(result)` after each success (0: go again at
    once) and a backoff after each failure.

    An exception in `transient` is logged as a warning and backed off from (at ERROR with its
    traceback when its SQLSTATE says it is a bug, `is_bug`); any other exception
    ends the loop (the supervisor stops the process), unless `unexpected` is set: then it is logged
    with its traceback and backed off from too (a reconcile loop must outlive a bug in one object).
    `on_error` sees every exception that was backed off from (to post an Event, count a metric).
    """
    while not _is_set(stop):
        try:
            result = await step()
        except transient as exc:
            wait = backoff.failed()
            if is_bug(exc):
                logger.error("%s: %s is not transient: a bug, not an outage; retrying in %.1f s",
                             name, _describe(exc), wait, exc_info=exc)
            else:
                logger.warning("%s: %s; retrying in %.1f s", name, _describe(exc), wait)
            if on_error is not None:
                on_error(exc)
        except Exception as exc:
            if not unexpected:
                raise
            wait = backoff.failed()
            logger.exception("%s failed; retrying in %.1f s", name, wait)
            if on_error is not None:
                on_error(exc)
        else:
            backoff.succeeded()
            wait = pause_s(result)
            if wait <= 0:
                continue
        await wait_or_stop(stop, wait, wake=wake)


def is_bug(exc: BaseException) -> bool:
    """Whether `exc` carries a SQLSTATE of `BUG_SQLSTATE_CLASSES` (duck-typed on `sqlstate`, the
    attribute asyncpg's errors have, so this module still imports nothing)."""
    sqlstate = getattr(exc, "sqlstate", None)
    return isinstance(sqlstate, str) and sqlstate[:2] in BUG_SQLSTATE_CLASSES


def _is_set(stop: Stop) -> bool:
    """Whether `stop` is set: `asyncio.Event.is_set()`, or the truth of kopf's `DaemonStopped`."""
    is_set = getattr(stop, "is_set", None)
    return bool(is_set()) if callable(is_set) else bool(stop)


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


# Named tasks ---------------------------------------------------------------------------------


def spawn(named: Iterable[tuple[str, Coroutine[Any, Any, Any]]]) -> list[asyncio.Task[Any]]:
    """One named task per (name, coroutine): names show in task dumps and in `supervise`'s errors."""
    return [asyncio.create_task(coroutine, name=name) for name, coroutine in named]


async def supervise(tasks: Iterable[asyncio.Task[Any]], *, stop: asyncio.Event) -> None:
    """Wait until `stop` is set or any task ends; then set `stop`, let every task finish, and
    re-raise the first error of a task that failed (a loop that returns on its own stops the
    others too: a process missing one of its loops is broken)."""
    tasks = list(tasks)
    stopper = asyncio.create_task(stop.wait(), name="stop signal")
    try:
        await asyncio.wait([stopper, *tasks], return_when=asyncio.FIRST_COMPLETED)
    finally:
        stop.set()
        stopper.cancel()
        results = await asyncio.gather(*tasks, stopper, return_exceptions=True)
    for result in results[:-1]:
        if isinstance(result, Exception):
            raise result


async def cancel_all(tasks: Iterable[asyncio.Task[Any]]) -> list[BaseException]:
    """Cancel `tasks` and wait for them; returns the errors they ended with (cancellation excluded)."""
    tasks = list(tasks)
    for task in tasks:
        task.cancel()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    return [r for r in results if isinstance(r, BaseException) and not isinstance(r, asyncio.CancelledError)]
