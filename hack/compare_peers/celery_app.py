"""
The Celery application `hack/bench.py compare` starts as `celery -A compare_peers.celery_app worker`.

One no-op task. The broker comes from $LADING_COMPARE_BROKER. Tasks are acknowledged late
(after they ran), keep no result, and use JSON. After each task, the pool process that ran it
writes one byte to the FIFO named by $LADING_COMPARE_FIFO; the harness counts the bytes, so it
sees every completion without a result backend and without adding work to a database.
"""

from __future__ import annotations

import os
from typing import Any

from celery import Celery  # type: ignore[import-untyped]
from celery.signals import task_postrun  # type: ignore[import-untyped]

TASK_NAME = "compare.noop"

app = Celery("lading_compare", broker=os.environ.get("LADING_COMPARE_BROKER", "amqp://guest:guest@127.0.0.1:5672//"))
app.conf.update(
    task_acks_late=True,
    task_ignore_result=True,
    result_backend=None,
    task_serializer="json",
    accept_content=["json"],
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
)


@app.task(name=TASK_NAME)  # type: ignore[untyped-decorator,misc,unused-ignore]
def noop() -> None:
    return None


_fifo: int | None = None


@task_postrun.connect  # type: ignore[untyped-decorator,misc,unused-ignore]
def _count_completion(**_: Any) -> None:
    """One byte per finished task, written by the pool process that ran it (a 1-byte write is atomic)."""
    global _fifo
    path = os.environ.get("LADING_COMPARE_FIFO")
    if path is None:
        return
    if _fifo is None:
        _fifo = os.open(path, os.O_WRONLY)
    os.write(_fifo, b".")
