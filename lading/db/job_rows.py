"""
An inline batch's job rows and document rows, written by acceptance with binary COPY streams
built here (`lading.accepting`; the manifest path inserts set-based, `job_documents`).

Why not `copy_records_to_table`: asyncpg encodes every value of every record, and a batch's job
rows share eight of their thirteen values (tenant, batch, pool, schema, validation policy,
priority, attempt budget, deadline). Encoding a timestamptz alone costs about 1.3 µs in asyncpg
(a datetime subtraction per value), 13 ms of a 10,000-job batch. Here the shared values are
encoded once per batch and each row is the per-job values between precomputed bytes; the
document rows reuse the UTF-8 bytes the caller already hashed instead of encoding each text a
second time. The server sees the same binary COPY as before (format: PostgreSQL's COPY
documentation, "Binary Format"), so what it stores and checks is unchanged.

The streams are sent in chunks of about COPY_CHUNK_BYTES as they are built: the server inserts
one chunk while the next is made. Like every repository here, functions take a connection and
never open transactions: they run inside the acceptance's.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import struct
from collections.abc import AsyncIterator, Callable, Iterable

import asyncpg

from lading.ids import BatchId, JobId

COPY_CHUNK_BYTES = 512 * 1024
"""Bytes of COPY data per message sent (asyncpg's own chunk size for records)."""

_SIGNATURE = b"PGCOPY\n\xff\r\n\x00" + bytes(8)
"""The binary COPY header: the signature, flags 0, no header extension."""
_TRAILER = b"\xff\xff"
"""The end of the rows: a field count of -1."""
_PG_EPOCH = dt.datetime(2000, 1, 1, tzinfo=dt.UTC)
"""A binary timestamptz counts microseconds from here."""

JOB_COLUMNS = (
    "id", "ordinal", "document_key", "request_hash", "content_sha256",
    "tenant", "batch_id", "pool", "schema", "validation_policy", "priority", "max_attempts", "deadline_at",
)  # fmt: skip
"""The columns `copy_jobs` fills: the five that differ per job, then the eight a batch's jobs share."""
_JOB_ROWS_PER_CHUNK = 2_000
"""A chunk of job rows: about 0.5 MB with short keys."""

DOCUMENT_COLUMNS = ("job_id", "text", "bytes")
_DOCUMENT_HEAD = struct.Struct(">hiqi")
"""Field count, the job id (int8) after its length, then the text's length."""
_DOCUMENT_SIZE = struct.Struct(">ii")
"""The size column (int4) after its length."""
_DOCUMENT_SIZE_THEN_HEAD = struct.Struct(">iihiqi")
"""A row's size column followed by the next row's head: one call of pack per row."""


@dataclasses.dataclass(frozen=True)
class SharedJobValues:
    """What every job of one accepted batch has in common."""

    tenant: str
    batch_id: BatchId
    pool: str
    schema: str
    validation_policy: str
    priority: int
    max_attempts: int
    deadline_at: dt.datetime
    """Timezone-aware."""

    def encoded(self) -> bytes:
        """The eight shared fields as they end every row (JOB_COLUMNS[5:])."""
        return b"".join((
            _text(self.tenant), struct.pack(">iq", 8, self.batch_id), _text(self.pool), _text(self.schema),
            _text(self.validation_policy), struct.pack(">ih", 2, self.priority),
            struct.pack(">ii", 4, self.max_attempts),
            struct.pack(">iq", 8, _microseconds_since_pg_epoch(self.deadline_at)),
        ))  # fmt: skip


async def copy_jobs(
        conn: asyncpg.Connection, shared: SharedJobValues, jobs: Iterable[tuple[JobId, int, str, bytes, bytes]]
) -> None:
    """Insert new READY jobs sharing `shared`, each given as (id, ordinal, document key, request
    hash, content SHA-256), the hashes hex SHA-256 in ASCII bytes; `jobs` may be a generator,
    consumed as the COPY sends."""
    await conn.copy_to_table(
        "extraction_jobs", source=_job_stream(shared, jobs), columns=list(JOB_COLUMNS), format="binary"
    )


async def copy_documents(conn: asyncpg.Connection, documents: Iterable[tuple[JobId, bytes]]) -> None:
    """Insert inline documents: (job id, the text's UTF-8 bytes), the size being their length;
    `documents` may be a generator, consumed as the COPY sends. Bytes that are not valid UTF-8
    text (a NUL) are refused by the server with a data error, as a text value would be."""
    await conn.copy_to_table(
        "job_documents", source=_document_stream(documents), columns=list(DOCUMENT_COLUMNS), format="binary"
    )


async def _job_stream(
        shared: SharedJobValues, jobs: Iterable[tuple[JobId, int, str, bytes, bytes]]
) -> AsyncIterator[bytes]:
    """The binary COPY stream of the job rows, _JOB_ROWS_PER_CHUNK rows a chunk. Each row is one call
    of a Struct made for the lengths of its three texts (key, request hash, content SHA-256), which
    every row of a batch with keys of one length shares; each text is written with its own length,
    so any value is framed correctly."""
    tail, fields = shared.encoded(), len(JOB_COLUMNS)
    packers: dict[tuple[int, int, int], Callable[..., bytes]] = {}
    chunk, rows = [_SIGNATURE], 0
    for job_id, ordinal, key, request_hash, content_sha256 in jobs:
        key_bytes = key.encode()
        lengths = (len(key_bytes), len(request_hash), len(content_sha256))
        pack = packers.get(lengths) or packers.setdefault(lengths, _job_row_packer(lengths, len(tail)))
        chunk.append(pack(
            fields, 8, job_id, 4, ordinal, lengths[0], key_bytes, lengths[1], request_hash, lengths[2],
            content_sha256, tail,
        ))  # fmt: skip
        rows += 1
        if rows == _JOB_ROWS_PER_CHUNK:
            yield b"".join(chunk)
            chunk, rows = [], 0
    chunk.append(_TRAILER)
    yield b"".join(chunk)


def _job_row_packer(lengths: tuple[int, int, int], tail: int) -> Callable[..., bytes]:
    """Packs a whole job row: field count, id and ordinal after their lengths, then key, request hash
    and content SHA-256 of `lengths` after theirs, then the `tail` bytes of the shared values."""
    key, request_hash, content_sha256 = lengths
    return struct.Struct(f">hiqiii{key}si{request_hash}si{content_sha256}s{tail}s").pack


async def _document_stream(documents: Iterable[tuple[JobId, bytes]]) -> AsyncIterator[bytes]:
    """The binary COPY stream of the document rows, about COPY_CHUNK_BYTES a chunk. A row's size
    column is packed with the next row's head (the last row's with the chunk's end)."""
    head, size, size_then_head, fields = (
        _DOCUMENT_HEAD.pack, _DOCUMENT_SIZE.pack, _DOCUMENT_SIZE_THEN_HEAD.pack, len(DOCUMENT_COLUMNS)
    )
    chunk, chunk_bytes, previous = [_SIGNATURE], 0, -1
    for job_id, data in documents:
        length = len(data)
        if previous < 0:
            chunk.append(head(fields, 8, job_id, length))
        else:
            chunk.append(size_then_head(4, previous, fields, 8, job_id, length))
        chunk.append(data)
        previous = length
        chunk_bytes += length
        if chunk_bytes >= COPY_CHUNK_BYTES:
            chunk.append(size(4, previous))
            yield b"".join(chunk)
            chunk, chunk_bytes, previous = [], 0, -1
    if previous >= 0:
        chunk.append(size(4, previous))
    chunk.append(_TRAILER)
    yield b"".join(chunk)


def _text(value: str) -> bytes:
    data = value.encode()
    return len(data).to_bytes(4, "big") + data


def _microseconds_since_pg_epoch(moment: dt.datetime) -> int:
    if moment.utcoffset() is None:
        raise ValueError("deadline_at must be timezone-aware")
    delta = moment - _PG_EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
