"""
The reconcile loop every ExtractionBatch and InferencePool runs (one kopf daemon per object).

    reconcile_forever(step)
      step()               one reconcile of the object; returns the seconds until the next
      wait                 until woken (runtime.wakeup: the object or what it waits on changed),
                           stopped, or the seconds pass
      database/API error   warning, then a doubling wait: retry_initial_s .. retry_max_s
      any other error      logged with its traceback and a ReconcileError Warning Event on the
                           object, then the same doubling wait: one object's bug must not stop
                           the loop for good

The loop's shape (run once, wait or stop, back off) is `lading.looping`'s, like every other loop
in Lading; what one step does lives with its kind (batches.py; pools.py and pool_steps/).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
import kopf

from lading import errors, looping
from lading_operator import conditions, events, kube, runtime

logger = logging.getLogger("lading.operator")

TRANSIENT: tuple[type[Exception], ...] = (
    OSError, asyncpg.PostgresError, asyncpg.InterfaceError, errors.TemporaryError, kube.KubeError,
)
"""Errors of the database or the API server: worth a warning and a retry, not an Event."""


async def reconcile_forever(
        step: Callable[[], Awaitable[float]],
        *,
        rt: runtime.Runtime,
        key: runtime.ObjectKey,
        body: kopf.Body,
        name: str,
        stopped: Any,
) -> None:
    """Run `step` until `stopped` (kopf's DaemonStopped), sleeping between steps on the object's
    wake-up event; `name` (e.g. "batch ns/name") starts every log line."""
    wake = rt.wakeup(key)

    async def once() -> float:
        wake.clear()  # whatever woke us is looked at by this step
        return await step()

    def on_error(exc: BaseException) -> None:
        if not isinstance(exc, TRANSIENT):
            events.warning(body, reason=conditions.RECONCILE_ERROR, message=type(exc).__name__)

    await looping.run_forever(
        once, stopped, name=name, pause_s=lambda interval_s: interval_s, transient=TRANSIENT,
        backoff=looping.Backoff(base_s=rt.settings.retry_initial_s, cap_s=rt.settings.retry_max_s, jitter="none"),
        logger=logger, wake=wake, on_error=on_error, unexpected=True,
    )
