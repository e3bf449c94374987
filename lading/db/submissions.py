"""
Repository of `document_submissions` (`sql/document_submissions.sql`): the idempotency record of
each single document (`lading.intake`). Its primary key (namespace, idempotency key) decides a
race between concurrent submissions of one key; the row keeps the request digest a repeat is
compared against and the job it became.
"""

from __future__ import annotations

import dataclasses

import asyncpg

from lading.db import queries
from lading.ids import JobId


@dataclasses.dataclass(frozen=True)
class Stored:
    """The submission already holding a (namespace, idempotency key), with its job's batch."""

    request_digest: str
    job_id: JobId
    batch_namespace: str
    batch_name: str


async def insert(
        conn: asyncpg.Connection,
        *,
        namespace: str,
        idempotency_key: str,
        request_digest: str,
        job_id: JobId,
) -> bool:
    """Claim the key for `job_id`; False when it is taken (then `get` says by what). A concurrent
    insert of the same key waits until the first transaction ends."""
    row = await conn.fetchrow(queries.sql("submission_insert"), namespace, idempotency_key, request_digest, job_id)
    return row is not None


async def get(conn: asyncpg.Connection, *, namespace: str, idempotency_key: str) -> Stored | None:
    row = await conn.fetchrow(queries.sql("submission_get"), namespace, idempotency_key)
    if row is None:
        return None
    return Stored(
        request_digest=row["request_digest"], job_id=JobId(row["job_id"]),
        batch_namespace=row["batch_namespace"], batch_name=row["batch_name"],
    )  # fmt: skip
