"""
Repository of `review_decisions` (`sql/review_decisions.sql`, migration 0003): the audit trail
of human review. `lading.reviewing` writes a decision in the transaction of the job's guarded
state change (`jobs.review_decide`), so the two commit together.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

import asyncpg

from lading.db import queries
from lading.ids import JobId


@dataclasses.dataclass(frozen=True)
class Recorded:
    id: int
    decided_at: dt.datetime


async def insert(
        conn: asyncpg.Connection,
        *,
        job_id: JobId,
        decision: str,
        reviewer: str,
        reason: str,
        previous_result: dict[str, Any] | None,
        previous_validation: dict[str, Any] | None,
        corrected_result: dict[str, Any] | None,
        corrected_validation: dict[str, Any] | None,
) -> Recorded:
    """Record one decision; the unique index on job_id refuses a second decision about a job."""
    row = await conn.fetchrow(
        queries.sql("review_decision_insert"),
        job_id, decision, reviewer, reason, previous_result, previous_validation, corrected_result,
        corrected_validation,
    )  # fmt: skip
    assert row is not None, "INSERT ... RETURNING returns the row"
    return Recorded(id=row["id"], decided_at=row["decided_at"])


async def list_of_job(conn: asyncpg.Connection, *, job_id: JobId) -> list[asyncpg.Record]:
    """The decisions about a job, oldest first: id, job_id, decision, reviewer, reason, decided_at,
    previous_result, previous_validation, corrected_result, corrected_validation."""
    rows: list[asyncpg.Record] = await conn.fetch(queries.sql("review_decision_list_of_job"), job_id)
    return rows
