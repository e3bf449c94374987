"""
Stopping the operator: kopf, once its own tasks have ended, waits up to 5 s for every task created
since it started and then cancels them. The operator's gauge refresher runs beside kopf and waits
between refreshes in such tasks, so it must be stopped with kopf (its cleanup activity), not after
kopf returns: else every stop (a SIGTERM, a rollout) hangs for kopf's 5 s and the refresher outlives
kopf. Read from kopf's own log lines, not from a clock.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import pytest

from lading import metrics
from tests.integration.operator import conftest
from tests.support.waiting import until

NOTHING_HUNG = "Hung tasks stopping is skipped: no tasks given."
"""kopf's line when no task created during its run outlived its own tasks."""
STILL_HUNG = "Hung tasks are stopped"
"""kopf's line when some did: it waited for them (up to 5 s), then cancelled them."""


async def test_a_stopped_operator_leaves_kopf_no_task_to_wait_for(
        db: Any, caplog: pytest.LogCaptureFixture,
        operator_factory: Callable[..., AbstractContextManager[conftest.OperatorThread]]) -> None:  # fmt: skip
    caplog.set_level(logging.DEBUG, logger="kopf")
    before = _refreshes()

    async def refreshed() -> bool:
        return _refreshes() > before

    with operator_factory() as handle:
        assert await asyncio.get_running_loop().run_in_executor(None, handle.ready.wait, 30)
        # The refresher is running (elected: nothing else stands here), waiting for its next round.
        await until(refreshed, timeout_s=30)
    lines = [record.getMessage() for record in caplog.records if record.name.startswith("kopf")]
    assert NOTHING_HUNG in lines
    assert not [line for line in lines if line.startswith(STILL_HUNG)]


def _refreshes() -> float:
    return metrics.REGISTRY.get_sample_value("lading_gauge_refreshes_total") or 0.0
