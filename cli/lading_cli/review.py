"""
`lading review list|show|approve|correct|reject`: the review queue, for people.

    lading review list [--tenant T] [--limit N] [--after ID] [--json]
    lading review show ID [--json]
    lading review approve ID --reviewer NAME --reason TEXT [--json]
    lading review correct ID --file corrected.json --reviewer NAME --reason TEXT [--json]   (--file -: stdin)
    lading review reject ID --reviewer NAME --reason TEXT [--json]

The decisions and their rules (one transaction each, the audit trail, what a correction must
be) live in `lading.reviewing`; this module parses arguments, reads the correction file and
prints: rich tables at a terminal, or `--json` for scripts (times in RFC 3339, UTC). After a
correction it prints the policy's check report, which informs and never blocks: the reviewer
has decided. The document text is never printed (`lading jobs show ID --show-document` does,
on request); text from the database is printed as plain text, never as rich markup.

Exit codes: 0 done; 1 no such job, or it is not awaiting review (nothing changed); 2 invalid
arguments or input (nothing changed); 3 database unavailable (`main.py`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import asyncpg
import rich.console
import rich.json
import rich.table
import rich.text

from lading import ids, reviewing, validation
from lading_cli import common, reports

EXIT_OK, EXIT_NOT_FOUND, EXIT_USAGE = reports.EXIT_OK, reports.EXIT_NOT_FOUND, reports.EXIT_USAGE

SERVER_SETTINGS = {"application_name": "lading-review"}
"""Shows these sessions (and the row locks a decision holds) in pg_stat_activity."""

CORRECTION_MAX_BYTES = 16 * 1024 * 1024
"""Largest correction file read: far above any invoice.v1 document (500 lines, 2,000 evidence quotes)."""

_BIGINT_MAX = 2**63 - 1


# Arguments ------------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the `review` subcommands, each with its handler, on the `review` parser."""
    commands = parser.add_subparsers(dest="review_command", required=True, metavar="REVIEW_COMMAND")

    listing = commands.add_parser("list", help="jobs waiting for a reviewer, oldest id first, paged")
    listing.add_argument("--tenant", help="jobs of this tenant")
    common.add_paging(listing, default=reviewing.QUEUE_LIMIT_DEFAULT, maximum=reviewing.QUEUE_LIMIT_MAX)
    common.add_common(listing)
    listing.set_defaults(handler=list_queue)

    showing = commands.add_parser("show", help="one job: its result, the failed checks and the decisions so far")
    showing.add_argument("job_id", type=common.job_id, metavar="ID", help="the job's id")
    common.add_common(showing)
    showing.set_defaults(handler=show)

    for name, handler, help_text in (
        ("approve", approve, "accept the stored result: the job SUCCEEDED"),
        ("correct", correct, "replace the result with a corrected invoice.v1 document: the job SUCCEEDED"),
        ("reject", reject, "deliver nothing: the job FAILED_TERMINAL"),
    ):
        deciding = commands.add_parser(name, help=help_text)
        deciding.add_argument("job_id", type=common.job_id, metavar="ID", help="the job's id")
        if name == "correct":
            deciding.add_argument(
                "--file", required=True, metavar="PATH", help="the corrected invoice.v1 JSON document; - for stdin"
            )
        deciding.add_argument("--reviewer", required=True, metavar="NAME", help="who decides (recorded)")
        deciding.add_argument("--reason", required=True, metavar="TEXT", help="why (recorded)")
        common.add_common(deciding)
        deciding.set_defaults(handler=handler)


# Commands -------------------------------------------------------------------------------------


def list_queue(args: argparse.Namespace) -> int:
    if not args.database_url:
        return _usage("list", "--database-url or $DATABASE_URL is required")
    tenant = None if args.tenant is None else ids.TenantName(args.tenant)

    async def read(conn: asyncpg.Connection) -> reviewing.QueuePage:
        return await reviewing.list_queue(conn, tenant=tenant, limit=args.limit, after=args.after)

    page = asyncio.run(common.connected(args.database_url, read))
    if args.json:
        common.print_json({"jobs": [_queued_json(j) for j in page.jobs], "next_after": page.next_after})
    else:
        _print_queue(page)
    return EXIT_OK


def show(args: argparse.Namespace) -> int:
    if not args.database_url:
        return _usage("show", "--database-url or $DATABASE_URL is required")
    job_id: ids.JobId = args.job_id

    async def read(conn: asyncpg.Connection) -> reviewing.ReviewCase:
        return await reviewing.show(conn, job_id=job_id)

    try:
        case = asyncio.run(common.connected(args.database_url, read))
    except reviewing.JobNotFound as exc:
        return _refused("show", exc)
    if args.json:
        common.print_json(_case_json(case))
    else:
        _print_case(case)
    return EXIT_OK


def approve(args: argparse.Namespace) -> int:
    async def decide(conn: asyncpg.Connection) -> reviewing.ReviewDecision:
        return await reviewing.approve(conn, job_id=args.job_id, reviewer=args.reviewer, reason=args.reason)

    return _decide(args, "approve", decide)


