"""
Repository of `document_submissions` (`sql/document_submissions.sql`): the idempotency record of
each single document (`lading.intake`). Its primary key (namespace, idempotency key) decides a
race between concurrent submissions of one key; the row keeps the request digest a repeat is
compared against and the job it became.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import asyncpg

from lading.db import queries
from lading.ids import BatchId, JobId, PoolName


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


# --- Many at once (`lading.intake.GroupSubmitter`: documents that arrived together, one transaction).


@dataclasses.dataclass(frozen=True)
class Claim:
    namespace: str
    idempotency_key: str
    request_digest: str


async def insert_many(conn: asyncpg.Connection, claims: Sequence[Claim]) -> dict[tuple[str, str], JobId]:
    """Claim every (namespace, idempotency key) of `claims` (sorted here: one lock order), each for a
    new job id; the claimed ones with their job ids. A key taken is left out (then `get_many` says
    by what); one being claimed by another transaction is waited for."""
    ordered = sorted(claims, key=lambda c: (c.namespace, c.idempotency_key))
    rows = await conn.fetch(
        queries.sql("submission_insert_many"),
        [c.namespace for c in ordered], [c.idempotency_key for c in ordered], [c.request_digest for c in ordered],
    )  # fmt: skip
    return {(row["namespace"], row["idempotency_key"]): JobId(row["job_id"]) for row in rows}


async def get_many(conn: asyncpg.Connection, keys: Sequence[tuple[str, str]]) -> dict[tuple[str, str], Stored]:
    """The submissions holding the (namespace, idempotency key) pairs `keys`, by pair."""
    rows = await conn.fetch(queries.sql("submission_get_many"), [k[0] for k in keys], [k[1] for k in keys])
    return {
        (row["namespace"], row["idempotency_key"]): Stored(
            request_digest=row["request_digest"], job_id=JobId(row["job_id"]),
            batch_namespace=row["batch_namespace"], batch_name=row["batch_name"],
        )
        for row in rows
    }  # fmt: skip


async def delete_many(conn: asyncpg.Connection, keys: Sequence[tuple[str, str]]) -> None:
    """Release keys the caller's transaction claimed for documents it then refused."""
    if keys:
        await conn.execute(queries.sql("submission_delete_many"), [k[0] for k in keys], [k[1] for k in keys])


async def keys_taken(conn: asyncpg.Connection, *, batch_id: BatchId, document_keys: Sequence[str]) -> set[str]:
    """Which of `document_keys` rolling batch `batch_id` holds already."""
    rows = await conn.fetch(queries.sql("submission_keys_taken"), batch_id, list(document_keys))
    return {row["document_key"] for row in rows}


@dataclasses.dataclass(frozen=True)
class AppendedDocument:
    """One document of `append_jobs`: its job id, key, hashes and content (text, or URI)."""

    job_id: JobId
    document_key: str
    request_hash: str
    content_sha256: str
    text: str | None
    uri: str | None
    document_bytes: int


@dataclasses.dataclass(frozen=True)
class AppendedJobs:
    """What the documents of one `append_jobs` call share (their rolling batch's columns)."""

    tenant: str
    pool: PoolName
    schema: str
    validation_policy: str
    priority: int
    max_attempts: int
    deadline_s: int


async def append_jobs(
        conn: asyncpg.Connection,
        *,
        batch_id: BatchId,
        shared: AppendedJobs,
        documents: Sequence[AppendedDocument],
) -> None:
    """Append READY jobs and their document rows to rolling batch `batch_id`, which the caller
    holds locked (`batches.pick_open_rolling` and the like), counting them in the batch, in one
    statement."""
    await conn.execute(
        queries.sql("submission_jobs_append"), batch_id,
        [d.job_id for d in documents], [d.document_key for d in documents], [d.request_hash for d in documents],
        [d.content_sha256 for d in documents], [d.text for d in documents], [d.uri for d in documents],
        [d.document_bytes for d in documents], shared.tenant, shared.pool, shared.schema, shared.validation_policy,
        shared.priority, shared.max_attempts, float(shared.deadline_s),
    )  # fmt: skip
