"""
Repository of `extraction_jobs`: one function per named query in `sql/jobs.sql`.

Functions take a connection, never open transactions of their own (the caller decides
the unit of work), and return typed values. Lease and fence guards live in the SQL.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Sequence
from typing import Any

import asyncpg

from lading.db import job_documents, queries
from lading.ids import BatchId, Fence, JobId, PoolName, WorkerId
from lading.jobs import transitions
from lading.jobs.states import JobState


@dataclasses.dataclass(frozen=True)
class ClaimedJob:
    """A job this worker owns under `fence` until `lease_until` (database clock)."""

    id: JobId
    tenant: str
    batch_id: BatchId
    document_key: str
    attempt: int
    max_attempts: int
    fence: Fence
    lease_until: dt.datetime
    deadline_at: dt.datetime
    schema: str
    validation_policy: str
    pool: PoolName
    text: str | None
    """The document's text; None for a document given by manifest until the worker fetched it
    from `source` (lading.documents.fetching)."""
    claimed_at: dt.datetime
    """Database time of the claim: the executor's notion of "now" derives from it."""
    previous_error_class: str | None = None
    """How the previous attempt ended, if it failed."""
    previous_output_sha256: str | None = None
    """Digest of the previous attempt's invalid output, to recognise a deterministic failure."""
    source: job_documents.DocumentSource | None = None
    """Where a document given by manifest lives (URI, SHA-256, size, the batch's namespace); read by
    the same claim statement."""


@dataclasses.dataclass(frozen=True)
class ExpiredLease:
    id: JobId
    fence: Fence
    attempt: int
    max_attempts: int
    deadline_at: dt.datetime
    now: dt.datetime


@dataclasses.dataclass(frozen=True)
class Reap:
    """The reaper's verdict for one expired lease."""

    job_id: JobId
    fence: Fence
    to: JobState
    retry_in_s: float | None
    error_class: str


async def allocate_ids(conn: asyncpg.Connection, *, count: int) -> list[JobId]:
    rows = await conn.fetch(queries.sql("job_allocate_ids"), count)
    return [JobId(r["id"]) for r in rows]


NEW_JOB_COLUMNS = (
    "id", "tenant", "batch_id", "ordinal", "document_key", "request_hash", "content_sha256", "pool", "schema",
    "validation_policy", "priority", "max_attempts", "deadline_at",
)  # fmt: skip
"""The columns of a new job row, in the order `copy_new` takes them."""


async def copy_new(conn: asyncpg.Connection, records: Sequence[tuple[Any, ...]]) -> None:
    """Insert new READY jobs with COPY (a 10,000-job batch in a few round trips); each record holds
    `NEW_JOB_COLUMNS` in order. Only acceptance writes new jobs, in its transaction."""
    await conn.copy_records_to_table("extraction_jobs", records=records, columns=NEW_JOB_COLUMNS)


@dataclasses.dataclass(frozen=True)
class SubmittedJob:
    """A single document's job as `insert_submitted` writes it, with its document row."""

    id: JobId
    tenant: str
    batch_id: BatchId
    document_key: str
    request_hash: str
    content_sha256: str
    pool: PoolName
    schema: str
    validation_policy: str
    priority: int
    max_attempts: int
    deadline_s: int
    text: str | None
    """The document's text, or None when it is given by `uri`."""
    uri: str | None
    document_bytes: int


async def insert_submitted(conn: asyncpg.Connection, job: SubmittedJob) -> None:
    """Append one READY job and its document to a rolling batch the caller holds locked
    (`batches.lock_open_rolling`), counting it in the batch, in one round trip."""
    await conn.execute(
        queries.sql("job_insert_submitted"),
        job.id, job.tenant, job.batch_id, job.document_key, job.request_hash, job.content_sha256, job.pool,
        job.schema, job.validation_policy, job.priority, job.max_attempts, float(job.deadline_s), job.text,
        job.uri, None if job.uri is None else job.content_sha256, job.document_bytes,
    )  # fmt: skip


async def ids_of_batch(conn: asyncpg.Connection, *, batch_id: BatchId) -> tuple[JobId, ...]:
    """All of a batch's job ids, in batch order, fetched as one array (about 40 bytes per job)."""
    ids: list[int] = await conn.fetchval(queries.sql("job_ids_of_batch"), batch_id)
    return tuple(JobId(i) for i in ids)


async def hold_batch(conn: asyncpg.Connection, *, batch_id: BatchId) -> None:
    """Mark all of a batch's jobs suspended (a batch accepted suspended): none enters the claim index."""
    await conn.execute(queries.sql("job_hold_batch"), batch_id)


async def notify_available(conn: asyncpg.Connection, *, pool: PoolName) -> None:
    """Wake the idle claimers of `pool` when the caller's transaction commits."""
    await conn.execute(queries.sql("job_notify_available"), pool)


