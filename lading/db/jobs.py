"""
Repository of `extraction_jobs`: one function per named query in `sql/jobs.sql`.

Functions take a connection, never open transactions of their own (the caller decides
the unit of work), and return typed values. Lease and fence guards live in the SQL. The job's
attempts (`sql/attempts.sql`) and stale completions (`sql/stale_completions.sql`) are read here
too, and so are the reports on jobs (`lading jobs`, `lading status`, the operator's failures).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Sequence
from typing import Any

import asyncpg

from lading.db import backlogs, job_documents, queries
from lading.ids import BatchId, Fence, JobId, PoolName, TenantName, WorkerId
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
    may_reuse: bool | None = None
    """Whether the job may take an earlier result or wait for a copy in flight (its batch's
    spec.reuse and its tenant's resultReuse; docs/reuse.md); None when the claim was made without
    `reuse_key_of`."""


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
    """`count` new job ids from the job sequence, in one round trip and one array value."""
    ids: list[JobId] = await conn.fetchval(queries.sql("job_allocate_ids"), count)
    return ids


INSERT_WORK_MEM = "32MB"
"""work_mem of a transaction that inserts a batch's jobs and documents: the rows one statement
inserts are kept for the counters' statement triggers (a 10,000-document batch of 1 KB texts:
about 3 MB of job rows, then 9 MB of document rows); beyond work_mem they are written to a
temporary file and read back."""


async def set_local_insert_settings(conn: asyncpg.Connection, *, counted_by_caller: bool) -> None:
    """Until the current transaction ends, work_mem is INSERT_WORK_MEM (see there), and, when
    `counted_by_caller`, the jobs and documents it inserts are left out of the queue counters'
    insert triggers (migration 0032): the caller must then add them itself, once, with
    `add_queued`, in the same transaction, which ends the exemption. Updates and deletes are
    always counted by the triggers."""
    await conn.execute(
        queries.sql("job_insert_settings_set_local"), INSERT_WORK_MEM, "on" if counted_by_caller else "off"
    )


async def add_queued(conn: asyncpg.Connection, *, tenant: str, jobs: int, document_bytes: int) -> None:
    """Add `jobs` queued jobs and `document_bytes` bytes of their documents to `tenant`'s queue
    counters (`tenant_queued`), for a transaction that inserted them with `counted_by_caller`;
    what the transaction inserts afterwards is counted by the triggers again (an acceptance may
    run inside a caller's larger transaction)."""
    await conn.execute(queries.sql("job_queued_add"), tenant, jobs, document_bytes)


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
        reuse_key_of: tuple[str, str, str] | None = None,
) -> list[ClaimedJob]:
    """Take up to `limit` eligible jobs of `pool` in one statement, shared fairly among its
    tenants (weights, in-flight caps, daily token budgets; docs/fairness.md), SKIP LOCKED. Each
    comes with its document: the text, or where a document given by manifest lives (`source`).
    `reuse_key_of` (model, prompt version, judging settings: `lading.reuse.Producer`) marks each
    claimed job's result-reuse key in the same statement, so that `reuse.resolve` needs to write
    only the marks of jobs that wait (docs/reuse.md); None leaves the marks as they are."""
    model, prompt_version, judging = reuse_key_of if reuse_key_of is not None else (None, None, None)
    rows = await conn.fetch(
        queries.sql("job_claim_batch"), pool, limit, worker_id, lease_ttl_s, model, prompt_version, judging
    )
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
            may_reuse=r["may_reuse"],
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


# Reads for people (`lading jobs`, `lading status`, review and redelivery screens): the `*_report`
# queries, ages by the database clock (`now()`, the caller's transaction), never the document text
# unless asked for by name.
LIST_LIMIT_DEFAULT = 50
"""Jobs per page of `lading jobs list` when not told: one screen."""


LIST_LIMIT_MAX = 1000
"""The largest page: bounds the query and the memory of one call; page with `after` for more."""


