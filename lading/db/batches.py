"""Repository of `batches`: progress counts and timing for status and `lading run`."""

from __future__ import annotations

import dataclasses
import datetime as dt

import asyncpg

from lading.db import queries
from lading.ids import BatchId
from lading.jobs.states import SETTLED, JobState


@dataclasses.dataclass(frozen=True)
class Progress:
    batch_id: BatchId
    total: int
    counts: dict[JobState, int]

    @property
    def settled(self) -> int:
        return sum(n for state, n in self.counts.items() if state in SETTLED)

    @property
    def done(self) -> bool:
        return self.settled >= self.total


async def progress(conn: asyncpg.Connection, *, batch_id: BatchId, total: int) -> Progress:
    rows = await conn.fetch(queries.sql("batch_counts"), batch_id)
    counts = {state: 0 for state in JobState}
    for row in rows:
        counts[JobState(row["state"])] = row["n"]
    return Progress(batch_id=batch_id, total=total, counts=counts)


async def set_suspended(conn: asyncpg.Connection, *, batch_id: BatchId, suspended: bool) -> int | None:
    """Suspend or resume a batch and its jobs in one statement; how many jobs changed, or None
    when there is no such batch. Suspended jobs are never claimed and never scanned by claims."""
    row = await conn.fetchrow(queries.sql("batch_set_suspended"), batch_id, suspended)
    return None if row is None else int(row["jobs"])


async def timing(conn: asyncpg.Connection, *, batch_id: BatchId) -> tuple[dt.datetime, dt.datetime | None]:
    row = await conn.fetchrow(queries.sql("batch_timing"), batch_id)
    assert row is not None, f"batch {batch_id} exists"
    return row["started_at"], row["last_change_at"]
