"""The binary COPY streams of `lading.db.job_rows` frame every row whatever its lengths: a job row is
packed by a Struct made for its key's and hashes' lengths, and a document row's size is packed with
the next row's head, so rows of many lengths, in any order, across chunks, must each come back whole."""

from __future__ import annotations

import dataclasses

import asyncpg

from lading import accepting
from lading.db import job_rows
from tests.support import factories


async def test_rows_of_every_length_in_any_order_are_stored_as_given(db: asyncpg.Connection) -> None:
    await factories.seed(db)
    lengths = [(i * 37) % 101 for i in range(2_500)]  # keys of 1 to 101 characters, lengths in no order
    documents = [
        accepting.DocumentInput(key=f"k{i}-" + "ü" * (n // 2) + "x" * (n % 2), text="é" * (n * 13) + f" {i}")
        for i, n in enumerate(lengths)
    ]
    assert sum(len(d.text.encode()) for d in documents) > 2 * job_rows.COPY_CHUNK_BYTES
    request = dataclasses.replace(factories.batch_request(), documents=documents)

    result = await accepting.accept_batch(db, request)

    rows = await db.fetch(
        """SELECT j.id, j.document_key, j.ordinal, d.text, d.bytes
             FROM extraction_jobs j JOIN job_documents d ON d.job_id = j.id ORDER BY j.ordinal"""
    )
    assert [r["id"] for r in rows] == list(result.job_ids)
    assert [(r["ordinal"], r["document_key"], r["text"], r["bytes"]) for r in rows] == [
        (i, d.key, d.text, len(d.text.encode())) for i, d in enumerate(documents)
    ]
