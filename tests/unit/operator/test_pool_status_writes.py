"""When a pool's status is written: a change of the numbers in scalingReason alone (the oldest job's age, the
idle seconds) waits for CLOCK_REFRESH_S; new words in it, or any other field, go out at once (against the
emulator, counting writes)."""

from __future__ import annotations

import time
from typing import Any

import kopf
from lading_operator import kube, pools, runtime, settings

from tests.support import kube_emulator

WAITING = "backlog 40, oldest 31s ≤ target 120s: keep 1"
STATUS = {"workers": 1, "desiredWorkers": 1, "scalingReason": WAITING}


def _writes(emulator: kube_emulator.KubeEmulator) -> int:
    return sum(n for what, n in emulator.breakdown().items() if what.endswith("inferencepools/status"))


def test_numbers_only() -> None:
    aged = {**STATUS, "scalingReason": "backlog 40, oldest 46s ≤ target 120s: keep 1"}
    assert pools.numbers_only(STATUS, aged)
    assert not pools.numbers_only(STATUS, STATUS), "no change is not a change of numbers"
    assert not pools.numbers_only(STATUS, {**STATUS, "scalingReason": "idle 5s: keep 1"})
    assert not pools.numbers_only(STATUS, {**aged, "desiredWorkers": 2})
    assert not pools.numbers_only({"workers": 1}, STATUS), "a reason appearing is news"


async def test_a_change_of_numbers_only_waits_and_any_other_change_is_written() -> None:
    async with kube_emulator.serving(validate=False) as emulator, kube.Client(
        kube.for_server(str(emulator.servers[0].url))
    ) as api:
        config = settings.OperatorSettings(database_url="postgresql://x/y")
        rt = runtime.Runtime(settings=config, db=None, api=api, cluster=api.cluster)
        body = kopf.Body({"metadata": {"namespace": "acme", "name": "p", "uid": "u"}, "spec": {}, "status": {}})
        reconciler = pools.Reconciler(rt, body)

        await reconciler._write(dict(STATUS))
        assert _writes(emulator) == 1, "the first status is written"
        aged: dict[str, Any] = {**STATUS, "scalingReason": "backlog 40, oldest 46s ≤ target 120s: keep 1"}
        await reconciler._write(aged)
        assert _writes(emulator) == 1, "only the age moved: not written yet"
        idle = {**STATUS, "scalingReason": "idle 15s: keep 1 until idle for 300s"}
        await reconciler._write(idle)
        assert _writes(emulator) == 2, "the situation changed: written"
        await reconciler._write({**idle, "scalingReason": "idle 30s: keep 1 until idle for 300s", "workers": 0})
        assert _writes(emulator) == 3, "another field changed: written, with the reason"
        reconciler.last_write_at = time.monotonic() - pools.CLOCK_REFRESH_S
        await reconciler._write({**idle, "scalingReason": "idle 330s: keep 1 until idle for 300s", "workers": 0})
        assert _writes(emulator) == 4, "after CLOCK_REFRESH_S the numbers are refreshed"
        assert reconciler.last_written["scalingReason"].startswith("idle 330s")
