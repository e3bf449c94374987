"""
`lading tokens create|list|revoke`: the bearer tokens of the HTTP intake (`lading api`).

`create` prints the token once, on stdout, alone on its line (for `TOKEN=$(lading tokens create ...)`);
only its SHA-256 is stored, so a lost token cannot be shown again: revoke it and create another.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import sys
from typing import Any

import asyncpg

from lading import access
from lading.db import api_tokens
from lading_cli import common


def add_arguments(parser: argparse.ArgumentParser) -> None:
    commands = parser.add_subparsers(dest="tokens_command", required=True, metavar="TOKENS_COMMAND")
    create = commands.add_parser("create", help="create a token scoped to namespaces; prints it once")
    common.add_common(create)
    create.add_argument(
        "--namespace", action="append", required=True, metavar="NS",
        help="a namespace the token may act in (repeatable); anything in other namespaces answers 404",
    )  # fmt: skip
    create.add_argument("--name", help="the token's name, for list and revoke (default: the first namespace "
                                       "and a random suffix)")
    create.add_argument("--expires-in", metavar="DURATION", help="lifetime, e.g. 30d, 12h (default: never expires)")
    create.set_defaults(handler=create_token)
    listing = commands.add_parser("list", help="list tokens (names, namespaces, expiry; never the tokens)")
    common.add_common(listing)
    listing.set_defaults(handler=list_tokens)
    revoke = commands.add_parser("revoke", help="revoke a token by name, at once")
    common.add_common(revoke)
    revoke.add_argument("name", help="the token's name")
    revoke.set_defaults(handler=revoke_token)


def _dsn(args: argparse.Namespace) -> str:
    if not args.database_url:
        raise SystemExit(f"lading tokens {args.tokens_command}: --database-url or $DATABASE_URL is required")
    return str(args.database_url)


def create_token(args: argparse.Namespace) -> int:
    namespaces = list(dict.fromkeys(args.namespace))
    for namespace in namespaces:
        if not access.valid_namespace(namespace):
            raise SystemExit(f"lading tokens create: --namespace {namespace!r} is not a namespace name "
                             "(lowercase letters, digits and '-', at most 63)")
    name = args.name or f"{namespaces[0]}-{access.mint()[-6:].lower().replace('_', 'x').replace('-', 'x')}"
    if not access.valid_name(name):
        raise SystemExit(f"lading tokens create: --name {name!r} must be lowercase letters, digits, '-' and '.', "
                         "at most 63, starting and ending with a letter or digit")
    lifetime = None
    if args.expires_in is not None:
        try:
            lifetime = access.parse_lifetime(args.expires_in)
        except ValueError as exc:
            raise SystemExit(f"lading tokens create: --expires-in: {exc}") from None
    token = access.mint()

    expires_at = None if lifetime is None else dt.datetime.now(dt.UTC) + lifetime

    async def run(conn: asyncpg.Connection) -> api_tokens.Token | None:
        return await api_tokens.insert(conn, name=name, token_sha256=access.digest(token), namespaces=namespaces,
                                       expires_at=expires_at)

    created = asyncio.run(common.connected(_dsn(args), run))
    if created is None:
        raise SystemExit(f"lading tokens create: a token named {name!r} exists; choose another --name")
    if args.json:
        common.print_json({"token": token, **_described(created)})
    else:
        print(token)
        expiry = common.rfc3339(created.expires_at) or "never"
        print(f"token {created.name} for namespace(s) {', '.join(created.namespaces)}, expires {expiry}; "
              "shown once: store it now", file=sys.stderr)
    return 0


def list_tokens(args: argparse.Namespace) -> int:
    tokens = asyncio.run(common.connected(_dsn(args), api_tokens.list_all))
    if args.json:
        common.print_json({"tokens": [_described(t) for t in tokens]})
        return 0
    for t in tokens:
        state = "active" if t.active else ("revoked" if t.revoked_at is not None else "expired")
        print(f"{t.name}\t{','.join(t.namespaces)}\t{state}\tcreated {common.rfc3339(t.created_at)}\t"
              f"expires {common.rfc3339(t.expires_at) or 'never'}")
    return 0


def revoke_token(args: argparse.Namespace) -> int:
    async def run(conn: asyncpg.Connection) -> dt.datetime | None:
        return await api_tokens.revoke(conn, name=args.name)

    revoked_at = asyncio.run(common.connected(_dsn(args), run))
    if revoked_at is None:
        print(f"lading tokens revoke: no token named {args.name!r}", file=sys.stderr)
        return 1
    print(f"token {args.name} revoked at {common.rfc3339(revoked_at)}")
    return 0


def _described(token: api_tokens.Token) -> dict[str, Any]:
    return {
        "name": token.name, "namespaces": list(token.namespaces), "createdAt": common.rfc3339(token.created_at),
        "expiresAt": common.rfc3339(token.expires_at), "revokedAt": common.rfc3339(token.revoked_at),
        "active": token.active,
    }  # fmt: skip
