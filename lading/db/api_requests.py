"""
Repository of the HTTP intake's idempotency record (`api_requests`, migration 0020): per
(namespace, Idempotency-Key), the canonical request digest a POST was answered 202 for and that
answer (status, Location, body), replayed to a retry.

A request takes its key with `claim` (`claim_many`) inside a transaction it keeps open while it is
processed and writes its answer with `answer` (`answer_many`) before committing; a concurrent
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
import orjson

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


# --- A group of document POSTs in the transaction that accepts their documents (`lading.intake`).


async def claim_many(
        conn: asyncpg.Connection,
        keys: Sequence[tuple[str, str, str]],
        *,
        wait_s: float,
        then_wait_s: float,
) -> set[tuple[str, str]]:
    """`claim` for (namespace, key, request digest) triples at once (sorted here: one lock order);
    the (namespace, key) pairs taken for this transaction. A key answered before is left out (see
    `get_many`); one another transaction holds is waited for up to `wait_s` (then
    `asyncpg.LockNotAvailableError`). Afterwards the transaction's lock timeout is `then_wait_s`:
    both set in the claim's own round trip."""
    ordered = sorted(keys)
    row = await conn.fetchrow(queries.sql("api_request_claim_many"), [k[0] for k in ordered],
                              [k[1] for k in ordered], [k[2] for k in ordered], f"{int(wait_s * 1000)}ms",
                              f"{int(then_wait_s * 1000)}ms")
    assert row is not None, "an aggregate answers one row"
    return set(zip(row["namespaces"], row["keys"], strict=True))


async def get_many(conn: asyncpg.Connection, keys: Sequence[tuple[str, str]]) -> dict[tuple[str, str], Answered]:
    rows = await conn.fetch(queries.sql("api_request_get_many"), [k[0] for k in keys], [k[1] for k in keys])
    return {
        (row["namespace"], row["idempotency_key"]): Answered(
            row["request_sha256"], row["status"], row["location"], row["body"], row["created_at"]
        )
        for row in rows
    }


async def release_many(conn: asyncpg.Connection, keys: Sequence[tuple[str, str]]) -> None:
    """Drop keys this transaction claimed for requests that were refused (no record is kept)."""
    if keys:
        await conn.execute(queries.sql("api_request_release_many"), [k[0] for k in keys], [k[1] for k in keys])


@dataclasses.dataclass(frozen=True)
class Answer:
    namespace: str
    key: str
    status: int
    location: str
    body: dict[str, Any]


async def answer_many(conn: asyncpg.Connection, answers: Sequence[Answer]) -> None:
    """`answer` for keys this transaction claimed, at once."""
    if answers:
        await conn.execute(
            queries.sql("api_request_answer_many"), [a.namespace for a in answers], [a.key for a in answers],
            [a.status for a in answers], [a.location for a in answers],
            [orjson.dumps(a.body).decode() for a in answers],
        )  # fmt: skip
