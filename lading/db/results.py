"""
Repository of `results` (`sql/results.sql`) for human review: the stored result an approval
delivers, and a reviewer's correction replacing it.

An attempt's own result is written by `jobs.finish_many`, in the statement that settles the
job; reading results for people is `lading.db.reporting`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import asyncpg

from lading.db import queries
from lading.ids import JobId


@dataclasses.dataclass(frozen=True)
class Replaced:
    """What a correction replaced (None when the job had no result)."""

    previous_result: Any
    previous_validation: Any


async def get_for_approval(conn: asyncpg.Connection, *, job_id: JobId) -> Any:
    """The stored result of the job (None when it has none)."""
    return await conn.fetchval(queries.sql("result_get_for_approval"), job_id)


async def replace_corrected(
        conn: asyncpg.Connection,
        *,
        job_id: JobId,
        result: dict[str, Any],
        validation: dict[str, Any],
) -> Replaced | None:
    """Store a reviewer's result and the policy's verdict on it as the job's result; None when there is
    no such job. The fence stays that of the attempt that extracted."""
    row = await conn.fetchrow(queries.sql("result_replace_corrected"), job_id, result, validation)
    if row is None:
        return None
    return Replaced(previous_result=row["previous_result"], previous_validation=row["previous_validation"])
