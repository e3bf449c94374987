"""
`lading` subcommands:

    run FILE...   apply manifests and run the whole system on this machine until done
    apply FILE... apply manifests to the database without a cluster (all or nothing; --dry-run), and exit
    migrate       apply database migrations: the one migrator (idempotent, safe to run concurrently);
                  --receiver: the reference receiver's migrations, to the receiver's database
    worker        run one worker process for one InferencePool
    relay         the outbox relay and the ingress consumer for RabbitMQ, apart from the workers
    jobs          list jobs (filters, paging) or show one with every attempt, result and event
    status        one-screen overview: pools, batches in progress, review queue, outbox
    review        the review queue: list, show, and approve, correct or reject a job (who and why recorded)
    deliveries    deliveries to ERP webhooks: list, show, and redeliver or resolve (reconcile) them
    crds          write the CustomResourceDefinitions generated from the models (--check: verify)
    receiver      the reference ERP webhook receiver (verifies, dedups, books invoices)
    operator      run the Kubernetes operator (reconciles batches, pools, quotas, endpoints)
    api           the HTTP intake: documents and batches over HTTP (202, Idempotency-Key, 303 when done)
    tokens        bearer tokens of the HTTP intake: create (printed once), list, revoke
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence

import asyncpg
from lading_api import main as api_main
from lading_webhook_receiver import serving as receiver_serving
from lading_worker import main as worker_main

from lading import __version__, errors, logs
from lading.db import migrating
from lading.db import pool as dbpool
from lading_cli import apply, crds, deliveries, local, receiver, reports, review, tokens
from lading_cli import operator as operator_cli
from lading_cli import relay as relay_cli


def _migrate(args: argparse.Namespace) -> int:
    if args.receiver:
        return _migrate_receiver(args)
    url = args.database_url or os.environ.get("DATABASE_URL")
    if not url:
        print("lading migrate: --database-url or $DATABASE_URL is required", file=sys.stderr)
        return 2

    async def run() -> migrating.MigrateResult:
        conn = await dbpool.connect(url)
        try:
            return await migrating.migrate(conn)
        finally:
            await conn.close()

    _report(asyncio.run(run()), what="schema")
    return 0


def _migrate_receiver(args: argparse.Namespace) -> int:
    """The receiver never migrates its own database: this (or `lading run`, for the database it owns) does."""
    url = args.database_url or os.environ.get(receiver.DATABASE_ENV) or os.environ.get("DATABASE_URL")
    if not url:
        print(f"lading migrate --receiver: --database-url, ${receiver.DATABASE_ENV} or $DATABASE_URL is required",
              file=sys.stderr)  # fmt: skip
        return 2
    _report(asyncio.run(receiver_serving.migrate(url)), what="receiver schema")
    return 0


def _report(result: migrating.MigrateResult, *, what: str) -> None:
    applied = ", ".join(f"{v:04d}" for v in result.applied) or "none"
    print(f"{what} at version {result.current:04d}; applied now: {applied}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lading", description="Durable, asynchronous LLM document extraction.")
    parser.add_argument("--version", action="version", version=f"lading {__version__}")
    parser.add_argument("--log-level", default=os.environ.get("LADING_LOG_LEVEL", "WARNING"))
    parser.add_argument(
        "--log-format",
        choices=["text", "json"],
        default=os.environ.get("LADING_LOG_FORMAT", "text"),
        help="json: one object per line with correlation ids (default: $LADING_LOG_FORMAT, else text)",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = commands.add_parser("run", help="apply manifests and run everything on this machine until done")
    local.add_arguments(run)
    run.set_defaults(handler=local.run)

    apply_parser = commands.add_parser(
        "apply", help="apply manifests to the database without a cluster, and exit (all or nothing; --dry-run)"
    )
    apply.add_arguments(apply_parser)
    apply_parser.set_defaults(handler=apply.run)

    migrate = commands.add_parser("migrate", help="apply database migrations")
    migrate.add_argument(
        "--database-url",
        help=f"default: $DATABASE_URL (with --receiver: ${receiver.DATABASE_ENV}, else $DATABASE_URL)",
    )
    migrate.add_argument(
        "--receiver", action="store_true",
        help="apply the reference receiver's migrations (its inbox and ledger) instead of Lading's",
    )  # fmt: skip
    migrate.set_defaults(handler=_migrate)

    worker = commands.add_parser("worker", help="run a worker for one InferencePool")
    worker_main.add_arguments(worker)
    worker.set_defaults(handler=worker_main.run)

    relay = commands.add_parser("relay", help="run the outbox relay and the ingress consumer (RabbitMQ)")
    relay_cli.add_arguments(relay)
    relay.set_defaults(handler=relay_cli.run)

    jobs = commands.add_parser("jobs", help="list and inspect extraction jobs")
    jobs_commands = jobs.add_subparsers(dest="jobs_command", required=True, metavar="JOBS_COMMAND")
    jobs_list = jobs_commands.add_parser("list", help="list jobs, filtered and paged")
    reports.add_list_arguments(jobs_list)
    jobs_list.set_defaults(handler=reports.list_jobs)
    jobs_show = jobs_commands.add_parser("show", help="one job: its attempts, result and outbox events")
    reports.add_show_arguments(jobs_show)
    jobs_show.set_defaults(handler=reports.show_job)

    status = commands.add_parser("status", help="one-screen overview: pools, batches, review queue, outbox")
    reports.add_status_arguments(status)
    status.set_defaults(handler=reports.status)

    review_parser = commands.add_parser("review", help="list, show, approve, correct or reject jobs awaiting review")
    review.add_arguments(review_parser)

    deliveries_parser = commands.add_parser("deliveries", help="list, show, redeliver or resolve deliveries")
    deliveries.add_arguments(deliveries_parser)

    crds_parser = commands.add_parser("crds", help="write (or --check) the CRD YAML generated from the models")
    crds.add_arguments(crds_parser)
    crds_parser.set_defaults(handler=crds.run)

    receiver_parser = commands.add_parser("receiver", help="run the reference ERP webhook receiver")
    receiver.add_arguments(receiver_parser)
    receiver_parser.set_defaults(handler=receiver.run)

    operator_parser = commands.add_parser("operator", help="run the Kubernetes operator")
    operator_cli.add_arguments(operator_parser)
    operator_parser.set_defaults(handler=operator_cli.run)

    api_parser = commands.add_parser("api", help="run the HTTP intake (documents and batches over HTTP)")
    api_main.add_arguments(api_parser)
    api_parser.set_defaults(handler=api_main.run)

    tokens_parser = commands.add_parser("tokens", help="create, list or revoke bearer tokens of the HTTP intake")
    tokens.add_arguments(tokens_parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logs.configure(level=args.log_level, fmt=args.log_format)
    handler = args.handler
    try:
        return int(handler(args))
    except errors.LadingError as exc:
        print(f"lading {args.command}: {exc}", file=sys.stderr)
        return 2
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        # The URL is not echoed: it may carry a password.
        print(f"lading {args.command}: database unavailable: {exc}", file=sys.stderr)
        return 3
