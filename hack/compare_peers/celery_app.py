"""
The Celery application `hack/bench.py compare` starts as `celery -A compare_peers.celery_app worker`.

One no-op task. The broker comes from $LADING_COMPARE_BROKER. Tasks are acknowledged late
(after they ran), keep no result, and use JSON. The harness learns what happened through the FIFO
named by $LADING_COMPARE_FIFO, without a result backend and without adding work to a database:

- `s`, once per pool process, when it starts its first task (the run's start is the first `s`);
- `.`, once per task, when the worker's main process acknowledges it to the broker: with
  `acks_late` a task is done only then (its message leaves the queue), as a Lading job is done
  when its commit returns. The pool process's `task_postrun` comes earlier, before its result has
  reached the main process: counting those and stopping the worker at once could stop it before
  the last acknowledgements were sent, which left their messages in the queue.

Each byte is one `write` (atomic on a FIFO), so bytes from the processes never mix.
"""

from __future__ import annotations

import os
from typing import Any

from celery import Celery, Task  # type: ignore[import-untyped]
from celery.signals import task_prerun  # type: ignore[import-untyped]
from celery.worker.request import Request  # type: ignore[import-untyped]

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

_fifo: int | None = None
_started = False


def _signal(byte: bytes) -> None:
    global _fifo
    path = os.environ.get("LADING_COMPARE_FIFO")
    if path is None:
        return
    if _fifo is None:
        _fifo = os.open(path, os.O_WRONLY)
    os.write(_fifo, byte)


class AcknowledgedRequest(Request):  # type: ignore[misc]
    """A task's request in the worker's main process: one `.` when its message is acknowledged."""

    def acknowledge(self) -> None:
        already = self.acknowledged
        super().acknowledge()
        if not already:
            _signal(b".")


class CountedTask(Task):  # type: ignore[misc]
    Request = AcknowledgedRequest


@app.task(name=TASK_NAME, base=CountedTask)  # type: ignore[untyped-decorator,misc,unused-ignore]
def noop() -> None:
    return None


@task_prerun.connect  # type: ignore[untyped-decorator,misc,unused-ignore]
def _first_start(**_: Any) -> None:
    """One `s` per pool process, before its first task runs."""
    global _started
    if not _started:
        _started = True
        _signal(b"s")