ATTEMPTS_LIMIT = 1000
"""Attempts shown for one job. A job has at most max_attempts counted attempts, plus one row per claim
released at shutdown or lost to the reaper; a thousand is far beyond any real job."""


STALE_WINDOW_S = 3600.0
"""The status screen counts stale completions of the last hour: recent enough to mean "now"."""


@dataclasses.dataclass(frozen=True)
class JobFilter:
    """What `list_jobs` keeps; a field left at its default does not filter."""

    tenant: TenantName | None = None
    states: frozenset[JobState] = frozenset()
    """Any of these states; empty means every state."""
    pool: PoolName | None = None
    batch: tuple[str, str] | None = None
    """(namespace, name) of the ExtractionBatch; every batch of that name (a re-created one too)."""


@dataclasses.dataclass(frozen=True)
class JobSummary:
    """One line of `lading jobs list`."""

    id: JobId
    tenant: TenantName
    batch_namespace: str
    batch_name: str
    document_key: str
    state: JobState
    attempt: int
    max_attempts: int
    last_error_class: str | None
    updated_at: dt.datetime
    updated_age_s: float
    """Seconds since the last change, by the database clock."""


@dataclasses.dataclass(frozen=True)
class JobPage:
    jobs: tuple[JobSummary, ...]
    next_after: JobId | None
    """The `after` of the next page; None when this page is the last."""


@dataclasses.dataclass(frozen=True)
class JobDetail:
    """One job as `lading jobs show` prints it (without its document text)."""

    id: JobId
    tenant: TenantName
    batch_id: BatchId
    batch_namespace: str
    batch_name: str
    pool: PoolName
    schema: str
    validation_policy: str
    document_key: str
    state: JobState
    priority: int
    attempt: int
    max_attempts: int
    fence: Fence
    lease_until: dt.datetime | None
    worker_id: WorkerId | None
    available_at: dt.datetime
    deadline_at: dt.datetime
    created_at: dt.datetime
    updated_at: dt.datetime
    finished_at: dt.datetime | None
    last_error_class: str | None
    last_error: str | None
    as_of: dt.datetime
    """The database clock when this was read."""
    document_deleted_at: dt.datetime | None = None
    """When retention (TenantQuota spec.retention.documentsDays) deleted the document; None: kept."""
    result_deleted_at: dt.datetime | None = None
    """When retention (spec.retention.resultsDays) deleted the extracted result; None: kept."""
    reused_from: JobId | None = None
    """The job whose accepted result this one took instead of calling the model (docs/reuse.md)."""


@dataclasses.dataclass(frozen=True)
class Attempt:
    """One row of `job_attempts`: a claim under one fence, open until it has an outcome."""

    fence: Fence
    attempt: int
    worker_id: WorkerId
    started_at: dt.datetime
    finished_at: dt.datetime | None
    outcome: str | None
    error_class: str | None
    error: str | None
    tokens_in: int | None
    tokens_out: int | None
    latency_ms: int | None


async def list_jobs(
        conn: asyncpg.Connection,
        *,
        where: JobFilter | None = None,
        after: JobId | None = None,
        limit: int = LIST_LIMIT_DEFAULT,
) -> JobPage:
    """One keyset page of jobs in id order, starting after job `after`.

    Pages never overlap and never skip a job that existed when the first page was read, however
    the jobs change state in between: the order is by id, which never changes. (A state filter
    judges each job by its state when its own page is read.)
    """
    if not 1 <= limit <= LIST_LIMIT_MAX:
        raise ValueError(f"limit must be between 1 and {LIST_LIMIT_MAX}, not {limit}")
    where = where or JobFilter()
    filters = (where.tenant, sorted(s.value for s in where.states) or None, where.pool)
    if where.batch is None:
        rows = await conn.fetch(queries.sql("job_list_report"), after or 0, limit + 1, *filters)
    else:
        namespace, name = where.batch
        rows = await conn.fetch(
            queries.sql("job_list_report_in_batch"), after or 0, limit + 1, *filters, namespace, name
        )
    page = tuple(
        JobSummary(
            id=JobId(r["id"]),
            tenant=TenantName(r["tenant"]),
            batch_namespace=r["batch_namespace"],
            batch_name=r["batch_name"],
            document_key=r["document_key"],
            state=JobState(r["state"]),
            attempt=r["attempt"],
            max_attempts=r["max_attempts"],
            last_error_class=r["last_error_class"],
            updated_at=r["updated_at"],
            updated_age_s=max(r["updated_age_s"], 0.0),
        )
        for r in rows[:limit]
    )
    return JobPage(jobs=page, next_after=page[-1].id if len(rows) > limit else None)


