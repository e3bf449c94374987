"""
Repository of `results` (`sql/results.sql`) for human review: the stored result an approval
delivers, and a reviewer's correction replacing it.

An attempt's own result is written by `jobs.finish_many`, in the statement that settles the
job; `result_of` reads it, with its verdict, for people (`lading jobs show`, `lading review show`).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

import asyncpg

from lading.db import queries
from lading.ids import Fence, JobId
from lading.validation import verdicts


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

@dataclasses.dataclass(frozen=True)
class JobResult:
    """The stored extraction of a job and its validation verdict."""

    fence: Fence
    schema: str
    validation_policy: str
    passed: bool | None
    """The verdict; None if the stored verdict does not say."""
    failed_checks: tuple[verdicts.FailedCheck, ...]
    result: dict[str, Any] | None
    """The extracted JSON document, as stored; None once retention deleted it (the verdict stays)."""
    created_at: dt.datetime


async def result_of(conn: asyncpg.Connection, *, job_id: JobId) -> JobResult | None:
    """The job's stored result, which exists once it SUCCEEDED or needs review."""
    r = await conn.fetchrow(queries.sql("result_get_report"), job_id)
    if r is None:
        return None
    validation: Any = r["validation"]
    verdict: dict[str, Any] = validation if isinstance(validation, dict) else {}
    passed = verdict.get("passed")
    return JobResult(
        fence=Fence(r["fence"]),
        schema=r["schema"],
        validation_policy=r["validation_policy"],
        passed=passed if isinstance(passed, bool) else None,
        failed_checks=_failed_checks(verdict.get("failed_checks")),
        result=r["result"],
        created_at=r["created_at"],
    )


def _failed_checks(stored: Any) -> tuple[verdicts.FailedCheck, ...]:
    """The failed checks of a stored verdict (`Verdict.to_json()`), tolerating older or partial ones."""
    if not isinstance(stored, list):
        return ()
    return tuple(
        verdicts.FailedCheck.from_json(c)
        for c in stored
        if isinstance(c, dict)
    )
