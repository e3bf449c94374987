"""The shared loop pieces: waits end on stop or wake-up, backoff doubles to its cap and resets,
`run_forever` backs off from transient errors only, and supervised tasks stop together."""

from __future__ import annotations

import asyncio
import logging
import time

import asyncpg
import pytest

from lading import looping

LOGGER = logging.getLogger("tests.looping")


async def test_wait_returns_at_once_when_stop_is_set() -> None:
    stop = asyncio.Event()
    stop.set()
    started = time.monotonic()
    await looping.wait_or_stop(stop, 30.0)
    assert time.monotonic() - started < 1.0


async def test_wait_returns_when_woken_and_leaves_the_wake_event_set() -> None:
    stop, wake = asyncio.Event(), asyncio.Event()
    asyncio.get_running_loop().call_soon(wake.set)
    started = time.monotonic()
    await looping.wait_or_stop(stop, 30.0, wake=wake)
    assert time.monotonic() - started < 1.0
    assert wake.is_set() and not stop.is_set()


async def test_wait_times_out_and_a_negative_timeout_is_zero() -> None:
    stop = asyncio.Event()
    started = time.monotonic()
    await looping.wait_or_stop(stop, 0.05)
    await looping.wait_or_stop(stop, -5.0)
    assert 0.05 <= time.monotonic() - started < 1.0


async def test_wait_accepts_a_truthy_stop_flag_like_kopfs() -> None:
    class Flag:
        def __init__(self) -> None:
            self.event = asyncio.Event()

        def __bool__(self) -> bool:
            return self.event.is_set()

        async def wait(self) -> bool:
            await self.event.wait()
            return True

    flag = Flag()
    flag.event.set()
    calls = 0

    async def step() -> int:
        nonlocal calls
        calls += 1
        return 0

    await looping.run_forever(step, flag, name="flagged", pause_s=lambda _: 1.0, transient=(OSError,),
                              backoff=looping.Backoff(base_s=1, cap_s=1), logger=LOGGER)
    assert calls == 0


@pytest.mark.parametrize(("rand", "expected"), [(0.0, 8.0), (0.5, 10.0), (1.0, 12.0)])
def test_jittered_spreads_twenty_percent_either_side(rand: float, expected: float) -> None:
    assert looping.jittered(10.0, rand=lambda: rand) == pytest.approx(expected)


@pytest.mark.parametrize(("failures", "expected"), [(0, 0.5), (1, 0.5), (2, 1.0), (3, 2.0), (4, 4.0), (5, 4.0),
                                                    (10_000, 4.0)])
def test_backoff_ceiling_doubles_to_its_cap(failures: int, expected: float) -> None:
    assert looping.backoff_ceiling_s(failures, base_s=0.5, cap_s=4.0) == expected


def test_full_jitter_is_a_fraction_of_the_ceiling() -> None:
    assert looping.full_jitter(3, base_s=0.5, cap_s=4.0, rand=lambda: 0.25) == 0.5
    assert all(0.0 <= looping.full_jitter(3, base_s=0.5, cap_s=4.0) <= 2.0 for _ in range(200))


def test_backoff_grows_per_failure_and_resets_on_success() -> None:
    plain = looping.Backoff(base_s=1.0, cap_s=5.0, jitter="none")
    assert [plain.failed() for _ in range(5)] == [1.0, 2.0, 4.0, 5.0, 5.0]
    assert plain.failures == 5
    plain.succeeded()
    assert plain.failures == 0 and plain.failed() == 1.0

    jittered = looping.Backoff(base_s=1.0, cap_s=5.0, rand=lambda: 0.5)
    assert [jittered.failed() for _ in range(4)] == [0.5, 1.0, 2.0, 2.5]


async def test_run_forever_backs_off_from_transient_errors_and_resets_after_a_success() -> None:
    stop = asyncio.Event()
    outcomes: list[BaseException | int] = [OSError("down"), OSError("down"), 1, OSError("down"), 2]
    seen_backoffs: list[int] = []
    backoff = looping.Backoff(base_s=0.001, cap_s=0.001, jitter="none")

    async def step() -> int:
        seen_backoffs.append(backoff.failures)
        outcome = outcomes.pop(0)
        if isinstance(outcome, BaseException):
            raise outcome
        if not outcomes:
            stop.set()
        return outcome

    errors: list[BaseException] = []
    await looping.run_forever(step, stop, name="test loop", pause_s=lambda _: 0.0, transient=(OSError,),
                              backoff=backoff, logger=LOGGER, on_error=errors.append)
    assert seen_backoffs == [0, 1, 2, 0, 1]
    assert [type(e) for e in errors] == [OSError, OSError, OSError]
    assert backoff.failures == 0