async def get_job(conn: asyncpg.Connection, *, job_id: JobId) -> JobDetail | None:
    r = await conn.fetchrow(queries.sql("job_get_report"), job_id)
    if r is None:
        return None
    return JobDetail(
        id=JobId(r["id"]),
        tenant=TenantName(r["tenant"]),
        batch_id=BatchId(r["batch_id"]),
        batch_namespace=r["batch_namespace"],
        batch_name=r["batch_name"],
        pool=PoolName(r["pool"]),
        schema=r["schema"],
        validation_policy=r["validation_policy"],
        document_key=r["document_key"],
        state=JobState(r["state"]),
        priority=r["priority"],
        attempt=r["attempt"],
        max_attempts=r["max_attempts"],
        fence=Fence(r["fence"]),
        lease_until=r["lease_until"],
        worker_id=None if r["worker_id"] is None else WorkerId(r["worker_id"]),
        available_at=r["available_at"],
        deadline_at=r["deadline_at"],
        created_at=r["created_at"],
        updated_at=r["updated_at"],
        finished_at=r["finished_at"],
        last_error_class=r["last_error_class"],
        last_error=r["last_error"],
        as_of=r["as_of"],
        document_deleted_at=r["document_deleted_at"],
        result_deleted_at=r["result_deleted_at"],
        reused_from=None if r["reused_from"] is None else JobId(r["reused_from"]),
    )


async def list_attempts(conn: asyncpg.Connection, *, job_id: JobId, limit: int = ATTEMPTS_LIMIT) -> list[Attempt]:
    """The job's attempts in fence order, the open one (if any) last."""
    rows = await conn.fetch(queries.sql("attempt_list_report"), job_id, limit)
    return [
        Attempt(
            fence=Fence(r["fence"]),
            attempt=r["attempt"],
            worker_id=WorkerId(r["worker_id"]),
            started_at=r["started_at"],
            finished_at=r["finished_at"],
            outcome=r["outcome"],
            error_class=r["error_class"],
            error=r["error"],
            tokens_in=r["tokens_in"],
            tokens_out=r["tokens_out"],
            latency_ms=r["latency_ms"],
        )
        for r in rows
    ]


async def review_queue(conn: asyncpg.Connection) -> backlogs.Backlog:
    """Jobs in REVIEW_REQUIRED, and how long the oldest has waited for a reviewer."""
    r = await conn.fetchrow(queries.sql("job_review_queue_report"))
    assert r is not None, "an aggregate returns one row"
    return backlogs.Backlog(size=r["size"], oldest_at=r["oldest_at"], oldest_age_s=backlogs.age(r["oldest_age_s"]))


async def stale_completions(conn: asyncpg.Connection, *, window_s: float = STALE_WINDOW_S) -> int:
    """Completions discarded in the last `window_s` seconds because their attempt had lost the job."""
    n: int = await conn.fetchval(queries.sql("stale_completion_count_report"), float(window_s))
    return n


@dataclasses.dataclass(frozen=True)
class Failure:
    document_key: str
    error_class: str
    error: str
    at: dt.datetime


async def failures_of_batch(conn: asyncpg.Connection | asyncpg.Pool, *, batch_id: BatchId, limit: int
) -> list[Failure]:
    rows = await conn.fetch(queries.sql("job_list_failures_of_batch"), batch_id, limit)
    return [Failure(r["document_key"], r["error_class"], r["error"], r["finished_at"]) for r in rows]
