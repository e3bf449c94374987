"""
Retrying a unit of work that lost a lock conflict: deadlocks (SQLSTATE 40P01) and
serialization failures (40001).

Every multi-row statement locks its rows in one canonical order (docs/architecture.md,
"Lock order"), so a deadlock should not happen. But the order is a rule people keep, not a
law the server enforces, and a serialization failure is legitimate under REPEATABLE READ or
SERIALIZABLE. Either way PostgreSQL has rolled the transaction back and says "try again":
the work itself is sound. So a writer whose transaction can meet one runs it through
`retrying`, which repeats it a bounded number of times after a full-jitter pause (two
losers that retried in lockstep would meet again).

What this module does not do:

- open transactions: `work` must be one whole unit of work (acquire, transaction, the
  statements), because the failed transaction is gone and must be rebuilt from scratch;
- retry anything else. A data error (`lading.storable.is_data_error`) fails the same way
  every time and is isolated there; an unreachable database is the caller's loop's business.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from typing import Final, TypeVar

import asyncpg

from lading import looping

logger = logging.getLogger(__name__)

T = TypeVar("T")

CONFLICT_SQLSTATES: Final = frozenset({"40P01", "40001"})
"""deadlock_detected and serialization_failure: the server rolled back, retrying may succeed."""

ATTEMPTS_DEFAULT: Final = 5
"""Tries in all. A conflict clears in one retry almost always; five bounds a pathological storm
to well under a second of waiting before the error reaches the caller's own loop."""
BASE_S_DEFAULT: Final = 0.01
"""First pause's upper bound; doubled per retry. About one statement's round trip."""
CAP_S_DEFAULT: Final = 0.2
"""No pause is longer than this: a lease or a heartbeat interval is seconds, and must not run out
while we wait."""


def is_conflict(exc: BaseException) -> bool:
    """True when `exc` is a deadlock or serialization failure (the transaction was rolled back)."""
    return isinstance(exc, asyncpg.PostgresError) and _sqlstate(exc) in CONFLICT_SQLSTATES


def pause_s(retry: int, *, base_s: float, cap_s: float, rand: Callable[[], float] = random.random) -> float:
    """Full jitter: a uniform wait in [0, min(cap, base * 2^(retry-1))] before retry number `retry`
    (the one backoff of every loop, `lading.looping.full_jitter`)."""
    return looping.full_jitter(retry, base_s=base_s, cap_s=cap_s, rand=rand)


async def retrying(
        work: Callable[[], Awaitable[T]],
        *,
        what: str,
        attempts: int = ATTEMPTS_DEFAULT,
        base_s: float = BASE_S_DEFAULT,
        cap_s: float = CAP_S_DEFAULT,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
        rand: Callable[[], float] = random.random,
) -> T:
    """Run `work()` (one whole unit of work); on a deadlock or serialization failure run it again
    after a full-jitter pause, up to `attempts` tries in all, then re-raise the last conflict.
    Any other exception propagates at once. `what` names the work in the log."""
    if attempts < 1:
        raise ValueError(f"attempts must be at least 1, not {attempts}")
    retry = 0
    while True:
        try:
            return await work()
        except asyncpg.PostgresError as exc:
            if not is_conflict(exc):
                raise
            retry += 1
            if retry >= attempts:
                logger.warning("%s: %s on each of %d tries; giving up", what, _sqlstate(exc), attempts)
                raise
            wait = pause_s(retry, base_s=base_s, cap_s=cap_s, rand=rand)
            logger.info("%s: %s (%s); retry %d in %.3f s", what, _sqlstate(exc), type(exc).__name__, retry, wait)
            await sleep(wait)


def _sqlstate(exc: BaseException) -> str:
    return str(getattr(exc, "sqlstate", "?"))
