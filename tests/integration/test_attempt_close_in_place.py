"""An attempt's close rewrites its row in place (a HOT update, migration 0035): no index of
job_attempts reads a column the close of an unpriced attempt changes."""

from __future__ import annotations

import asyncpg

CLOSE_WRITES = {"finished_at", "outcome", "error_class", "error", "tokens_in", "tokens_out", "latency_ms",
                "output_sha256"}  # fmt: skip
"""What job_finish_many's `closed` changes on the attempt of an unpriced pool (cost and cost_currency
stay NULL)."""


async def test_no_index_of_attempts_reads_what_a_close_writes(db: asyncpg.Connection) -> None:
    rows = await db.fetch(
        """
        SELECT i.indexrelid::regclass::text AS index, a.attname
          FROM pg_index i
          JOIN pg_attribute a ON a.attrelid = i.indrelid
         WHERE i.indrelid = 'job_attempts'::regclass AND a.attnum > 0
           AND (a.attnum = ANY (i.indkey)
                OR pg_get_expr(i.indpred, i.indrelid) ~ ('\\m' || a.attname || '\\M')
                OR pg_get_expr(i.indexprs, i.indrelid) ~ ('\\m' || a.attname || '\\M'))
        """
    )
    read = {(r["index"], r["attname"]) for r in rows}
    assert {name for _, name in read} & CLOSE_WRITES == set(), read
    assert ("job_attempts_cost_pending", "cost") in read  # the pending-price index is still there


async def test_attempt_pages_leave_room_for_the_closed_version(db: asyncpg.Connection) -> None:
    options = await db.fetchval("SELECT reloptions FROM pg_class WHERE oid = 'job_attempts'::regclass")
    assert "fillfactor=50" in options
