"""The dispatcher's reaper and health refresh are loops of their own: they keep their pace while
every delivery lane is stuck in a slow send, and the lanes, reaper and refresh are named tasks."""

from __future__ import annotations

import asyncio
from typing import Any

from lading_worker import dispatching

from lading.delivery import egress
from lading.delivery import secrets as delivery_secrets
from lading.settings import DeliverySettings
from tests.support import waiting


def _dispatcher(**settings: Any) -> dispatching.Dispatcher:
    return dispatching.Dispatcher(
        None,  # type: ignore[arg-type]  # no database: every step is replaced below
        secrets=delivery_secrets.StaticSecrets({}), policy=egress.EgressPolicy(),
        settings=DeliverySettings(**settings),
    )


async def test_the_loops_are_named_lanes_reaper_and_health() -> None:
    dispatcher = _dispatcher(lanes=3)
    named = dispatcher.loops(asyncio.Event())
    try:
        assert [name for name, _ in named] == [
            "delivery lane 0", "delivery lane 1", "delivery lane 2", "delivery reaper", "delivery health",
        ]
    finally:
        for _, coroutine in named:
            coroutine.close()


async def test_reaping_and_health_go_on_while_every_lane_is_stuck_sending() -> None:
    dispatcher = _dispatcher(lanes=2, reap_interval_s=0.01, health_interval_s=0.01)
    stuck = asyncio.Event()
    calls = {"send": 0, "reap": 0, "health": 0}

    async def run_once(*, limit: int | None = None) -> dispatching.DispatchResult:
        calls["send"] += 1
        await stuck.wait()  # a receiver that never answers
        return dispatching.DispatchResult()

    async def reap_once() -> int:
        calls["reap"] += 1
        return 0

    async def refresh_health() -> None:
        calls["health"] += 1

    dispatcher.run_once = run_once  # type: ignore[method-assign]
    dispatcher.reap_once = reap_once  # type: ignore[method-assign]
    dispatcher.refresh_health = refresh_health  # type: ignore[method-assign]

    async def both_kept_going() -> bool:
        return calls["reap"] >= 3 and calls["health"] >= 3

    async with waiting.running(dispatcher.run_forever):
        await waiting.until(both_kept_going, timeout_s=10)
        assert calls["send"] == 2, "each lane is still in its first send"
        stuck.set()


async def test_a_database_failure_in_the_reaper_is_retried_not_fatal() -> None:
    dispatcher = _dispatcher(lanes=1, reap_interval_s=0.01, poll_interval_s=0.01)
    reaps = 0

    async def reap_once() -> int:
        nonlocal reaps
        reaps += 1
        if reaps < 3:
            raise OSError("connection refused")
        return 0

    async def idle(*, limit: int | None = None) -> dispatching.DispatchResult:
        return dispatching.DispatchResult()

    async def no_health() -> None:
        return None

    dispatcher.reap_once = reap_once  # type: ignore[method-assign]
    dispatcher.run_once = idle  # type: ignore[method-assign]
    dispatcher.refresh_health = no_health  # type: ignore[method-assign]

    async def recovered() -> bool:
        return reaps >= 4

    async with waiting.running(dispatcher.run_forever):
        await waiting.until(recovered, timeout_s=10)
