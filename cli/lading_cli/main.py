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
import dataclasses
import importlib
import os
import sys
from collections.abc import Callable, Sequence

import asyncpg

from lading import __version__, errors, logs
from lading.db import migrating
from lading.db import pool as dbpool


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
    from lading_webhook_receiver import serving as receiver_serving

    from lading_cli import receiver

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


@dataclasses.dataclass(frozen=True)
class _Command:
    """A subcommand: its name, its line in `lading --help`, and how its arguments are added (which
    imports its module: a command's code is loaded only when it runs, or for a full parser)."""

    name: str
    help: str
    build: Callable[[argparse.ArgumentParser], None]


def _with(module: str, *, handler: str | None = "run") -> Callable[[argparse.ArgumentParser], None]:
    """A builder calling `module.add_arguments` (and setting `module.<handler>` as the handler)."""

    def build(parser: argparse.ArgumentParser) -> None:
        loaded = importlib.import_module(module)
        loaded.add_arguments(parser)
        if handler is not None:
            parser.set_defaults(handler=getattr(loaded, handler))

    return build


def _migrate_arguments(migrate: argparse.ArgumentParser) -> None:
    from lading_cli import receiver

    migrate.add_argument(
        "--database-url",
        help=f"default: $DATABASE_URL (with --receiver: ${receiver.DATABASE_ENV}, else $DATABASE_URL)",
    )
    migrate.add_argument(
        "--receiver", action="store_true",
        help="apply the reference receiver's migrations (its inbox and ledger) instead of Lading's",
    )  # fmt: skip
    migrate.set_defaults(handler=_migrate)


def _jobs_arguments(jobs: argparse.ArgumentParser) -> None:
    from lading_cli import reports

    jobs_commands = jobs.add_subparsers(dest="jobs_command", required=True, metavar="JOBS_COMMAND")
    jobs_list = jobs_commands.add_parser("list", help="list jobs, filtered and paged")
    reports.add_list_arguments(jobs_list)
    jobs_list.set_defaults(handler=reports.list_jobs)
    jobs_show = jobs_commands.add_parser("show", help="one job: its attempts, result and outbox events")
    reports.add_show_arguments(jobs_show)
    jobs_show.set_defaults(handler=reports.show_job)


def _status_arguments(status: argparse.ArgumentParser) -> None:
    from lading_cli import reports

    reports.add_status_arguments(status)
    status.set_defaults(handler=reports.status)


COMMANDS = (
    _Command("run", "apply manifests and run everything on this machine until done", _with("lading_cli.local")),
    _Command("apply", "apply manifests to the database without a cluster, and exit (all or nothing; --dry-run)",
             _with("lading_cli.apply")),
    _Command("migrate", "apply database migrations", _migrate_arguments),
    _Command("worker", "run a worker for one InferencePool", _with("lading_worker.main")),
    _Command("relay", "run the outbox relay and the ingress consumer (RabbitMQ)", _with("lading_cli.relay")),
    _Command("jobs", "list and inspect extraction jobs", _jobs_arguments),
    _Command("status", "one-screen overview: pools, batches, review queue, outbox", _status_arguments),
    _Command("review", "list, show, approve, correct or reject jobs awaiting review",
             _with("lading_cli.review", handler=None)),
    _Command("deliveries", "list, show, redeliver or resolve deliveries", _with("lading_cli.deliveries", handler=None)),
    _Command("crds", "write (or --check) the CRD YAML generated from the models", _with("lading_cli.crds")),
    _Command("receiver", "run the reference ERP webhook receiver", _with("lading_cli.receiver")),
    _Command("operator", "run the Kubernetes operator", _with("lading_cli.operator")),
    _Command("api", "run the HTTP intake (documents and batches over HTTP)", _with("lading_api.main")),
    _Command("tokens", "create, list or revoke bearer tokens of the HTTP intake",
             _with("lading_cli.tokens", handler=None)),
)  # fmt: skip


def build_parser(*, only: str | None = None) -> argparse.ArgumentParser:
    """The whole command line; with `only`, the arguments of that command alone (the others are
    listed, with their help lines, but their modules are not loaded: `lading jobs list` does not
    import the operator's or the intake's code)."""
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
    for command in COMMANDS:
        sub = commands.add_parser(command.name, help=command.help)
        if only is None or command.name == only:
            command.build(sub)
    return parser


def _command_of(argv: Sequence[str]) -> str:
    """The command `argv` names (its first word that is one), or "" when none does."""
    names = {command.name for command in COMMANDS}
    return next((word for word in argv if word in names), "")


def main(argv: Sequence[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(only=_command_of(words)).parse_args(words)
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
