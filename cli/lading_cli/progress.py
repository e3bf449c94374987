"""
Progress of `lading run`: a live rich display for people at a terminal (done/total,
rate, ETA, per-state counts), plain lines for logs and pipes.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import IO, Protocol

import rich.console
import rich.progress

from lading.db import batches
from lading.jobs.states import JobState

_SHORT = {
    JobState.READY: "ready",
    JobState.RUNNING: "running",
    JobState.RETRY_SCHEDULED: "retry",
    JobState.SUCCEEDED: "ok",
    JobState.REVIEW_REQUIRED: "review",
    JobState.FAILED_TERMINAL: "failed",
    JobState.CANCELLED: "cancelled",
}


def describe_counts(counts: dict[JobState, int]) -> str:
    return " ".join(f"{_SHORT[state]}={n}" for state, n in counts.items() if n)


class Display(Protocol):
    def update(self, snapshot: Sequence[tuple[str, batches.Progress]]) -> None: ...
    def close(self) -> None: ...


class LiveDisplay:
    """A rich progress bar per batch."""

    def __init__(self, console: rich.console.Console) -> None:
        self._progress = rich.progress.Progress(
            rich.progress.TextColumn("[bold]{task.description}"),
            rich.progress.BarColumn(),
            rich.progress.MofNCompleteColumn(),
            rich.progress.TextColumn("{task.fields[rate]:>7.1f} jobs/s"),
            rich.progress.TimeRemainingColumn(),
            rich.progress.TextColumn("{task.fields[states]}"),
            console=console,
        )
        self._tasks: dict[str, rich.progress.TaskID] = {}
        self._started = time.monotonic()
        self._progress.start()

    def update(self, snapshot: Sequence[tuple[str, batches.Progress]]) -> None:
        elapsed = max(time.monotonic() - self._started, 1e-6)
        for name, progress in snapshot:
            if name not in self._tasks:
                self._tasks[name] = self._progress.add_task(name, total=progress.total, rate=0.0, states="")
            self._progress.update(
                self._tasks[name],
                completed=progress.settled,
                rate=progress.settled / elapsed,
                states=describe_counts(progress.counts),
            )

    def close(self) -> None:
        self._progress.stop()


class PlainDisplay:
    """One line per batch whenever its counts change, at most every `every_s` seconds."""

    def __init__(self, stream: IO[str], *, every_s: float = 2.0) -> None:
        self._stream = stream
        self._every_s = every_s
        self._last: dict[str, tuple[float, int]] = {}
        self._started = time.monotonic()

    def update(self, snapshot: Sequence[tuple[str, batches.Progress]]) -> None:
        now = time.monotonic()
        for name, progress in snapshot:
            last_time, last_settled = self._last.get(name, (0.0, -1))
            if progress.settled == last_settled or (now - last_time < self._every_s and not progress.done):
                continue
            self._last[name] = (now, progress.settled)
            rate = progress.settled / max(now - self._started, 1e-6)
            print(
                f"{name}: {progress.settled}/{progress.total} settled, {rate:.1f} jobs/s, "
                f"{describe_counts(progress.counts)}",
                file=self._stream,
                flush=True,
            )

    def close(self) -> None:
        return None
