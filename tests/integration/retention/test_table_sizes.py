"""`lading status` shows each table's estimated rows and bytes, read from the catalog without a scan."""

from __future__ import annotations

import asyncpg

from lading.db import catalog


async def test_table_sizes_come_from_the_catalog(db: asyncpg.Connection) -> None:
    await db.execute(
        "INSERT INTO stale_completions (job_id, fence, worker_id) SELECT g, 1, 'w' FROM generate_series(1, 500) g"
    )
    await db.execute("ANALYZE stale_completions")
    sizes = {t.name: t for t in await catalog.table_sizes(db)}
    assert sizes["stale_completions"].rows_estimate == 500
    assert sizes["stale_completions"].bytes > 8192
    assert "extraction_jobs" in sizes and all(t.rows_estimate >= 0 for t in sizes.values())
