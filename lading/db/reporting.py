"""
Read-only reporting for people: what `lading jobs list`, `lading jobs show` and `lading status` print.

One function per named `*_report` query, each in its table's file under `sql/` (`list_jobs` has two:
filtering by batch takes the batch's index), each returning frozen dataclasses. Nothing here changes a row or decides
anything; the state machine lives in `lading.jobs`, the presentation (tables, JSON, ages as text)
in `lading_cli.reports`.

Every figure is read through the database clock (`now()`, the start of the caller's transaction), so
a caller that wants one consistent picture runs the queries in one read-only transaction:

    async with conn.transaction(isolation="repeatable_read", readonly=True):
        pools = await reporting.pool_status(conn)
        review = await reporting.review_queue(conn)

The document text is never read unless asked for by name (`document_of`): it may be confidential,
and a status screen must not leak it into terminals, logs or CI output.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

import asyncpg

from lading import ids
from lading.db import queries
from lading.jobs import states
from lading.validation import verdicts

LIST_LIMIT_DEFAULT = 50
"""Jobs per page of `lading jobs list` when not told: one screen."""

LIST_LIMIT_MAX = 1000
"""The largest page: bounds the query and the memory of one call; page with `after` for more."""

ATTEMPTS_LIMIT = 1000
"""Attempts shown for one job. A job has at most max_attempts counted attempts, plus one row per claim
released at shutdown or lost to the reaper; a thousand is far beyond any real job."""

EVENTS_LIMIT = 100
"""Outbox events shown for one job (a job writes one per settling state change: a handful)."""

POOLS_LIMIT = 200
"""Pools on the status screen."""

BATCHES_LIMIT = 50
"""Batches in progress on the status screen, oldest first."""

STALE_WINDOW_S = 3600.0
"""The status screen counts stale completions of the last hour: recent enough to mean "now"."""


@dataclasses.dataclass(frozen=True)
class JobFilter:
    """What `list_jobs` keeps; a field left at its default does not filter."""

    tenant: ids.TenantName | None = None
    states: frozenset[states.JobState] = frozenset()
    """Any of these states; empty means every state."""
    pool: ids.PoolName | None = None
    batch: tuple[str, str] | None = None
    """(namespace, name) of the ExtractionBatch; every batch of that name (a re-created one too)."""


@dataclasses.dataclass(frozen=True)
class JobSummary:
    """One line of `lading jobs list`."""

    id: ids.JobId
    tenant: ids.TenantName
    batch_namespace: str
    batch_name: str
    document_key: str
    state: states.JobState
    attempt: int
    max_attempts: int
    last_error_class: str | None
    updated_at: dt.datetime
    updated_age_s: float
    """Seconds since the last change, by the database clock."""


@dataclasses.dataclass(frozen=True)
class JobPage:
    jobs: tuple[JobSummary, ...]
    next_after: ids.JobId | None
    """The `after` of the next page; None when this page is the last."""


@dataclasses.dataclass(frozen=True)
class JobDetail:
    """One job as `lading jobs show` prints it (without its document text)."""

    id: ids.JobId
    tenant: ids.TenantName
    batch_id: ids.BatchId
    batch_namespace: str
    batch_name: str
    pool: ids.PoolName
    schema: str
    validation_policy: str
    document_key: str
    state: states.JobState
    priority: int
    attempt: int
    max_attempts: int
    fence: ids.Fence
    lease_until: dt.datetime | None
    worker_id: ids.WorkerId | None
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


@dataclasses.dataclass(frozen=True)
class Attempt:
    """One row of `job_attempts`: a claim under one fence, open until it has an outcome."""

    fence: ids.Fence
    attempt: int
    worker_id: ids.WorkerId
    started_at: dt.datetime
    finished_at: dt.datetime | None
    outcome: str | None
    error_class: str | None
    error: str | None
    tokens_in: int | None
    tokens_out: int | None
    latency_ms: int | None


@dataclasses.dataclass(frozen=True)
class JobResult:
    """The stored extraction of a job and its validation verdict."""

    fence: ids.Fence
    schema: str
    validation_policy: str
    passed: bool | None
    """The verdict; None if the stored verdict does not say."""
    failed_checks: tuple[verdicts.FailedCheck, ...]
    result: dict[str, Any] | None
    """The extracted JSON document, as stored; None once retention deleted it (the verdict stays)."""
    created_at: dt.datetime


@dataclasses.dataclass(frozen=True)
class OutboxEvent:
    id: int
    event_id: uuid.UUID
    type: str
    created_at: dt.datetime
    published_at: dt.datetime | None


@dataclasses.dataclass(frozen=True)
class PoolStatus:
    name: ids.PoolName
    paused: bool
    backlog: int
    """Jobs a claim could take now (`job_eligible`, lading/db/sql/jobs.sql)."""
    running: int
    oldest_available_at: dt.datetime | None
    """When the oldest job of the backlog became claimable; None for an empty backlog."""
    oldest_age_s: float | None
    """Seconds the oldest job of the backlog has been waiting."""


@dataclasses.dataclass(frozen=True)
class BatchStatus:
    """A batch with at least one job not yet settled."""

    id: ids.BatchId
    tenant: ids.TenantName
    namespace: str
    name: str
    pool: ids.PoolName
    total: int
    suspended: bool
    counts: Mapping[states.JobState, int]
    """Jobs per state; every state is present (0 when none)."""
    created_at: dt.datetime
    """When the batch was accepted."""
    age_s: float
    """Seconds since it was accepted."""

    @property
    def settled(self) -> int:
        """Jobs no machine will move again (terminal, or waiting for a reviewer)."""
        return sum(n for state, n in self.counts.items() if state in states.SETTLED)


@dataclasses.dataclass(frozen=True)
class Backlog:
    """A queue that people or the relay drain: its size and how long its oldest item has waited."""

    size: int
    oldest_at: dt.datetime | None
    oldest_age_s: float | None


async def list_jobs(
        conn: asyncpg.Connection,
        *,
        where: JobFilter | None = None,
        after: ids.JobId | None = None,
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
            id=ids.JobId(r["id"]),
            tenant=ids.TenantName(r["tenant"]),
            batch_namespace=r["batch_namespace"],
            batch_name=r["batch_name"],
            document_key=r["document_key"],
            state=states.JobState(r["state"]),
            attempt=r["attempt"],
            max_attempts=r["max_attempts"],
            last_error_class=r["last_error_class"],
            updated_at=r["updated_at"],
            updated_age_s=max(r["updated_age_s"], 0.0),
        )
        for r in rows[:limit]
    )
    return JobPage(jobs=page, next_after=page[-1].id if len(rows) > limit else None)


async def get_job(conn: asyncpg.Connection, *, job_id: ids.JobId) -> JobDetail | None:
    r = await conn.fetchrow(queries.sql("job_get_report"), job_id)
    if r is None:
        return None
    return JobDetail(
        id=ids.JobId(r["id"]),
        tenant=ids.TenantName(r["tenant"]),
        batch_id=ids.BatchId(r["batch_id"]),
        batch_namespace=r["batch_namespace"],
        batch_name=r["batch_name"],
        pool=ids.PoolName(r["pool"]),
        schema=r["schema"],
        validation_policy=r["validation_policy"],
        document_key=r["document_key"],
        state=states.JobState(r["state"]),
        priority=r["priority"],
        attempt=r["attempt"],
        max_attempts=r["max_attempts"],
        fence=ids.Fence(r["fence"]),
        lease_until=r["lease_until"],
        worker_id=None if r["worker_id"] is None else ids.WorkerId(r["worker_id"]),
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
    )


async def attempts_of(conn: asyncpg.Connection, *, job_id: ids.JobId, limit: int = ATTEMPTS_LIMIT) -> list[Attempt]:
    """The job's attempts in fence order, the open one (if any) last."""
    rows = await conn.fetch(queries.sql("attempt_list_report"), job_id, limit)
    return [
        Attempt(
            fence=ids.Fence(r["fence"]),
            attempt=r["attempt"],
            worker_id=ids.WorkerId(r["worker_id"]),
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


async def result_of(conn: asyncpg.Connection, *, job_id: ids.JobId) -> JobResult | None:
    """The job's stored result, which exists once it SUCCEEDED or needs review."""
    r = await conn.fetchrow(queries.sql("result_get_report"), job_id)
    if r is None:
        return None
    validation: Any = r["validation"]
    verdict: dict[str, Any] = validation if isinstance(validation, dict) else {}
    passed = verdict.get("passed")
    return JobResult(
        fence=ids.Fence(r["fence"]),
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


async def document_of(conn: asyncpg.Connection, *, job_id: ids.JobId) -> str | None:
    """The job's document text. Only for an explicit request: the text may be confidential."""
    text: str | None = await conn.fetchval(queries.sql("document_get_report"), job_id)
    return text


async def events_of(conn: asyncpg.Connection, *, job_id: ids.JobId, limit: int = EVENTS_LIMIT) -> list[OutboxEvent]:
    """The outbox events the job's state changes wrote, oldest first."""
    rows = await conn.fetch(queries.sql("outbox_list_report"), job_id, limit)
    return [
        OutboxEvent(
            id=r["id"],
            event_id=r["event_id"],
            type=r["type"],
            created_at=r["created_at"],
            published_at=r["published_at"],
        )
        for r in rows
    ]


async def pool_status(conn: asyncpg.Connection, *, limit: int = POOLS_LIMIT) -> list[PoolStatus]:
    """Backlog, running jobs and the oldest waiting job of each pool, by pool name."""
    rows = await conn.fetch(queries.sql("pool_status_report"), limit)
    return [
        PoolStatus(
            name=ids.PoolName(r["name"]),
            paused=r["paused"],
            backlog=r["backlog"],
            running=r["running"],
            oldest_available_at=r["oldest_available_at"],
            oldest_age_s=_age(r["oldest_age_s"]),
        )
        for r in rows
    ]


async def batches_in_progress(conn: asyncpg.Connection, *, limit: int = BATCHES_LIMIT) -> list[BatchStatus]:
    """Batches with a job still waiting or running, oldest first, with per-state counts."""
    rows = await conn.fetch(queries.sql("batch_list_report"), limit)
    return [
        BatchStatus(
            id=ids.BatchId(r["id"]),
            tenant=ids.TenantName(r["tenant"]),
            namespace=r["namespace"],
            name=r["name"],
            pool=ids.PoolName(r["pool"]),
            total=r["total_jobs"],
            suspended=r["suspended"],
            counts=_counts(zip(r["states"], r["counts"], strict=True)),
            created_at=r["created_at"],
            age_s=max(r["age_s"], 0.0),
        )
        for r in rows
    ]


def _age(seconds: float | None) -> float | None:
    """An age from the database, never negative: a row committed just after our snapshot began is "now"."""
    return None if seconds is None else max(seconds, 0.0)


def _counts(pairs: Iterable[tuple[str, int]]) -> dict[states.JobState, int]:
    counts = {state: 0 for state in states.JobState}
    for state, n in pairs:
        counts[states.JobState(state)] = n
    return counts


async def review_queue(conn: asyncpg.Connection) -> Backlog:
    """Jobs in REVIEW_REQUIRED, and how long the oldest has waited for a reviewer."""
    r = await conn.fetchrow(queries.sql("job_review_queue_report"))
    assert r is not None, "an aggregate returns one row"
    return Backlog(size=r["size"], oldest_at=r["oldest_at"], oldest_age_s=_age(r["oldest_age_s"]))


async def outbox_backlog(conn: asyncpg.Connection) -> Backlog:
    """Outbox events not yet published, and how long the oldest has waited for the relay."""
    r = await conn.fetchrow(queries.sql("outbox_backlog_report"))
    assert r is not None, "a SELECT without FROM returns one row"
    return Backlog(size=r["unpublished"], oldest_at=r["oldest_at"], oldest_age_s=_age(r["oldest_age_s"]))


async def stale_completions(conn: asyncpg.Connection, *, window_s: float = STALE_WINDOW_S) -> int:
    """Completions discarded in the last `window_s` seconds because their attempt had lost the job."""
    n: int = await conn.fetchval(queries.sql("stale_completion_count_report"), float(window_s))
    return n


@dataclasses.dataclass(frozen=True)
class TableSize:
    """One table's size for `lading status`: estimated rows (no scan) and bytes on disk with indexes."""

    name: str
    rows_estimate: int
    bytes: int


async def table_sizes(conn: asyncpg.Connection) -> list[TableSize]:
    """Every table of the schema, largest first (what the cleaner keeps in check)."""
    rows = await conn.fetch(queries.sql("catalog_table_sizes_report"))
    return [TableSize(name=r["name"], rows_estimate=int(r["rows_estimate"]), bytes=int(r["bytes"])) for r in rows]