def reject(args: argparse.Namespace) -> int:
    async def decide(conn: asyncpg.Connection) -> reviewing.ReviewDecision:
        return await reviewing.reject(conn, job_id=args.job_id, reviewer=args.reviewer, reason=args.reason)

    return _decide(args, "reject", decide)


def correct(args: argparse.Namespace) -> int:
    if not args.database_url:
        return _usage("correct", "--database-url or $DATABASE_URL is required")
    try:
        corrected = _read_correction(args.file)
        reviewing.parse_correction(corrected)  # refused before connecting
    except (ValueError, reviewing.ReviewInputInvalid) as exc:
        return _usage("correct", str(exc))

    async def decide(conn: asyncpg.Connection) -> reviewing.ReviewDecision:
        return await reviewing.correct(
            conn, job_id=args.job_id, reviewer=args.reviewer, reason=args.reason, corrected=corrected
        )

    return _decide(args, "correct", decide)


def _decide(
        args: argparse.Namespace,
        command: str,
        decide: Callable[[asyncpg.Connection], Awaitable[reviewing.ReviewDecision]],
) -> int:
    if not args.database_url:
        return _usage(command, "--database-url or $DATABASE_URL is required")
    try:
        reviewing.SignOff.of(reviewer=args.reviewer, reason=args.reason)  # refused before connecting
        decision = asyncio.run(common.connected(args.database_url, decide))
    except reviewing.ReviewInputInvalid as exc:
        return _usage(command, str(exc))
    except (reviewing.JobNotFound, reviewing.NotAwaitingReview) as exc:
        return _refused(command, exc)
    if args.json:
        common.print_json({"decision": _decision_json(decision, with_results=False)})
    else:
        _print_decision(decision)
    return EXIT_OK


def _read_correction(path: str) -> dict[str, Any]:
    """The JSON object in `path` (`-`: stdin); a ValueError names the file and what is wrong."""
    name = "stdin" if path == "-" else path
    try:
        if path == "-":
            data = sys.stdin.buffer.read(CORRECTION_MAX_BYTES + 1)
        else:
            with open(path, "rb") as file:
                data = file.read(CORRECTION_MAX_BYTES + 1)
    except OSError as exc:
        raise ValueError(f"cannot read {name}: {exc.strerror or exc}") from None
    if len(data) > CORRECTION_MAX_BYTES:
        raise ValueError(f"{name} is larger than {CORRECTION_MAX_BYTES} bytes")
    try:
        document = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ValueError(f"{name} is not UTF-8: invalid byte at offset {exc.start}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{name} is not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}") from None
    if not isinstance(document, dict):
        raise ValueError(f"{name} holds a JSON {type(document).__name__}, not an object (an invoice.v1 document)")
    return document


def _usage(command: str, message: str) -> int:
    print(f"lading review {command}: {message}", file=sys.stderr)
    return EXIT_USAGE


def _refused(command: str, exc: Exception) -> int:
    print(f"lading review {command}: {exc}", file=sys.stderr)
    return EXIT_NOT_FOUND


_T = TypeVar("_T")


# JSON -----------------------------------------------------------------------------------------


def _queued_json(job: reviewing.QueuedJob) -> dict[str, Any]:
    return {
        "id": job.id,
        "tenant": job.tenant,
        "batch": f"{job.batch_namespace}/{job.batch_name}",
        "document_key": job.document_key,
        "validation_policy": job.validation_policy,
        "failed_checks": list(job.failed_checks),
        "waiting_since": common.rfc3339(job.waiting_since),
        "waiting_age_s": round(job.waiting_age_s, 3),
    }


def _decision_json(decision: reviewing.ReviewDecision, *, with_results: bool) -> dict[str, Any]:
    verdict = decision.corrected_verdict
    document: dict[str, Any] = {
        "id": decision.id,
        "job_id": decision.job_id,
        "decision": decision.decision.value,
        "state": decision.state.value,
        "reviewer": decision.reviewer,
        "reason": decision.reason,
        "decided_at": common.rfc3339(decision.decided_at),
        "verdict": None if verdict is None else verdict.to_json(),
    }
    if with_results:
        document["previous_result"] = decision.previous_result
        document["previous_validation"] = decision.previous_validation
        document["corrected_result"] = decision.corrected_result
    return document


def _case_json(case: reviewing.ReviewCase) -> dict[str, Any]:
    job, result = case.job, case.result
    return {
        "job": {
            "id": job.id,
            "state": job.state.value,
            "tenant": job.tenant,
            "batch": f"{job.batch_namespace}/{job.batch_name}",
            "document_key": job.document_key,
            "schema": job.schema,
            "validation_policy": job.validation_policy,
            "attempt": job.attempt,
            "updated_at": common.rfc3339(job.updated_at),
            "finished_at": common.rfc3339(job.finished_at),
            "last_error_class": job.last_error_class,
            "last_error": job.last_error,
            "document_deleted_at": common.rfc3339(job.document_deleted_at),
            "result_deleted_at": common.rfc3339(job.result_deleted_at),
        },
        "result": None if result is None else {
            "fence": result.fence,
            "schema": result.schema,
            "validation_policy": result.validation_policy,
            "verdict": {"passed": result.passed, "failed_checks": [c.to_json() for c in result.failed_checks]},
            "extracted": result.result,
            "created_at": common.rfc3339(result.created_at),
        },
        "decisions": [_decision_json(d, with_results=True) for d in case.decisions],
        "as_of": common.rfc3339(job.as_of),
    }  # fmt: skip


