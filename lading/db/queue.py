"""
Repository of a batch's place in its pool's queue (`sql/queue.sql`): its priority class, changed
after acceptance, and its position among the pool's eligible work with an ETA.

`position` is the core's one read of "where is my batch": the operator writes it into the
ExtractionBatch's status, and any other front end (the intake API) calls the same function. The
definition (fair share, claim order, throughput) is in docs/fairness.md, "Queue position and ETA".
"""

from __future__ import annotations

import dataclasses
import math

import asyncpg

from lading.db import queries
from lading.ids import BatchId, PoolName, TenantName

PRIORITY_ROUND_JOBS = 1000
"""Jobs re-ranked per statement by `set_priority`: each round is one short transaction holding at most
this many row locks, so a priority change of a 1,000,000-job batch never holds the claimers up for long."""

THROUGHPUT_WINDOW_S = 600
"""The pool's throughput for an ETA is measured over the model calls that finished in this window: long
enough to smooth the bursts of one claim, short enough to follow a pool that was scaled."""


@dataclasses.dataclass(frozen=True)
class QueuePosition:
    """Where a batch's work stands in its pool's queue (docs/fairness.md, "Queue position and ETA")."""

    position: int | None
    """Eligible jobs of the pool claimed before the batch's next one (0: it is next); None when the batch
    has no job eligible now (all running, waiting for a retry, or suspended)."""
    remaining_calls: int
    """Model calls of the pool until the batch's last job is claimed, its running ones included."""
    calls_per_s: float
    """Model calls of the pool that finished per second over `THROUGHPUT_WINDOW_S`."""

    @property
    def eta_s(self) -> int | None:
        """Seconds until the batch's last job is done at the measured throughput; None when nothing was
        measured (an idle or new pool) or nothing remains."""
        if self.calls_per_s <= 0 or self.remaining_calls <= 0:
            return None
        return math.ceil(self.remaining_calls / self.calls_per_s)


async def position(
        conn: asyncpg.Connection | asyncpg.Pool,
        *,
        pool: PoolName,
        tenant: TenantName,
        batch_id: BatchId | None,
        documents: int = 0,
) -> QueuePosition:
    """The queue position and ETA of batch `batch_id`; with `batch_id` None, of a batch of `documents`
    not accepted yet (queued behind all its tenant's eligible work in the pool)."""
    row = await conn.fetchrow(
        queries.sql("job_queue_position_of_batch"), pool, tenant, batch_id, documents, THROUGHPUT_WINDOW_S
    )
    assert row is not None  # one row always: the query aggregates
    eligible = batch_id is None or bool(row["has_eligible"])
    return QueuePosition(
        position=int(row["position"]) if eligible else None,
        remaining_calls=int(row["remaining"]),
        calls_per_s=float(row["calls_per_s"] or 0.0),
    )


async def priority(conn: asyncpg.Connection | asyncpg.Pool, *, batch_id: BatchId) -> int | None:
    """The priority class (0 high, 1 normal, 2 low) the batch has now; None for an unknown batch."""
    value = await conn.fetchval(queries.sql("batch_get_priority"), batch_id)
    return None if value is None else int(value)


async def set_priority(
        conn: asyncpg.Connection,
        *,
        batch_id: BatchId,
        priority: int,
        round_jobs: int = PRIORITY_ROUND_JOBS,
) -> int:
    """Give the batch's unfinished jobs, then the batch row, priority class `priority`, in rounds of
    `round_jobs` jobs (one transaction each, rows locked in id order); returns how many jobs changed.
    Interrupted, the batch row still has the old class, so a second call finishes the change."""
    changed = 0
    while True:
        rows = await conn.fetch(queries.sql("job_set_priority_of_batch"), batch_id, priority, round_jobs)
        changed += len(rows)
        if len(rows) < round_jobs:
            break
    await conn.execute(queries.sql("batch_set_priority"), batch_id, priority)
    return changed