CLAIM_AGING_S = 300.0
"""Priority aging step: a job ranks as if it were one class higher per this many seconds of
waiting (a `low` job due for 10 minutes ranks with a `high` one due now). It is built into the
claim index (`lading_claim_rank`, migration 0010); this constant states it for Python."""


async def claim_batch(
        conn: asyncpg.Connection,
        *,
        pool: PoolName,
        worker_id: WorkerId,
        limit: int,
        lease_ttl_s: float,
) -> list[ClaimedJob]:
    """Take up to `limit` eligible jobs of `pool` in one statement, shared fairly among its
    tenants (weights, in-flight caps, daily token budgets; docs/fairness.md), SKIP LOCKED. Each
    comes with its document: the text, or where a document given by manifest lives (`source`)."""
    rows = await conn.fetch(queries.sql("job_claim_batch"), pool, limit, worker_id, lease_ttl_s)
    return [
        ClaimedJob(
            id=JobId(r["id"]),
            tenant=r["tenant"],
            batch_id=BatchId(r["batch_id"]),
            document_key=r["document_key"],
            attempt=r["attempt"],
            max_attempts=r["max_attempts"],
            fence=Fence(r["fence"]),
            lease_until=r["lease_until"],
            deadline_at=r["deadline_at"],
            schema=r["schema"],
            validation_policy=r["validation_policy"],
            pool=PoolName(r["pool"]),
            text=r["text"],
            claimed_at=r["claimed_at"],
            previous_error_class=r["previous_error_class"],
            previous_output_sha256=r["previous_output_sha256"],
            source=_source(r),
        )
        for r in rows
    ]


def _source(row: asyncpg.Record) -> job_documents.DocumentSource | None:
    """Where a claimed document given by manifest lives; None for one with its text inline."""
    if row["text"] is not None or row["uri"] is None:
        return None
    return job_documents.DocumentSource(
        uri=row["uri"], sha256=row["sha256"], bytes=row["bytes"], namespace=row["namespace"]
    )


async def finish_many(
        conn: asyncpg.Connection,
        finishes: Sequence[transitions.Finish],
        *,
        worker_id: WorkerId,
) -> set[JobId]:
    """Apply many finishing transitions at once; returns the ids that were applied.

    A Finish whose fence is stale or whose lease expired changes nothing and is recorded
    in `stale_completions`; its id is absent from the result. A value PostgreSQL cannot store
    (`storable.is_data_error`) fails the statement and writes nothing of the group: the caller
    isolates the bad Finish (`storable.isolate`) rather than retrying the group.
    """
    if not finishes:
        return set()
    columns: list[list[Any]] = [[] for _ in range(16)]
    for f in finishes:
        values = (
            f.job_id,
            f.fence,
            f.to.value,
            f.retry_in_s,
            f.outcome,
            f.error_class,
            f.error,
            f.usage.tokens_in,
            f.usage.tokens_out,
            f.usage.latency_ms,
            f.result,
            f.validation,
            f.output_sha256,
            f.give_back_attempt,
            f.usage.cost,
            f.usage.currency,
        )
        for column, value in zip(columns, values, strict=True):
            column.append(value)
    rows = await conn.fetch(queries.sql("job_finish_many"), *columns[:14], worker_id, *columns[14:])
    return {JobId(r["id"]) for r in rows}


async def heartbeat_many(
        conn: asyncpg.Connection,
        leases: Sequence[tuple[JobId, Fence]],
        *,
        worker_id: WorkerId,
        lease_ttl_s: float,
) -> set[JobId]:
    """Extend leases still owned; a job missing from the result has been lost."""
    if not leases:
        return set()
    rows = await conn.fetch(
        queries.sql("job_heartbeat_many"), [j for j, _ in leases], [f for _, f in leases], lease_ttl_s, worker_id
    )
    return {JobId(r["id"]) for r in rows}


async def release_many(
        conn: asyncpg.Connection,
        leases: Sequence[tuple[JobId, Fence]],
        *,
        worker_id: WorkerId,
) -> set[JobId]:
    """Give back claims whose model call never started; they are claimable again at once."""
    if not leases:
        return set()
    rows = await conn.fetch(
        queries.sql("job_release_many"), [j for j, _ in leases], [f for _, f in leases], worker_id
    )
    return {JobId(r["id"]) for r in rows}


async def lock_expired_leases(conn: asyncpg.Connection, *, limit: int) -> list[ExpiredLease]:
    """Inside a transaction: lock running jobs whose lease ran out (SKIP LOCKED)."""
    rows = await conn.fetch(queries.sql("job_lock_expired_leases"), limit)
    return [
        ExpiredLease(
            id=JobId(r["id"]),
            fence=Fence(r["fence"]),
            attempt=r["attempt"],
            max_attempts=r["max_attempts"],
            deadline_at=r["deadline_at"],
            now=r["now"],
        )
        for r in rows
    ]