# Text -----------------------------------------------------------------------------------------


def _table(title: str | None, columns: tuple[str, ...]) -> rich.table.Table:
    table = rich.table.Table(title=title, title_justify="left", title_style="bold", box=None, pad_edge=False)
    for column in columns:
        table.add_column(column, overflow="fold", min_width=len(column))
    return table


def _checks_summary(checks: tuple[str, ...]) -> str:
    """Failed check ids, each once, in the policy's order, with a count when repeated."""
    counts: dict[str, int] = {}
    for check in checks:
        counts[check] = counts.get(check, 0) + 1
    return ", ".join(check if n == 1 else f"{check} x{n}" for check, n in counts.items()) or "-"


def _print_queue(page: reviewing.QueuePage) -> None:
    console = common.console()
    if not page.jobs:
        console.print("no jobs waiting for review")
        return
    table = _table(None, ("id", "tenant", "batch", "document", "failed checks", "waiting"))
    for job in page.jobs:
        table.add_row(
            common.text(job.id),
            common.text(job.tenant),
            common.text(f"{job.batch_namespace}/{job.batch_name}"),
            common.text(job.document_key),
            common.text(_checks_summary(job.failed_checks)),
            common.text(common.age(job.waiting_age_s)),
        )
    console.print(table)
    if page.next_after is not None:
        console.print(common.text(f"more jobs: --after {page.next_after}", "dim"))


def _print_checks(console: rich.console.Console, failed: tuple[validation.FailedCheck, ...]) -> None:
    """The failed checks; with the quote each judged and its document line when the policy gave
    them (invoice-strict-v2 does), so the reviewer knows where to look without the document."""
    if not failed:
        return
    quoted = any(check.quote is not None or check.line is not None for check in failed)
    table = _table(None, ("check", "field", "quote", "line", "message") if quoted else ("check", "field", "message"))
    for check in failed:
        cells = [common.text(check.check), common.text(check.field)]
        if quoted:
            cells += [common.text(check.quote), common.text(check.line)]
        table.add_row(*cells, common.text(check.message))
    console.print(table)


def _print_case(case: reviewing.ReviewCase) -> None:
    console = common.console()
    job = case.job
    grid = rich.table.Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column(overflow="fold")
    for label, value in (
        ("job", job.id),
        ("state", job.state.value),
        ("tenant", job.tenant),
        ("batch", f"{job.batch_namespace}/{job.batch_name}"),
        ("document key", job.document_key),
        ("schema", f"{job.schema}, validated by {job.validation_policy}"),
        ("updated", common.rfc3339(job.updated_at)),
        ("last error", ": ".join(p for p in (job.last_error_class, job.last_error) if p) or None),
    ):
        grid.add_row(label, common.text(value))
    console.print(grid)

    console.print()
    if case.result is None:
        console.print(common.text("no result", "dim"))
    else:
        result = case.result
        verdict = {True: "passed", False: "failed", None: "unknown"}[result.passed]
        console.print(common.text(f"Result (fence {result.fence}): {result.validation_policy} {verdict}", "bold"))
        _print_checks(console, result.failed_checks)
        if result.result is None:
            console.print(common.text(reports.deleted_note("extracted result", case.job.result_deleted_at,
                                                           case.job.as_of), "dim"))
        else:
            console.print(rich.json.JSON.from_data(result.result, highlight=False))

    console.print()
    if case.decisions:
        table = _table("Decisions", ("decided", "decision", "reviewer", "reason", "correction's verdict"))
        for d in case.decisions:
            verdict_text = None
            if d.corrected_verdict is not None:
                failed = len(d.corrected_verdict.failed)
                verdict_text = "passed" if d.corrected_verdict.passed else f"{failed} failed"
            table.add_row(
                common.text(common.rfc3339(d.decided_at)),
                common.text(d.decision.value),
                common.text(d.reviewer),
                common.text(d.reason),
                common.text(verdict_text),
            )  # fmt: skip
        console.print(table)
    else:
        console.print(common.text("no decisions yet", "dim"))


def _print_decision(decision: reviewing.ReviewDecision) -> None:
    console = common.console()
    summary = f"job {decision.job_id} {decision.decision.value} by {decision.reviewer}: {decision.state}"
    console.print(common.text(summary))
    verdict = decision.corrected_verdict
    if verdict is None:
        return
    if verdict.passed:
        console.print(common.text(f"check report ({verdict.policy}): every check passed", "green"))
        return
    report = f"check report ({verdict.policy}): {len(verdict.failed)} failed; accepted on the reviewer's decision"
    console.print(common.text(report, "yellow"))
    _print_checks(console, verdict.failed)
