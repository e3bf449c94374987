"""
Repository of the HTTP intake's idempotency record (`api_requests`, migration 0020): per
(namespace, Idempotency-Key), the canonical request digest a POST was answered 202 for and that
answer (status, Location, body), replayed to a retry.

A request takes its key with `claim` inside a transaction it keeps open while it is processed and
writes its answer with `answer` before committing (a group of document POSTs: in the first and last
statements of the transaction that accepts their documents, `submissions.claim_group` and
`submissions.append_and_finish`); a concurrent
request with the same key waits in `claim` for that transaction's outcome, at most the
transaction's lock_timeout (then `asyncpg.LockNotAvailableError`: the key is in progress). A
request that is refused, or whose process dies, rolls back or releases its claim and leaves no
row, so the key can be used again. A document POST's record is kept in the transaction that
accepts the document (`lading.intake.GroupSubmitter.submit_post`); a batch POST's in a
transaction of its own, around the batch's acceptance (`lading_api.app`).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Sequence
from typing import Any

import asyncpg

from lading.db import queries


@dataclasses.dataclass(frozen=True)
class Answered:
    request_sha256: str
    status: int
    location: str
    body: dict[str, Any]
    created_at: dt.datetime


async def commit_lazily(conn: asyncpg.Connection) -> None:
    """The current transaction's commit will not wait for the WAL flush (see `api_request_commit_lazily`):
    one flush per answered POST (the acceptance's) instead of two."""
    await conn.execute(queries.sql("api_request_commit_lazily"))


async def claim(conn: asyncpg.Connection, *, namespace: str, key: str, request_sha256: str) -> bool:
    """Take the key for this transaction; False when it was answered before (see `get`)."""
    return await conn.fetchval(queries.sql("api_request_claim"), namespace, key, request_sha256) is not None


async def get(conn: asyncpg.Connection, *, namespace: str, key: str) -> Answered | None:
    row = await conn.fetchrow(queries.sql("api_request_get"), namespace, key)
    if row is None:
        return None
    return Answered(row["request_sha256"], row["status"], row["location"], row["body"], row["created_at"])


async def answer(
        conn: asyncpg.Connection,
        *,
        namespace: str,
        key: str,
        status: int,
        location: str,
        body: dict[str, Any],
) -> None:
    """Record the answer of the key taken by `claim` in this transaction."""
    await conn.execute(queries.sql("api_request_answer"), namespace, key, status, location, body)


# --- The stored answers of a group of document POSTs (`lading.intake`; its claims are `submissions.claim_group`).


async def get_many(conn: asyncpg.Connection, keys: Sequence[tuple[str, str]]) -> dict[tuple[str, str], Answered]:
    rows = await conn.fetch(queries.sql("api_request_get_many"), [k[0] for k in keys], [k[1] for k in keys])
    return {
        (row["namespace"], row["idempotency_key"]): Answered(
            row["request_sha256"], row["status"], row["location"], row["body"], row["created_at"]
        )
        for row in rows
    }
