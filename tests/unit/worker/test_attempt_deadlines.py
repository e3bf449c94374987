"""Model-call timeouts by the granule (lading_worker.deadlines): a call past its timeout ends in
TimeoutError, never before its timeout; one in time is left alone; a cancellation from elsewhere is
still a cancellation; calls due in the same granule share one timer."""

import asyncio

import pytest
from lading_worker import deadlines

GRANULE_S = 0.05


async def test_a_call_past_its_timeout_ends_in_timeout_error_not_before_it() -> None:
    watch = deadlines.Deadlines(granularity_s=GRANULE_S)
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(TimeoutError):
        async with watch.within(0.1):
            await asyncio.Event().wait()
    assert loop.time() - started >= 0.1
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0  # our cancellation was taken back


async def test_a_call_that_returns_in_time_is_left_alone_after_its_deadline() -> None:
    watch = deadlines.Deadlines(granularity_s=GRANULE_S)
    async with watch.within(0.05):
        await asyncio.sleep(0)
    await asyncio.sleep(0.2)  # its granule's timer fires meanwhile and finds nothing to cancel
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0


async def test_a_cancellation_from_elsewhere_is_not_turned_into_a_timeout() -> None:
    watch = deadlines.Deadlines(granularity_s=GRANULE_S)
    entered = asyncio.Event()

    async def call() -> None:
        async with watch.within(60):
            entered.set()
            await asyncio.Event().wait()

    task = asyncio.create_task(call())
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_cancellation_from_elsewhere_after_the_timeout_fired_is_still_a_cancellation() -> None:
    watch = deadlines.Deadlines(granularity_s=GRANULE_S)
    entered = asyncio.Event()

    async def call() -> None:
        async with watch.within(0.01):
            entered.set()
            try:
                await asyncio.Event().wait()
            finally:
                # Both cancellations arrive before the body leaves: shutdown wins over the timeout.
                asyncio.current_task().cancel()  # type: ignore[union-attr]
                await asyncio.sleep(0)

    task = asyncio.create_task(call())
    await entered.wait()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_calls_due_in_the_same_granule_share_one_timer() -> None:
    watch = deadlines.Deadlines(granularity_s=10.0)
    loop = asyncio.get_running_loop()
    scheduled = []
    call_at = loop.call_at

    def counting_call_at(when: float, callback, *args):  # type: ignore[no-untyped-def]
        scheduled.append(when)
        return call_at(when, callback, *args)

    loop.call_at = counting_call_at  # type: ignore[method-assign]
    try:
        async def call() -> None:
            async with watch.within(30):
                await asyncio.sleep(0)

        await asyncio.gather(*(call() for _ in range(100)))
    finally:
        del loop.call_at  # type: ignore[method-assign]
    assert 1 <= len(scheduled) <= 2  # one granule, or two when the calls straddle a granule's edge
