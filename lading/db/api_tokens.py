"""
Repository of the HTTP intake's bearer tokens (`api_tokens`, migration 0020): only digests are
stored (`lading.access.digest`); the token itself is printed once and never again.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Sequence

import asyncpg

from lading.db import queries


@dataclasses.dataclass(frozen=True)
class Token:
    name: str
    namespaces: tuple[str, ...]
    created_at: dt.datetime
    expires_at: dt.datetime | None
    revoked_at: dt.datetime | None
    active: bool


@dataclasses.dataclass(frozen=True)
class Principal:
    """Who a valid token speaks for: the token's name and the namespaces it may act in."""

    token: str
    namespaces: frozenset[str]


async def insert(
        conn: asyncpg.Connection,
        *,
        name: str,
        token_sha256: str,
        namespaces: Sequence[str],
        expires_at: dt.datetime | None,
) -> Token | None:
    """Store a new token's digest; None when a token of that name exists."""
    row = await conn.fetchrow(queries.sql("api_token_insert"), name, token_sha256, list(namespaces), expires_at)
    if row is None:
        return None
    return Token(row["name"], tuple(row["namespaces"]), row["created_at"], row["expires_at"], row["revoked_at"], True)


async def authenticate(conn: asyncpg.Connection | asyncpg.Pool, *, token_sha256: str) -> Principal | None:
    """The principal of a token that exists, is not revoked and has not expired (database clock)."""
    row = await conn.fetchrow(queries.sql("api_token_authenticate"), token_sha256)
    return None if row is None else Principal(row["name"], frozenset(row["namespaces"]))


async def list_all(conn: asyncpg.Connection) -> list[Token]:
    rows = await conn.fetch(queries.sql("api_token_list"))
    return [
        Token(r["name"], tuple(r["namespaces"]), r["created_at"], r["expires_at"], r["revoked_at"], r["active"])
        for r in rows
    ]


async def revoke(conn: asyncpg.Connection, *, name: str) -> dt.datetime | None:
    """Revoke the token named `name`; when it was revoked, None when there is no such token."""
    row = await conn.fetchrow(queries.sql("api_token_revoke"), name)
    return None if row is None else row["revoked_at"]