async def reap_many(conn: asyncpg.Connection, reaps: Sequence[Reap]) -> dict[JobId, JobState]:
    if not reaps:
        return {}
    rows = await conn.fetch(
        queries.sql("job_reap_many"),
        [r.job_id for r in reaps],
        [r.fence for r in reaps],
        [r.to.value for r in reaps],
        [r.retry_in_s for r in reaps],
        [r.error_class for r in reaps],
    )
    return {JobId(r["id"]): JobState(r["to_state"]) for r in rows}


async def expire_waiting(conn: asyncpg.Connection, *, limit: int) -> list[JobId]:
    rows = await conn.fetch(queries.sql("job_expire_waiting"), limit)
    return [JobId(r["id"]) for r in rows]


async def cancel_batch(conn: asyncpg.Connection, *, batch_id: BatchId, reason: str) -> list[JobId]:
    rows = await conn.fetch(queries.sql("job_cancel_batch"), batch_id, reason)
    return [JobId(r["id"]) for r in rows]


async def cancel(conn: asyncpg.Connection, *, job_id: JobId, reason: str) -> bool:
    return await conn.fetchval(queries.sql("job_cancel"), job_id, reason) is not None


async def review_decide(conn: asyncpg.Connection, *, job_id: JobId, approve: bool, note: str) -> bool:
    target = JobState.SUCCEEDED if approve else JobState.FAILED_TERMINAL
    return await conn.fetchval(queries.sql("job_review_decide"), job_id, target.value, note) is not None


async def get(conn: asyncpg.Connection, *, job_id: JobId) -> asyncpg.Record | None:
    row: asyncpg.Record | None = await conn.fetchrow(queries.sql("job_get"), job_id)
    return row


async def attempts_of(conn: asyncpg.Connection, *, job_id: JobId) -> list[asyncpg.Record]:
    rows: list[asyncpg.Record] = await conn.fetch(queries.sql("job_attempts_of"), job_id)
    return rows


async def review_queue_page(
        conn: asyncpg.Connection,
        *,
        after: JobId | None,
        limit: int,
        tenant: str | None,
) -> list[asyncpg.Record]:
    """Up to `limit` jobs waiting for a reviewer with ids after `after` (None: from the start), in id
    order, of `tenant` (None: every tenant): id, tenant, batch_namespace, batch_name, document_key,
    validation_policy, waiting_since, waiting_age_s and failed_checks (the stored verdict's check ids)."""
    rows: list[asyncpg.Record] = await conn.fetch(queries.sql("job_review_queue_list"), after or 0, limit, tenant)
    return rows


@dataclasses.dataclass(frozen=True)
class CorrectionSubject:
    """What judging a reviewer's correction of a job needs."""

    schema: str
    validation_policy: str
    text: str
    """The document's stored text. (A document given by manifest stores none: the row holds NULL,
    passed on as it is.)"""


async def get_for_correction(conn: asyncpg.Connection, *, job_id: JobId) -> CorrectionSubject | None:
    """The job's schema, validation policy and document text; None when the job or its document is missing."""
    row = await conn.fetchrow(queries.sql("job_get_for_correction"), job_id)
    if row is None:
        return None
    return CorrectionSubject(schema=row["schema"], validation_policy=row["validation_policy"], text=row["text"])


async def count_unfinished_by_state(conn: asyncpg.Connection) -> dict[tuple[PoolName, str, JobState], int]:
    """Jobs not yet settled (waiting, running, under review) by (pool, tenant, state). Settled states are
    not counted: they grow without bound, and a count over them would scan history."""
    rows = await conn.fetch(queries.sql("job_count_unfinished_by_state"))
    return {(PoolName(r["pool"]), r["tenant"], JobState(r["state"])): int(r["n"]) for r in rows}


async def oldest_eligible_age_by_pool(conn: asyncpg.Connection) -> dict[PoolName, float]:
    """Per pool with an eligible job: how long the oldest has waited, in seconds (the autoscaling signal)."""
    rows = await conn.fetch(queries.sql("job_oldest_eligible_age_by_pool"))
    return {PoolName(r["pool"]): float(r["age_s"]) for r in rows}


@dataclasses.dataclass(frozen=True)
class ReviewQueueSummary:
    size: int
    oldest_age_s: float
    """0 when the queue is empty."""


async def review_queue_summary(conn: asyncpg.Connection) -> ReviewQueueSummary:
    """How many jobs wait for a reviewer, and how long the oldest has waited."""
    row = await conn.fetchrow(queries.sql("job_review_queue_summary"))
    assert row is not None  # an aggregate without GROUP BY: always one row
    return ReviewQueueSummary(size=int(row["size"]), oldest_age_s=float(row["oldest_age_s"]))
