"""
Repository of `job_documents` given by reference, and of the `manifest_lines` staging table
that bulk acceptance of a manifest batch goes through (`sql/job_documents.sql`,
`sql/manifest_lines.sql`).

A job_documents row holds either the text (inline documents) or a URI with its SHA-256 and
size (manifest documents); migration 0008 makes that a CHECK (inline documents are written by
`job_rows`). Workers learn the URI of a
claimed document from the claim itself (`jobs.claim_batch`); what they do with it is
`lading.documents.fetching`.

Like every repository here, functions take a connection and never open transactions: the
staging functions must run inside the acceptance transaction (the table is ON COMMIT DROP).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import AsyncIterator

import asyncpg

from lading.db import queries
from lading.documents import manifest_lines
from lading.ids import BatchId, JobId

PAIRS_PREFETCH = 2_000
"""Rows per round trip when streaming a staged manifest's (key, sha256) pairs for hashing."""


@dataclasses.dataclass(frozen=True)
class DocumentSource:
    """Where a claimed job's document lives, and what it must be."""

    uri: str
    sha256: str
    bytes: int
    namespace: str
    """The batch's namespace (from its row): file:// URIs are read only beneath its directories."""


async def stage_manifest(conn: asyncpg.Connection, spooled: manifest_lines.Spooled) -> None:
    """COPY a spooled manifest into this transaction's `manifest_lines` (emptied first)."""
    await conn.execute(queries.sql("manifest_lines_create"))
    await conn.execute(queries.sql("manifest_lines_truncate"))
    await conn.copy_to_table(
        "manifest_lines", source=spooled.path, columns=list(spooled.COLUMNS), format="csv"
    )


@dataclasses.dataclass(frozen=True)
class DuplicateKey:
    key: str
    first_line: int
    line: int


async def staged_duplicate_key(conn: asyncpg.Connection) -> DuplicateKey | None:
    row = await conn.fetchrow(queries.sql("manifest_lines_duplicate_key"))
    return None if row is None else DuplicateKey(key=row["key"], first_line=row["first_line"], line=row["line"])


async def staged_pairs(conn: asyncpg.Connection) -> AsyncIterator[tuple[str, str]]:
    """(key, sha256) of the staged manifest in code point order of the key, streamed."""
    async for row in conn.cursor(queries.sql("manifest_lines_pairs"), prefetch=PAIRS_PREFETCH):
        yield row["key"], row["sha256"]


async def staged_pair_chunks(conn: asyncpg.Connection) -> AsyncIterator[list[tuple[str, str]]]:
    """`staged_pairs`, a round trip's worth (PAIRS_PREFETCH) at a time. Inside the transaction."""
    cursor = await conn.cursor(queries.sql("manifest_lines_pairs"))
    while rows := await cursor.fetch(PAIRS_PREFETCH):
        yield [(row[0], row[1]) for row in rows]


async def insert_staged_jobs(
        conn: asyncpg.Connection,
        *,
        tenant: str,
        batch_id: BatchId,
        hash_prefix: bytes,
        hash_suffix: bytes,
        pool: str,
        schema: str,
        validation_policy: str,
        priority: int,
        max_attempts: int,
        deadline_at: dt.datetime,
) -> tuple[JobId, ...]:
    """One job per staged line, in manifest order, with its document row (by reference), counted
    in the tenant's queue counters in one row; returns the new jobs' ids in manifest order."""
    ids: list[int] = await conn.fetchval(
        queries.sql("manifest_lines_insert_jobs"),
        tenant, batch_id, hash_prefix + b'"', b'"' + hash_suffix, pool, schema, validation_policy, priority,
        max_attempts, deadline_at,
    )  # fmt: skip
    return tuple(JobId(i) for i in ids)

async def document_of(conn: asyncpg.Connection, *, job_id: JobId) -> str | None:
    """The job's document text. Only for an explicit request: the text may be confidential."""
    text: str | None = await conn.fetchval(queries.sql("document_get_report"), job_id)
    return text
