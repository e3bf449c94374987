"""
Repository of result reuse (migrations 0019, 0029 and 0041, docs/reuse.md): which claimed jobs take an earlier
accepted result, which wait for a duplicate in flight, which call the model; and the finish of the
jobs that took a result; how many jobs of a batch took one. The queries are `job_resolve_reuse`,
`job_finish_reused_many` and `job_count_reused_of_batch` in `sql/jobs.sql`.

What decides "the same result" and the single flight live in the database
(`lading_reuse_key`, `lading_reuse_resolve`); what a worker does with a decision is
`lading_worker.reusing`.
"""

from __future__ import annotations

import dataclasses
import decimal
import enum
from collections.abc import Sequence
from typing import Any

import asyncpg

from lading.db import queries
from lading.ids import BatchId, Fence, JobId, WorkerId
from lading.jobs import transitions


class Kind(enum.StrEnum):
    REUSE = "reuse"  #: an accepted result of the same tenant and key exists: take it
    WAIT = "wait"  #: a duplicate is being extracted: give the claim back and look again shortly
    LEAD = "lead"  #: call the model (duplicates that come later wait for this job)


@dataclasses.dataclass(frozen=True)
class Decision:
    kind: Kind
    other_job: JobId | None = None
    """REUSE: the job whose result is taken. WAIT: the duplicate being extracted."""
    waits: int = 0
    """WAIT: how often this job already gave its claim back for a duplicate."""
    result: dict[str, Any] | None = None
    """REUSE: the result taken, as stored (a reviewer's correction included)."""
    validation: dict[str, Any] | None = None
    """REUSE: the verdict stored with it."""
    saved_cost: decimal.Decimal | None = None
    """REUSE: what the job the result is taken from cost (None: unpriced)."""
    saved_currency: str | None = None


LEAD = Decision(Kind.LEAD)


async def resolve(
        conn: asyncpg.Connection,
        claimed: Sequence[tuple[JobId, Fence]],
        *,
        worker_id: WorkerId,
        model: str,
        prompt_version: str,
        judging: str,
        wait_margin_s: float,
) -> dict[JobId, Decision]:
    """The decision for each claimed job this worker still owns, in one round trip (jobs it no
    longer owns are absent), for a worker calling `model` with `prompt_version` and judging with
    `judging` (`lading.reuse.Producer`). `wait_margin_s`: a job waits for a duplicate only while
    its deadline is further away than this."""
    if not claimed:
        return {}
    rows = await conn.fetch(
        queries.sql("job_resolve_reuse"),
        [j for j, _ in claimed], [f for _, f in claimed], worker_id, model, prompt_version, judging, wait_margin_s,
    )  # fmt: skip
    return {JobId(r["job_id"]): LEAD if r["decision"] == Kind.LEAD else _decision(r) for r in rows}


def _decision(row: asyncpg.Record) -> Decision:
    return Decision(
        kind=Kind(row["decision"]),
        other_job=None if row["other_job"] is None else JobId(row["other_job"]),
        waits=row["waits"] or 0,
        result=row["result"],
        validation=row["validation"],
        saved_cost=row["saved_cost"],
        saved_currency=row["saved_currency"],
    )


async def finish_reused_many(
        conn: asyncpg.Connection,
        finishes: Sequence[transitions.Finish],
        *,
        worker_id: WorkerId,
) -> set[JobId]:
    """Apply finishes that took an earlier result (`transitions.reused`); returns the ids applied.
    A stale one changes nothing and is recorded in `stale_completions`, as in `jobs.finish_many`."""
    if not finishes:
        return set()
    rows = await conn.fetch(
        queries.sql("job_finish_reused_many"),
        [f.job_id for f in finishes], [f.fence for f in finishes], [f.reused_from for f in finishes],
        [f.result for f in finishes], [f.validation for f in finishes], worker_id,
    )  # fmt: skip
    return {JobId(r["id"]) for r in rows}


async def count_reused_of_batch(conn: asyncpg.Connection | asyncpg.Pool, *, batch_id: BatchId) -> int:
    """How many jobs of the batch took an earlier accepted result instead of calling the model."""
    return int(await conn.fetchval(queries.sql("job_count_reused_of_batch"), batch_id))