async def test_run_forever_lets_an_unexpected_error_end_the_loop() -> None:
    async def step() -> int:
        raise ValueError("a bug")

    with pytest.raises(ValueError, match="a bug"):
        await looping.run_forever(step, asyncio.Event(), name="test loop", pause_s=lambda _: 0.0,
                                  transient=(OSError,), backoff=looping.Backoff(base_s=1, cap_s=1), logger=LOGGER)


async def test_run_forever_survives_an_unexpected_error_when_asked(caplog: pytest.LogCaptureFixture) -> None:
    stop = asyncio.Event()
    calls = 0

    async def step() -> int:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise ValueError("a bug in one object")
        stop.set()
        return 0

    await looping.run_forever(step, stop, name="reconcile x", pause_s=lambda _: 0.0, transient=(OSError,),
                              backoff=looping.Backoff(base_s=0.001, cap_s=0.001), logger=LOGGER, unexpected=True)
    assert calls == 2
    assert any("reconcile x failed" in r.getMessage() and r.exc_info for r in caplog.records)


@pytest.mark.parametrize(
    ("error", "level", "traceback"),
    [
        (asyncpg.UniqueViolationError("duplicate key value violates unique constraint"), logging.ERROR, True),
        (asyncpg.UndefinedColumnError("column x does not exist"), logging.ERROR, True),
        (asyncpg.CannotConnectNowError("the database system is starting up"), logging.WARNING, False),
        (asyncpg.DeadlockDetectedError("deadlock detected"), logging.WARNING, False),
    ],
    ids=["23505", "42703", "57P03", "40P01"],
)
async def test_run_forever_logs_a_bug_sqlstate_as_an_error_and_an_outage_as_a_warning(
        caplog: pytest.LogCaptureFixture, error: asyncpg.PostgresError, level: int, traceback: bool,
) -> None:
    stop = asyncio.Event()
    outcomes: list[BaseException | int] = [error, 1]

    async def step() -> int:
        outcome = outcomes.pop(0)
        if isinstance(outcome, BaseException):
            raise outcome
        stop.set()
        return outcome

    with caplog.at_level(logging.WARNING, logger=LOGGER.name):
        await looping.run_forever(step, stop, name="committer", pause_s=lambda _: 0.0,
                                  transient=(OSError, asyncpg.PostgresError),
                                  backoff=looping.Backoff(base_s=0.001, cap_s=0.001), logger=LOGGER)
    assert not outcomes, "the loop went on after the error"
    (record,) = [r for r in caplog.records if r.getMessage().startswith("committer:")]
    assert record.levelno == level
    assert bool(record.exc_info) is traceback
    assert ("a bug, not an outage" in record.getMessage()) is traceback


async def test_run_forever_waits_the_pause_its_result_asks_for() -> None:
    stop = asyncio.Event()
    calls: list[float] = []

    async def step() -> float:
        calls.append(time.monotonic())
        if len(calls) == 2:
            stop.set()
        return 0.1

    await looping.run_forever(step, stop, name="paced", pause_s=lambda pause: pause, transient=(OSError,),
                              backoff=looping.Backoff(base_s=1, cap_s=1), logger=LOGGER)
    assert len(calls) == 2 and calls[1] - calls[0] >= 0.1


async def test_supervise_stops_every_task_when_one_fails_and_reraises_its_error() -> None:
    stop = asyncio.Event()
    stopped: list[str] = []

    async def healthy(name: str) -> None:
        await stop.wait()
        stopped.append(name)

    async def broken() -> None:
        raise RuntimeError("loop died")

    tasks = looping.spawn([("a", healthy("a")), ("b", healthy("b")), ("broken", broken())])
    assert [t.get_name() for t in tasks] == ["a", "b", "broken"]
    with pytest.raises(RuntimeError, match="loop died"):
        await looping.supervise(tasks, stop=stop)
    assert stop.is_set() and sorted(stopped) == ["a", "b"]
    assert all(t.done() for t in tasks)


async def test_supervise_returns_quietly_when_stopped() -> None:
    stop = asyncio.Event()

    async def healthy() -> None:
        await stop.wait()

    tasks = looping.spawn([("a", healthy())])
    asyncio.get_running_loop().call_soon(stop.set)
    await looping.supervise(tasks, stop=stop)
    assert all(t.done() and t.exception() is None for t in tasks)


async def test_cancel_all_reports_errors_but_not_cancellation() -> None:
    async def forever() -> None:
        await asyncio.Event().wait()

    async def failing() -> None:
        raise KeyError("x")

    tasks = looping.spawn([("forever", forever()), ("failing", failing())])
    await asyncio.sleep(0)
    errors = await looping.cancel_all(tasks)
    assert [type(e) for e in errors] == [KeyError]
