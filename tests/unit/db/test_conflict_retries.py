"""Retrying lock conflicts (lading.db.conflicts), without a database: which errors are retried,
how long the pauses are, and where it gives up."""

from __future__ import annotations

from collections.abc import Callable

import asyncpg
import pytest

from lading.db import conflicts


class Work:
    """A unit of work that raises the given errors in turn, then returns "done"."""

    def __init__(self, *errors: BaseException) -> None:
        self.errors = list(errors)
        self.calls = 0

    async def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "done"


class Sleeps:
    def __init__(self) -> None:
        self.waits: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)


def deadlock() -> asyncpg.PostgresError:
    return asyncpg.exceptions.DeadlockDetectedError("deadlock detected")


def serialization() -> asyncpg.PostgresError:
    return asyncpg.exceptions.SerializationError("could not serialize access due to concurrent update")


@pytest.mark.parametrize("make", [deadlock, serialization], ids=["40P01", "40001"])
async def test_a_conflict_is_retried_until_the_work_succeeds(make: Callable[[], asyncpg.PostgresError]) -> None:
    work, sleeps = Work(make(), make()), Sleeps()
    assert await conflicts.retrying(work, what="test", sleep=sleeps) == "done"
    assert work.calls == 3
    assert len(sleeps.waits) == 2


async def test_pauses_are_full_jitter_within_a_doubling_capped_bound() -> None:
    work, sleeps = Work(*(deadlock() for _ in range(6))), Sleeps()
    draws = iter([1.0, 0.5, 1.0, 0.0, 1.0, 0.25])
    await conflicts.retrying(
        work, what="test", attempts=7, base_s=0.01, cap_s=0.05, sleep=sleeps, rand=lambda: next(draws)
    )
    # bounds 0.01, 0.02, 0.04, 0.05 (capped), 0.05, 0.05, each scaled by its draw
    assert sleeps.waits == pytest.approx([0.01, 0.01, 0.04, 0.0, 0.05, 0.0125])


async def test_real_jitter_spreads_the_pauses() -> None:
    work, sleeps = Work(*(deadlock() for _ in range(40))), Sleeps()
    await conflicts.retrying(work, what="test", attempts=41, base_s=0.1, cap_s=0.1, sleep=sleeps)
    assert all(0.0 <= w <= 0.1 for w in sleeps.waits)
    assert len(set(sleeps.waits)) > 30  # not one fixed delay: losers do not come back in lockstep


async def test_gives_up_after_the_bound_with_the_last_conflict() -> None:
    last = deadlock()
    work, sleeps = Work(deadlock(), serialization(), last, deadlock()), Sleeps()
    with pytest.raises(asyncpg.exceptions.DeadlockDetectedError) as raised:
        await conflicts.retrying(work, what="test", attempts=3, sleep=sleeps)
    assert raised.value is last
    assert work.calls == 3
    assert len(sleeps.waits) == 2


@pytest.mark.parametrize(
    "error",
    [
        asyncpg.exceptions.CharacterNotInRepertoireError("invalid byte sequence for encoding \"UTF8\": 0x00"),
        asyncpg.exceptions.NumericValueOutOfRangeError("integer out of range"),
        asyncpg.exceptions.UniqueViolationError("duplicate key"),
        asyncpg.exceptions.LockNotAvailableError("could not obtain lock"),
        asyncpg.exceptions.QueryCanceledError("canceling statement due to statement timeout"),
        asyncpg.exceptions.ConnectionDoesNotExistError("connection was closed"),
        OSError("connection refused"),
        ValueError("a bug"),
    ],
    ids=lambda e: type(e).__name__,
)
async def test_anything_else_is_raised_at_once(error: BaseException) -> None:
    work, sleeps = Work(error), Sleeps()
    with pytest.raises(type(error)):
        await conflicts.retrying(work, what="test", sleep=sleeps)
    assert work.calls == 1
    assert sleeps.waits == []


def test_conflicts_are_told_by_sqlstate() -> None:
    assert conflicts.is_conflict(deadlock())
    assert conflicts.is_conflict(serialization())
    assert not conflicts.is_conflict(asyncpg.exceptions.CharacterNotInRepertoireError("NUL"))
    assert not conflicts.is_conflict(OSError())


async def test_at_least_one_attempt() -> None:
    with pytest.raises(ValueError, match="attempts must be at least 1"):
        await conflicts.retrying(Work(), what="test", attempts=0)
