"""
`lading deliveries list|show|redeliver|resolve`: deliveries to ERP webhooks, for operators.

    lading deliveries list [--state S] [--endpoint NS/NAME] [--limit N] [--after ID] [--json]
    lading deliveries show ID [--json]
    lading deliveries redeliver ID... --operator NAME --reason TEXT [--json]
    lading deliveries resolve ID --operator NAME --reason TEXT [--json]

The UNKNOWN_EXTERNAL runbook (docs/delivery.md): `list --state UNKNOWN_EXTERNAL`, look each
delivery id up in the ERP (it is the `webhook-id` every attempt carried), then `resolve` what
the ERP has and `redeliver` what it has not. The rules live in `lading.delivery.resolving`;
this module parses arguments and prints. Nothing here shows a secret: there is none in the
database.

Exit codes: 0 done; 1 no such delivery, or not in a state the action applies to (nothing
changed for it); 2 invalid arguments; 3 database unavailable (`main.py`).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

import asyncpg
import rich.table

from lading.db import deliveries
from lading.delivery import resolving
from lading.delivery.states import DeliveryState
from lading.ids import DeliveryId
from lading_cli import common

EXIT_OK, EXIT_NOT_FOUND, EXIT_USAGE = 0, 1, 2
LIMIT_DEFAULT, LIMIT_MAX = 50, 1000
IDS_MAX = 1000
"""Deliveries one `redeliver` names at most; page through `list --json` for more."""


def _delivery_id(value: str) -> DeliveryId:
    try:
        return deliveries.parse_id(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    commands = parser.add_subparsers(dest="deliveries_command", required=True, metavar="DELIVERIES_COMMAND")

    listing = commands.add_parser("list", help="deliveries, oldest first, filtered and paged")
    listing.add_argument("--state", choices=[s.value for s in DeliveryState], help="only this state")
    listing.add_argument("--endpoint", metavar="NS/NAME", help="only this DeliveryEndpoint")
    listing.add_argument("--limit", type=common.limit(LIMIT_MAX), default=LIMIT_DEFAULT,
                         help=f"deliveries per page (default {LIMIT_DEFAULT}, at most {LIMIT_MAX})")  # fmt: skip
    listing.add_argument("--after", type=_delivery_id, metavar="ID", help="start after this delivery")
    common.add_common(listing)
    listing.set_defaults(handler=list_deliveries)

    showing = commands.add_parser("show", help="one delivery with every attempt")
    showing.add_argument("delivery_id", type=_delivery_id, metavar="ID")
    common.add_common(showing)
    showing.set_defaults(handler=show)

    redelivering = commands.add_parser(
        "redeliver", help="FAILED_TERMINAL/UNKNOWN_EXTERNAL: send again, same delivery id, fresh retry budget"
    )
    redelivering.add_argument("delivery_ids", type=_delivery_id, nargs="+", metavar="ID")
    resolving = commands.add_parser("resolve", help="UNKNOWN_EXTERNAL: the ERP has it (reconciled); mark DELIVERED")
    resolving.add_argument("delivery_ids", type=_delivery_id, nargs=1, metavar="ID")
    for sub, handler in ((redelivering, redeliver), (resolving, resolve)):
        sub.add_argument("--operator", required=True, metavar="NAME", help="who decides (recorded)")
        sub.add_argument("--reason", required=True, metavar="TEXT", help="why, e.g. what the ERP showed (recorded)")
        common.add_common(sub)
        sub.set_defaults(handler=handler)


def list_deliveries(args: argparse.Namespace) -> int:
    if not args.database_url:
        return _usage("list", "--database-url or $DATABASE_URL is required")
    state = None if args.state is None else DeliveryState(args.state)

    async def read(conn: asyncpg.Connection) -> list[deliveries.Delivery]:
        return await deliveries.list_page(conn, after=args.after, limit=args.limit + 1, state=state,
                                          endpoint=args.endpoint)  # fmt: skip

    rows = asyncio.run(common.connected(args.database_url, read))
    page, more = rows[: args.limit], len(rows) > args.limit
    next_after = str(page[-1].id) if more else None
    if args.json:
        common.print_json({"deliveries": [_json(d) for d in page], "next_after": next_after})
        return EXIT_OK
    table = rich.table.Table(title=f"Deliveries ({len(page)})")
    for column in ("delivery id", "job", "endpoint", "state", "attempts", "last status", "last error", "created"):
        table.add_column(column, overflow="fold")
    for d in page:
        table.add_row(
            common.text(d.id), common.text(d.job_id), common.text(d.endpoint), common.text(d.state.value),
            common.text(d.attempt), common.text(d.last_status), common.text(d.last_error_class),
            common.text(common.rfc3339(d.created_at)),
        )  # fmt: skip
    out = common.console()
    out.print(table)
    if next_after:
        out.print(f"next page: --after {next_after}")
    return EXIT_OK


def show(args: argparse.Namespace) -> int:
    if not args.database_url:
        return _usage("show", "--database-url or $DATABASE_URL is required")

    async def read(conn: asyncpg.Connection) -> tuple[deliveries.Delivery | None, list[deliveries.Attempt]]:
        found = await deliveries.get(conn, delivery_id=args.delivery_id)
        return found, await deliveries.attempts_of(conn, delivery_id=args.delivery_id)

    found, attempts = asyncio.run(common.connected(args.database_url, read))
    if found is None:
        print(f"lading deliveries show: delivery {args.delivery_id} not found", file=sys.stderr)
        return EXIT_NOT_FOUND
    if args.json:
        common.print_json({"delivery": _json(found), "attempts": [_attempt_json(a) for a in attempts]})
        return EXIT_OK
    out = common.console()
    for key, value in _json(found).items():
        out.print(f"{key:>18}: {'-' if value is None else value}")
    table = rich.table.Table(title="Attempts")
    for column in ("#", "fence", "owner", "started", "outcome", "status", "error class", "error", "ms"):
        table.add_column(column, overflow="fold")
    for a in attempts:
        table.add_row(
            common.text(a.attempt), common.text(a.fence), common.text(a.owner),
            common.text(common.rfc3339(a.started_at)), common.text(a.outcome), common.text(a.http_status),
            common.text(a.error_class), common.text(a.error), common.text(a.latency_ms),
        )  # fmt: skip
    out.print(table)
    return EXIT_OK


def redeliver(args: argparse.Namespace) -> int:
    return _act(args, "redeliver", resolving.redeliver)


def resolve(args: argparse.Namespace) -> int:
    return _act(args, "resolve", resolving.resolve)


def _act(args: argparse.Namespace, command: str, action: Any) -> int:
    if not args.database_url:
        return _usage(command, "--database-url or $DATABASE_URL is required")
    if len(args.delivery_ids) > IDS_MAX:
        return _usage(command, f"at most {IDS_MAX} delivery ids at once")
    try:
        resolving.sign_off(operator=args.operator, reason=args.reason)  # refused before connecting
    except resolving.SignOffInvalid as exc:
        return _usage(command, str(exc))

    async def run(conn: asyncpg.Connection) -> tuple[list[str], list[str]]:
        done: list[str] = []
        refused: list[str] = []
        for delivery_id in dict.fromkeys(args.delivery_ids):
            try:
                await action(conn, delivery_id=delivery_id, operator=args.operator, reason=args.reason)
                done.append(str(delivery_id))
            except (resolving.DeliveryNotFound, resolving.NotReconcilable, resolving.ResultDeleted) as exc:
                refused.append(str(exc))
        return done, refused

    done, refused = asyncio.run(common.connected(args.database_url, run))
    for message in refused:
        print(f"lading deliveries {command}: {message}", file=sys.stderr)
    if args.json:
        common.print_json({{"redeliver": "redelivered", "resolve": "resolved"}[command]: done, "refused": refused})
    else:
        verb = "due again" if command == "redeliver" else "marked DELIVERED (reconciled)"
        for delivery_id in done:
            print(f"delivery {delivery_id}: {verb}")
    return EXIT_NOT_FOUND if refused else EXIT_OK


def _usage(command: str, message: str) -> int:
    print(f"lading deliveries {command}: {message}", file=sys.stderr)
    return EXIT_USAGE


def _json(d: deliveries.Delivery) -> dict[str, Any]:
    return {
        "delivery_id": str(d.id), "job_id": d.job_id, "endpoint": d.endpoint, "state": d.state.value,
        "attempt": d.attempt, "budget_attempts": d.budget_attempts, "ambiguous_attempts": d.ambiguous_attempts,
        "fence": d.fence, "owner": d.owner, "lease_until": common.rfc3339(d.lease_until),
        "next_attempt_at": common.rfc3339(d.next_attempt_at), "first_attempt_at": common.rfc3339(d.first_attempt_at),
        "last_status": d.last_status, "last_error_class": d.last_error_class, "last_error": d.last_error,
        "created_at": common.rfc3339(d.created_at), "delivered_at": common.rfc3339(d.delivered_at),
        "resolved_by": d.resolved_by, "resolved_reason": d.resolved_reason,
    }  # fmt: skip


def _attempt_json(a: deliveries.Attempt) -> dict[str, Any]:
    return {
        "attempt": a.attempt, "fence": a.fence, "owner": a.owner, "started_at": common.rfc3339(a.started_at),
        "finished_at": common.rfc3339(a.finished_at), "outcome": a.outcome, "http_status": a.http_status,
        "error_class": a.error_class, "error": a.error, "latency_ms": a.latency_ms,
    }  # fmt: skip
