"""When a batch's status is written: a change only of the clock-driven fields (the oldest job's age, the
ETA) waits for CLOCK_REFRESH_S; anything else goes out with them (against the emulator, counting writes)."""

from __future__ import annotations

import time
from typing import Any

import kopf
from lading_operator import batches, kube, runtime, settings

from tests.support import kube_emulator

STATUS = {"phase": "Pending", "total": 3, "ready": 3, "oldestEligibleAgeSeconds": 10, "queuePosition": 4}


def _writes(emulator: kube_emulator.KubeEmulator) -> int:
    return sum(n for what, n in emulator.breakdown().items() if what.endswith("extractionbatches/status"))


async def test_a_clock_only_change_waits_and_any_other_change_carries_it() -> None:
    async with kube_emulator.serving(validate=False) as emulator, kube.Client(
        kube.for_server(str(emulator.servers[0].url))
    ) as api:
        config = settings.OperatorSettings(database_url="postgresql://x/y", status_interval_s=0.0)
        rt = runtime.Runtime(settings=config, db=None, api=api, cluster=api.cluster)
        body = kopf.Body({"metadata": {"namespace": "acme", "name": "b", "uid": "u"}, "spec": {}, "status": STATUS})
        reconciler = batches.Reconciler(rt, body)
        reconciler.last_write_at = time.monotonic()

        older: dict[str, Any] = {**STATUS, "oldestEligibleAgeSeconds": 70, "etaSeconds": 600}
        await reconciler._write(older)  # an ETA appearing is news
        assert _writes(emulator) == 1
        await reconciler._write({**older, "oldestEligibleAgeSeconds": 130, "etaSeconds": 540})
        assert _writes(emulator) == 1, "the clock alone moved: not written yet"
        await reconciler._write({**older, "oldestEligibleAgeSeconds": 130, "queuePosition": 2})
        assert _writes(emulator) == 2, "a new queue position is written, with the age"
        reconciler.last_write_at = time.monotonic() - batches.CLOCK_REFRESH_S
        await reconciler._write({**older, "oldestEligibleAgeSeconds": 430, "queuePosition": 2})
        assert _writes(emulator) == 3, "after CLOCK_REFRESH_S the age is refreshed"
        assert reconciler.last_written["oldestEligibleAgeSeconds"] == 430
