"""
`lading jobs list`, `lading jobs show ID` and `lading status`: read-only views for people.

The figures come from the repositories of their tables (`lading.db.jobs`, `batches`, `registry`,
`outbox`, `results`, `catalog`; one bounded `*_report` query each), read in one read-only
snapshot so that they agree with each other; this module parses arguments and prints them: rich
tables at a terminal, or `--json` for scripts (times in RFC 3339, UTC; ages in seconds, by the
database clock). Nothing here writes to the database.

A job's document text is never read, let alone printed, unless `--show-document` asks for it: it
may be confidential, and terminals, CI logs and shared screens keep what they are shown. Text that
comes from the database (error messages, keys) is printed as plain text, never as rich markup.

Exit codes: 0 shown; 1 no such job; 2 invalid arguments; 3 database unavailable (`main.py`).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime as dt
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import asyncpg
import rich.console
import rich.json
import rich.table
import rich.text

from lading import ids
from lading.db import backlogs, catalog, job_documents, jobs, outbox, queue, registry, results, spend
from lading.db import batches as db_batches
from lading.db import pool as dbpool
from lading.jobs import states
from lading_cli import common, progress

EXIT_OK, EXIT_NOT_FOUND, EXIT_USAGE = 0, 1, 2

SERVER_SETTINGS = {"application_name": "lading-cli", "jit": "off"}
"""JIT compilation of the status queries costs ten times what it saves (their estimates are high,
their work is small); the name shows these sessions in pg_stat_activity."""

PIPE_WIDTH = 240
"""Width of tables written to a pipe or a file; at a terminal, its own width."""

_STATE_STYLE = {
    states.JobState.RUNNING: "cyan",
    states.JobState.RETRY_SCHEDULED: "yellow",
    states.JobState.REVIEW_REQUIRED: "magenta",
    states.JobState.SUCCEEDED: "green",
    states.JobState.FAILED_TERMINAL: "red",
    states.JobState.CANCELLED: "dim",
}


# Arguments ------------------------------------------------------------------------------------

_BIGINT_MAX = 2**63 - 1


def _state(value: str) -> states.JobState:
    try:
        return states.JobState(value.upper())
    except ValueError:
        expected = ", ".join(s.value for s in states.JobState)
        raise argparse.ArgumentTypeError(f"invalid state {value!r}; expected one of {expected}") from None


def _batch(value: str) -> tuple[str, str]:
    namespace, slash, name = value.partition("/")
    if not slash or not namespace or not name or "/" in name:
        raise argparse.ArgumentTypeError(f"invalid batch {value!r}; expected NAMESPACE/NAME")
    return namespace, name


def add_list_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--batch", type=_batch, metavar="NAMESPACE/NAME", help="jobs of this ExtractionBatch")
    parser.add_argument("--tenant", help="jobs of this tenant")
    parser.add_argument(
        "--state", type=_state, action="append", default=[], metavar="STATE",
        help="jobs in this state (repeat for several): " + ", ".join(s.value for s in states.JobState),
    )  # fmt: skip
    parser.add_argument("--pool", help="jobs of this InferencePool (NAMESPACE/NAME)")
    common.add_paging(parser, default=jobs.LIST_LIMIT_DEFAULT, maximum=jobs.LIST_LIMIT_MAX)
    common.add_common(parser)


def add_show_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job_id", type=common.job_id, metavar="ID", help="the job's id")
    parser.add_argument(
        "--show-document", action="store_true", help="also print the document text (it may be confidential)"
    )
    common.add_common(parser)


def add_status_arguments(parser: argparse.ArgumentParser) -> None:
    common.add_common(parser)


# Commands -------------------------------------------------------------------------------------


def list_jobs(args: argparse.Namespace) -> int:
    if not args.database_url:
        return _no_database("jobs list")
    where = jobs.JobFilter(
        tenant=None if args.tenant is None else ids.TenantName(args.tenant),
        states=frozenset(args.state),
        pool=None if args.pool is None else ids.PoolName(args.pool),
        batch=args.batch,
    )

    async def read(conn: asyncpg.Connection) -> jobs.JobPage:
        return await jobs.list_jobs(conn, where=where, after=args.after, limit=args.limit)

    page = asyncio.run(_read(args.database_url, read))
    if args.json:
        common.print_json({"jobs": [_summary_json(j) for j in page.jobs], "next_after": page.next_after})
    else:
        _print_page(page)
    return EXIT_OK


@dataclasses.dataclass(frozen=True)
class _Shown:
    job: jobs.JobDetail
    attempts: list[jobs.Attempt]
    result: results.JobResult | None
    events: list[outbox.EventSummary]
    document: str | None
    costs: spend.JobCosts | None = None
    """What the job and each attempt cost (absent for an unpriced pool's job)."""


def show_job(args: argparse.Namespace) -> int:
    if not args.database_url:
        return _no_database("jobs show")
    job_id: ids.JobId = args.job_id

    async def read(conn: asyncpg.Connection) -> _Shown | None:
        job = await jobs.get_job(conn, job_id=job_id)
        if job is None:
            return None
        return _Shown(
            job=job,
            attempts=await jobs.list_attempts(conn, job_id=job_id),
            result=await results.result_of(conn, job_id=job_id),
            events=await outbox.events_of(conn, job_id=job_id),
            document=await job_documents.document_of(conn, job_id=job_id) if args.show_document else None,
            costs=await spend.job_costs(conn, job_id=job_id),
        )

    shown = asyncio.run(_read(args.database_url, read))
    if shown is None:
        print(f"lading jobs show: job {job_id} not found", file=sys.stderr)
        return EXIT_NOT_FOUND
    if args.json:
        common.print_json(_shown_json(shown, with_document=args.show_document))
    else:
        _print_shown(shown, with_document=args.show_document)
    return EXIT_OK


@dataclasses.dataclass(frozen=True)
class _Status:
    pools: list[registry.PoolStatus]
    batches: list[db_batches.BatchStatus]
    review: backlogs.Backlog
    outbox: backlogs.Backlog
    stale: int
    tables: list[catalog.TableSize]
    tenants_spend: list[spend.TenantSpend] = dataclasses.field(default_factory=list)
    positions: dict[ids.BatchId, queue.QueuePosition] = dataclasses.field(default_factory=dict)
    """Queue position and ETA of each batch in progress (`lading.db.queue.position`)."""


async def _positions(conn: asyncpg.Connection, batches: Sequence[Any]) -> dict[ids.BatchId, queue.QueuePosition]:
    """Where each batch in progress stands in its pool's queue: one read of the pool's queue per batch."""
    return {b.id: await queue.position(conn, pool=b.pool, tenant=b.tenant, batch_id=b.id) for b in batches}


def status(args: argparse.Namespace) -> int:
    if not args.database_url:
        return _no_database("status")

    async def read(conn: asyncpg.Connection) -> _Status:
        overview = _Status(
            pools=await registry.pool_status(conn),
            batches=await db_batches.batches_in_progress(conn),
            review=await jobs.review_queue(conn),
            outbox=await outbox.outbox_backlog(conn),
            stale=await jobs.stale_completions(conn),
            tables=await catalog.table_sizes(conn),
            tenants_spend=await spend.tenants_spend(conn),
        )
        return dataclasses.replace(overview, positions=await _positions(conn, overview.batches))

    overview = asyncio.run(_read(args.database_url, read))
    if args.json:
        common.print_json(_status_json(overview))
    else:
        _print_status(overview)
    return EXIT_OK


def _no_database(command: str) -> int:
    print(f"lading {command}: --database-url or $DATABASE_URL is required", file=sys.stderr)
    return EXIT_USAGE


_T = TypeVar("_T")


async def _read(dsn: str, read: Callable[[asyncpg.Connection], Awaitable[_T]]) -> _T:
    """Run `read(conn)` in one read-only snapshot: every figure it reads is of the same moment."""
    conn = await asyncpg.connect(dsn, server_settings=SERVER_SETTINGS)
    try:
        await dbpool.init_connection(conn)
        async with conn.transaction(isolation="repeatable_read", readonly=True):
            return await read(conn)
    finally:
        await conn.close()


# JSON -----------------------------------------------------------------------------------------


def _seconds(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _summary_json(job: jobs.JobSummary) -> dict[str, Any]:
    return {
        "id": job.id,
        "tenant": job.tenant,
        "batch": f"{job.batch_namespace}/{job.batch_name}",
        "document_key": job.document_key,
        "state": job.state.value,
        "attempt": job.attempt,
        "max_attempts": job.max_attempts,
        "last_error_class": job.last_error_class,
        "updated_at": common.rfc3339(job.updated_at),
        "updated_age_s": _seconds(job.updated_age_s),
    }


def _shown_json(shown: _Shown, *, with_document: bool) -> dict[str, Any]:
    job = shown.job
    document: dict[str, Any] = {
        "job": {
            "id": job.id,
            "state": job.state.value,
            "tenant": job.tenant,
            "batch": f"{job.batch_namespace}/{job.batch_name}",
            "batch_id": job.batch_id,
            "pool": job.pool,
            "schema": job.schema,
            "validation_policy": job.validation_policy,
            "document_key": job.document_key,
            "priority": job.priority,
            "attempt": job.attempt,
            "max_attempts": job.max_attempts,
            "fence": job.fence,
            "lease_until": common.rfc3339(job.lease_until),
            "worker_id": job.worker_id,
            "available_at": common.rfc3339(job.available_at),
            "deadline_at": common.rfc3339(job.deadline_at),
            "created_at": common.rfc3339(job.created_at),
            "updated_at": common.rfc3339(job.updated_at),
            "finished_at": common.rfc3339(job.finished_at),
            "last_error_class": job.last_error_class,
            "last_error": job.last_error,
            "document_deleted_at": common.rfc3339(job.document_deleted_at),
            "result_deleted_at": common.rfc3339(job.result_deleted_at),
            "reused_from": job.reused_from,
            "cost": _cost_json(None if shown.costs is None else shown.costs.total),
        },
        "attempts": [
            {
                "fence": a.fence,
                "attempt": a.attempt,
                "worker_id": a.worker_id,
                "started_at": common.rfc3339(a.started_at),
                "finished_at": common.rfc3339(a.finished_at),
                "outcome": a.outcome,
                "error_class": a.error_class,
                "error": a.error,
                "tokens_in": a.tokens_in,
                "tokens_out": a.tokens_out,
                "latency_ms": a.latency_ms,
                "cost": _cost_json(None if shown.costs is None else shown.costs.by_fence.get(a.fence)),
            }
            for a in shown.attempts
        ],
        "result": None if shown.result is None else {
            "fence": shown.result.fence,
            "schema": shown.result.schema,
            "validation_policy": shown.result.validation_policy,
            "verdict": {
                "passed": shown.result.passed,
                "failed_checks": [c.to_json() for c in shown.result.failed_checks],
            },
            "extracted": shown.result.result,
            "created_at": common.rfc3339(shown.result.created_at),
        },
        "events": [
            {
                "id": e.id,
                "event_id": str(e.event_id),
                "type": e.type,
                "created_at": common.rfc3339(e.created_at),
                "published_at": common.rfc3339(e.published_at),
            }
            for e in shown.events
        ],
        "as_of": common.rfc3339(job.as_of),
    }  # fmt: skip
    if with_document:
        document["document"] = shown.document
    return document


def _status_json(overview: _Status) -> dict[str, Any]:
    return {
        "pools": [
            {
                "name": p.name,
                "paused": p.paused,
                "backlog": p.backlog,
                "running": p.running,
                "oldest_eligible_at": common.rfc3339(p.oldest_available_at),
                "oldest_eligible_age_s": _seconds(p.oldest_age_s),
            }
            for p in overview.pools
        ],
        "batches_in_progress": [
            {
                "namespace": b.namespace,
                "name": b.name,
                "tenant": b.tenant,
                "pool": b.pool,
                "total": b.total,
                "counts": {state.value: n for state, n in b.counts.items()},
                "reused": b.reused,
                "suspended": b.suspended,
                "started_at": common.rfc3339(b.created_at),
                "queue_position": _position(overview, b.id),
                "eta_s": _eta(overview, b.id),
            }
            for b in overview.batches
        ],
        "review_queue": _backlog_json(overview.review, size="size"),
        "outbox": _backlog_json(overview.outbox, size="unpublished"),
        "stale_completions_last_hour": overview.stale,
        "tables": [{"name": t.name, "rows_estimate": t.rows_estimate, "bytes": t.bytes} for t in overview.tables],
        "spend": [
            {
                "tenant": s.tenant,
                "currency": s.currency,
                "today": spend.amount(s.today),
                "this_month": spend.amount(s.this_month),
                "daily_budget": None if s.daily is None else spend.amount(s.daily),
                "monthly_budget": None if s.monthly is None else spend.amount(s.monthly),
                "claims_stopped": s.claims_stopped,
            }
            for s in overview.tenants_spend
        ],
    }


def _cost_json(cost: spend.Cost | None) -> dict[str, str] | None:
    return None if cost is None else cost.to_json()


def _backlog_json(backlog: backlogs.Backlog, *, size: str) -> dict[str, Any]:
    return {
        size: backlog.size,
        "oldest_at": common.rfc3339(backlog.oldest_at),
        "oldest_age_s": _seconds(backlog.oldest_age_s),
    }


# Tables ---------------------------------------------------------------------------------------


def _state_text(state: states.JobState) -> rich.text.Text:
    return common.text(state.value, _STATE_STYLE.get(state, ""))


def _when(value: dt.datetime | None, as_of: dt.datetime) -> str:
    if value is None:
        return "-"
    delta = (value - as_of).total_seconds()
    relative = f"in {common.age(delta)}" if delta > 0 else f"{common.age(-delta)} ago"
    return f"{common.rfc3339(value.replace(microsecond=0))} ({relative})"


def _table(
        title: str | None,
        columns: Sequence[str],
        *,
        right: Sequence[str] = (),
        whole: Sequence[str] = (),
) -> rich.table.Table:
    """A table whose headers never break; cells fold when too long, except in `whole` columns."""
    # Borderless, like `kubectl get`: more room for the cells on a narrow terminal.
    table = rich.table.Table(title=title, title_justify="left", title_style="bold", box=None, pad_edge=False)
    for column in columns:
        table.add_column(
            column,
            justify="right" if column in right else "left",
            overflow="fold",
            no_wrap=column in whole,
            min_width=max(len(word) for word in column.split()),
        )
    return table


def _print_page(page: jobs.JobPage) -> None:
    console = common.console()
    if not page.jobs:
        console.print("no jobs match")
        return
    table = _table(
        None, ("id", "tenant", "batch", "document", "state", "attempt", "last error", "updated"),
        right=("id", "attempt", "updated"), whole=("id", "state", "attempt", "updated"),
    )  # fmt: skip
    for job in page.jobs:
        table.add_row(
            common.text(job.id),
            common.text(job.tenant),
            common.text(f"{job.batch_namespace}/{job.batch_name}"),
            common.text(job.document_key),
            _state_text(job.state),
            common.text(f"{job.attempt}/{job.max_attempts}"),
            common.text(job.last_error_class),
            common.text(f"{common.age(job.updated_age_s)} ago"),
        )
    console.print(table)
    if page.next_after is not None:
        console.print(common.text(f"more jobs: --after {page.next_after}", "dim"))


def _print_shown(shown: _Shown, *, with_document: bool) -> None:
    console = common.console()
    job = shown.job
    grid = rich.table.Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column(overflow="fold")
    for label, value in (
        ("job", common.text(job.id)),
        ("state", _state_text(job.state)),
        ("tenant", common.text(job.tenant)),
        ("batch", common.text(f"{job.batch_namespace}/{job.batch_name} (id {job.batch_id})")),
        ("pool", common.text(job.pool)),
        ("document key", common.text(job.document_key)),
        ("schema", common.text(f"{job.schema}, validated by {job.validation_policy}")),
        ("attempt", common.text(f"{job.attempt}/{job.max_attempts}")),
        ("fence", common.text(job.fence)),
        ("worker", common.text(job.worker_id)),
        ("lease until", common.text(_when(job.lease_until, job.as_of))),
        ("available at", common.text(_when(job.available_at, job.as_of))),
        ("deadline", common.text(_when(job.deadline_at, job.as_of))),
        ("created", common.text(_when(job.created_at, job.as_of))),
        ("updated", common.text(_when(job.updated_at, job.as_of))),
        ("finished", common.text(_when(job.finished_at, job.as_of))),
        ("last error", common.text(_error(job.last_error_class, job.last_error))),
        ("result taken from", common.text(None if job.reused_from is None else f"job {job.reused_from}")),
        ("cost", common.text(_cost_text(None if shown.costs is None else shown.costs.total))),
    ):
        grid.add_row(label, value)
    console.print(grid)

    console.print()
    if shown.attempts:
        attempts = _table(
            "Attempts",
            ("fence", "attempt", "worker", "started", "took", "outcome", "error", "tokens in/out", "latency", "cost"),
            right=("fence", "attempt", "started", "took", "tokens in/out", "latency", "cost"),
            whole=("fence", "attempt", "started", "took", "latency"),
        )
        for a in shown.attempts:
            attempts.add_row(
                common.text(a.fence),
                common.text(a.attempt),
                common.text(a.worker_id),
                common.text(f"{common.age((job.as_of - a.started_at).total_seconds())} ago"),
                common.text(
                    None if a.finished_at is None else common.age((a.finished_at - a.started_at).total_seconds())
                ),
                common.text(a.outcome if a.finished_at is not None else "(open)"),
                common.text(_error(a.error_class, a.error)),
                common.text(f"{_dash(a.tokens_in)}/{_dash(a.tokens_out)}"),
                common.text(None if a.latency_ms is None else f"{a.latency_ms} ms"),
                common.text(_cost_text(None if shown.costs is None else shown.costs.by_fence.get(a.fence))),
            )
        console.print(attempts)
    else:
        console.print(common.text("no attempts yet", "dim"))

    console.print()
    if shown.result is None:
        console.print(common.text("no result", "dim"))
    else:
        result = shown.result
        verdict = {True: "passed", False: "failed", None: "unknown"}[result.passed]
        console.print(common.text(f"Result (fence {result.fence}): {result.validation_policy} {verdict}", "bold"))
        if result.failed_checks:
            checks = _table(None, ("check", "field", "message"))
            for check in result.failed_checks:
                checks.add_row(common.text(check.check), common.text(check.field), common.text(check.message))
            console.print(checks)
        if result.result is None:
            console.print(common.text(deleted_note("extracted result", job.result_deleted_at, job.as_of), "dim"))
        else:
            console.print(rich.json.JSON.from_data(result.result, highlight=False))

    console.print()
    if shown.events:
        events = _table("Outbox events", ("type", "created", "published"))
        for e in shown.events:
            events.add_row(
                common.text(e.type),
                common.text(_when(e.created_at, job.as_of)),
                common.text(_when(e.published_at, job.as_of)),
            )
        console.print(events)
    else:
        console.print(common.text("no outbox events", "dim"))

    if with_document:
        console.print()
        console.print(common.text("Document", "bold"))
        if shown.document is None and job.document_deleted_at is not None:
            console.print(common.text(deleted_note("document", job.document_deleted_at, job.as_of), "dim"))
        else:
            console.print(common.text(shown.document))


def deleted_note(what: str, at: dt.datetime | None, now: dt.datetime) -> str:
    """How `jobs show` and `review show` say that retention deleted a job's document or result."""
    return f"{what} deleted by retention (TenantQuota spec.retention) {_when(at, now)}"



def _error(error_class: str | None, error: str | None) -> str | None:
    if error_class is None and error is None:
        return None
    return ": ".join(part for part in (error_class, error) if part)


def _cost_text(cost: spend.Cost | None) -> str | None:
    return None if cost is None else f"{spend.amount(cost.amount)} {cost.currency}"


def _position(overview: _Status, batch_id: ids.BatchId) -> int | None:
    where = overview.positions.get(batch_id)
    return None if where is None else where.position


def _eta(overview: _Status, batch_id: ids.BatchId) -> int | None:
    where = overview.positions.get(batch_id)
    return None if where is None else where.eta_s


def _dash(value: int | None) -> str:
    return "-" if value is None else str(value)


def _print_status(overview: _Status) -> None:
    console = common.console()
    pools = _table("Pools", ("pool", "paused", "backlog", "running", "oldest waiting"),
                   right=("backlog", "running", "oldest waiting"), whole=("backlog", "running", "oldest waiting"))

    for p in overview.pools:
        pools.add_row(
            common.text(p.name),
            common.text("yes" if p.paused else "no", "yellow" if p.paused else ""),
            common.text(p.backlog),
            common.text(p.running),
            common.text(common.age(p.oldest_age_s)),
        )
    console.print(pools)

    console.print()
    if overview.batches:
        title = "Batches in progress"
        if len(overview.batches) >= db_batches.BATCHES_LIMIT:
            title += f" (the oldest {db_batches.BATCHES_LIMIT})"
        batches = _table(title, ("batch", "tenant", "settled", "jobs by state", "position", "ETA", "started"),
                         right=("settled", "position", "ETA", "started"),
                         whole=("settled", "position", "ETA", "started"))  # fmt: skip
        for b in overview.batches:
            batches.add_row(
                common.text(f"{b.namespace}/{b.name}" + (" (suspended)" if b.suspended else "")),
                common.text(b.tenant),
                common.text(f"{b.settled}/{b.total}"),
                common.text(progress.describe_counts(dict(b.counts)) + (f", {b.reused} reused" if b.reused else "")),
                common.text(_dash(_position(overview, b.id))),
                common.text(common.age(_eta(overview, b.id))),
                common.text(f"{common.age(b.age_s)} ago"),
            )
        console.print(batches)
    else:
        console.print(common.text("no batches in progress", "dim"))

    console.print()
    console.print(common.text(f"review queue:      {overview.review.size} waiting" + _oldest(overview.review)))
    console.print(common.text(f"outbox:            {overview.outbox.size} unpublished" + _oldest(overview.outbox)))
    console.print(common.text(f"stale completions: {overview.stale} in the last hour", "red" if overview.stale else ""))
    if overview.tenants_spend:
        console.print()
        spent = _table("Spend (UTC)", ("tenant", "currency", "today", "this month", "budget", "claims"),
                       right=("today", "this month", "budget"))  # fmt: skip
        for s in overview.tenants_spend:
            limits = ((s.daily, "a day"), (s.monthly, "a month"))
            budget = " / ".join(f"{spend.amount(v)} {label}" for v, label in limits if v is not None)
            stopped = s.claims_stopped
            spent.add_row(
                common.text(s.tenant), common.text(s.currency), common.text(spend.amount(s.today)),
                common.text(spend.amount(s.this_month)), common.text(budget or None),
                common.text("stopped: budget spent" if stopped else "running", "red" if stopped else ""),
            )  # fmt: skip
        console.print(spent)
    console.print(common.text("tables (rows estimated): " + ", ".join(
        f"{t.name} {t.rows_estimate} rows {t.bytes // 1024} KiB" for t in overview.tables[:8]
    )))


def _oldest(backlog: backlogs.Backlog) -> str:
    return "" if backlog.oldest_age_s is None else f", oldest {common.age(backlog.oldest_age_s)}"
