"""
Repository of what the HTTP intake reads: a job, its result, a batch by name, a page of a batch's
results, and a tenant's drain rate (for `Retry-After`). The batch's status itself comes from the
operator's reads (`lading.db.batches.get_observed`), so the API and the custom resource report the same
figures.

Every read of a job takes the caller's namespaces and filters by them in the same statement: a job
of another namespace is not found, exactly like one that does not exist.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Collection
from typing import Any

import asyncpg

from lading.db import queries
from lading.ids import BatchId, JobId, TenantName
from lading.jobs.states import JobState


@dataclasses.dataclass(frozen=True)
class Job:
    id: JobId
    state: JobState
    key: str
    attempt: int
    max_attempts: int
    available_at: dt.datetime
    deadline_at: dt.datetime
    created_at: dt.datetime
    updated_at: dt.datetime
    finished_at: dt.datetime | None
    last_error_class: str | None
    namespace: str
    batch_name: str


@dataclasses.dataclass(frozen=True)
class JobResult:
    id: JobId
    state: JobState
    key: str
    finished_at: dt.datetime | None
    result_deleted: bool
    result: Any
    verdict: Any
    schema: str | None
    validation_policy: str | None


@dataclasses.dataclass(frozen=True)
class Batch:
    id: BatchId
    tenant: TenantName
    namespace: str
    name: str
    uid: str
    idempotency_key: str
    pool: str
    endpoint: str | None
    suspended: bool
    total_jobs: int
    created_at: dt.datetime


@dataclasses.dataclass(frozen=True)
class ResultLine:
    job_id: JobId
    key: str
    state: JobState
    result_deleted: bool
    result: Any
    verdict: Any


@dataclasses.dataclass(frozen=True)
class DrainRate:
    jobs_per_s: float
    bytes_per_s: float


async def job(conn: asyncpg.Connection, *, job_id: JobId, namespaces: Collection[str]) -> Job | None:
    row = await conn.fetchrow(queries.sql("api_job_get"), job_id, list(namespaces))
    if row is None:
        return None
    return Job(
        id=JobId(row["id"]), state=JobState(row["state"]), key=row["document_key"], attempt=row["attempt"],
        max_attempts=row["max_attempts"], available_at=row["available_at"], deadline_at=row["deadline_at"],
        created_at=row["created_at"], updated_at=row["updated_at"], finished_at=row["finished_at"],
        last_error_class=row["last_error_class"], namespace=row["namespace"], batch_name=row["batch_name"],
    )  # fmt: skip


async def job_result(conn: asyncpg.Connection, *, job_id: JobId, namespaces: Collection[str]) -> JobResult | None:
    row = await conn.fetchrow(queries.sql("api_job_result"), job_id, list(namespaces))
    if row is None:
        return None
    return JobResult(
        id=JobId(row["id"]), state=JobState(row["state"]), key=row["document_key"], finished_at=row["finished_at"],
        result_deleted=row["result_deleted_at"] is not None, result=row["result"], verdict=row["validation"],
        schema=row["schema"], validation_policy=row["validation_policy"],
    )  # fmt: skip


async def batch(conn: asyncpg.Connection, *, namespace: str, name: str) -> Batch | None:
    """The newest batch of that name in the namespace."""
    row = await conn.fetchrow(queries.sql("api_batch_find"), namespace, name)
    if row is None:
        return None
    return Batch(
        id=BatchId(row["id"]), tenant=TenantName(row["tenant"]), namespace=row["namespace"], name=row["name"],
        uid=row["uid"], idempotency_key=row["idempotency_key"], pool=row["pool"], endpoint=row["endpoint"],
        suspended=row["suspended"], total_jobs=row["total_jobs"], created_at=row["created_at"],
    )  # fmt: skip


async def batch_results(conn: asyncpg.Connection, *, batch_id: BatchId, after: str, limit: int) -> list[ResultLine]:
    """At most `limit` of the batch's jobs with their results, in key order after `after` ('' first)."""
    rows = await conn.fetch(queries.sql("api_batch_results_page"), batch_id, after, limit)
    return [
        ResultLine(JobId(r["id"]), r["document_key"], JobState(r["state"]), r["result_deleted_at"] is not None,
                   r["result"], r["validation"])
        for r in rows
    ]


async def drain_rate(conn: asyncpg.Connection, *, tenant: TenantName, window_s: float) -> DrainRate:
    """Jobs and document bytes per second that left the tenant's queue over the last `window_s`."""
    row = await conn.fetchrow(queries.sql("api_tenant_drain_rate"), tenant, float(window_s))
    assert row is not None, "an aggregate always returns a row"
    return DrainRate(float(row["jobs_per_s"]), float(row["bytes_per_s"]))


async def job_namespace(conn: asyncpg.Connection, *, job_id: JobId) -> str | None:
    """The namespace of a job's batch, for a caller whose namespaces are reviewed one by one (a
    Kubernetes user): the answer is never shown to the caller, only used to ask about it."""
    value = await conn.fetchval(queries.sql("api_job_namespace"), job_id)
    return None if value is None else str(value)
