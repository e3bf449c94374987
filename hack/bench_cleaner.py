"""
The `cleaner` benchmark: the retention cleaner (worker/lading_worker/cleaning.py) against tables grown large.

Seeds 1,000,000 published outbox events past their retention (and 100,000 still inside it, and
10,000 unpublished), 200,000 rows past retention in each other table the cleaner keeps small
(inbox, delivered deliveries with one attempt each, stale completions, limiter permits and
per-second sums) and 50,000 quarantined redeliveries, then ANALYZE. It reports:

    plans        each delete statement's EXPLAIN: the scan it uses on the table it deletes from
                 (an index scan is required: a sequential scan would read the whole table per batch)
    statements   per delete statement: count, max, p99 and median duration in milliseconds,
                 rows per second over the whole clean-up
    idle         one more statement per table once nothing is past retention (110,000 outbox
                 rows retained): the cut-off is an index condition, so it reads nothing but the
                 dead index entries the deletes left; again after VACUUM (what autovacuum does)
    kept         that what must stay stayed (the recent and unpublished events)

Run: `.venv/bin/python hack/bench.py cleaner`, or alone `.venv/bin/python hack/bench_cleaner.py
[--database-url ADMIN_URL]` (a throwaway database is created and dropped on that server; default
the local one).

Target: every plan an index scan; the slowest statement under STATEMENT_MAX_MS.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import secrets
import statistics
import sys
import time
from typing import Any

import asyncpg

_ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(_ROOT))
sys.path.insert(0, str(_ROOT / "worker"))

from lading_worker import cleaning  # noqa: E402

from lading.db import migrating, queries  # noqa: E402
from lading.db import pool as dbpool  # noqa: E402

LOCAL_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
OUTBOX_OLD = 1_000_000
OUTBOX_RECENT = 100_000
OUTBOX_UNPUBLISHED = 10_000
OTHER_OLD = 200_000
QUARANTINE_OLD = 50_000
BATCH = cleaning.CleanerSettings.batch_size
STATEMENT_MAX_MS = 250.0
"""Bound on one delete statement: far below lock_timeout and any client timeout, so a batch never
holds its rows long enough for the loops that share the table to notice."""

DELETES = {
    "outbox_events": "outbox_delete_published",
    "execution_inbox": "inbox_delete_expired",
    "inbox_quarantine": "inbox_quarantine_delete_expired",
    "deliveries": "delivery_delete_delivered",
    "stale_completions": "stale_completion_delete_expired",
    "limiter_permits": "limiter_permit_delete_expired",
    "limiter_seconds": "limiter_second_delete_expired",
}
SEED = [
    f"""INSERT INTO outbox_events (event_id, aggregate_type, aggregate_id, type, payload, created_at, published_at)
        SELECT gen_random_uuid(), 'job', g, 'extraction.completed.v1', jsonb_build_object('job_id', g),
               now() - interval '30 days' + g * interval '1 ms', now() - interval '30 days' + g * interval '1 ms'
          FROM generate_series(1, {OUTBOX_OLD}) g""",
    f"""INSERT INTO outbox_events (event_id, aggregate_type, aggregate_id, type, payload, published_at)
        SELECT gen_random_uuid(), 'job', g, 'extraction.completed.v1', '{{}}', now() - interval '1 day'
          FROM generate_series(1, {OUTBOX_RECENT}) g""",
    f"""INSERT INTO outbox_events (event_id, aggregate_type, aggregate_id, type, payload)
        SELECT gen_random_uuid(), 'job', g, 'extraction.completed.v1', '{{}}'
          FROM generate_series(1, {OUTBOX_UNPUBLISHED}) g""",
    f"""INSERT INTO execution_inbox (event_id, type, digest, received_at, payload)
        SELECT gen_random_uuid(), 'batch.cancel.v1', 'd', now() - interval '30 days', '{{}}'
          FROM generate_series(1, {OTHER_OLD}) g""",
    f"""INSERT INTO inbox_quarantine (event_id, digest, first_digest, received_at, payload)
        SELECT gen_random_uuid(), 'd2', 'd', now() - interval '90 days', '{{}}'
          FROM generate_series(1, {QUARANTINE_OLD}) g""",
    f"""INSERT INTO deliveries (job_id, endpoint, state, delivered_at, created_at)
        SELECT g, 'bench/erp', 'DELIVERED', now() - interval '60 days', now() - interval '60 days'
          FROM generate_series(1, {OTHER_OLD}) g""",
    """INSERT INTO delivery_attempts (delivery_id, fence, attempt, owner, started_at, finished_at, outcome)
        SELECT delivery_id, 1, 1, 'w', delivered_at, delivered_at, 'delivered' FROM deliveries""",
    f"""INSERT INTO stale_completions (job_id, fence, worker_id, at)
        SELECT g, 1, 'w', now() - interval '60 days' FROM generate_series(1, {OTHER_OLD}) g""",
    f"""INSERT INTO limiter_permits (pool, job_id, fence, acquired_at, tokens_reserved, tokens_used, expires_at,
                                     released_at)
        SELECT 'bench/pool', g, 1, now() - interval '2 days', 100, 90, now() - interval '2 days',
               now() - interval '2 days' FROM generate_series(1, {OTHER_OLD}) g""",
    f"""INSERT INTO limiter_seconds (pool, second, requests, tokens)
        SELECT 'bench/pool', date_trunc('second', now()) - interval '2 days' - g * interval '1 second', 1, 1
          FROM generate_series(1, {OTHER_OLD}) g""",
]


def _scans(plan: dict[str, Any]) -> list[str]:
    """`<node type> on <relation>` for every scan node of a JSON plan."""
    found = []
    if "Relation Name" in plan:
        found.append(f"{plan['Node Type']} on {plan['Relation Name']}")
    for child in plan.get("Plans", []):
        found += _scans(child)
    return found


async def bench(url: str) -> tuple[dict[str, Any], bool]:
    conn = await dbpool.connect(url)
    try:
        seed_started = time.perf_counter()
        for statement in SEED:
            await conn.execute(statement)
        await conn.execute("ANALYZE")
        seed_s = time.perf_counter() - seed_started
        settings = cleaning.CleanerSettings()
        retentions = {t.name: t.retention(settings) for t in cleaning.TABLES}
        plans: dict[str, list[str]] = {}
        for table, name in DELETES.items():
            raw = await conn.fetchval("EXPLAIN (FORMAT JSON) " + queries.sql(name), retentions[table], BATCH)
            plans[table] = [s for s in _scans(json.loads(raw)[0]["Plan"])
                            if s.endswith(" on " + table) and not s.startswith("ModifyTable")]
        durations: dict[str, list[float]] = {t.name: [] for t in cleaning.TABLES}
        deleted: dict[str, int] = {t.name: 0 for t in cleaning.TABLES}
        started = time.perf_counter()
        for table in cleaning.TABLES:
            while True:
                t0 = time.perf_counter()
                n = await table.delete(conn, older_than_s=retentions[table.name], limit=BATCH)
                durations[table.name].append((time.perf_counter() - t0) * 1000)
                deleted[table.name] += n
                if n < BATCH:
                    break
        total_s = time.perf_counter() - started
        idle_ms = {}  # a round with nothing left to delete, while the retained rows stay
        for table in cleaning.TABLES:
            t0 = time.perf_counter()
            assert await table.delete(conn, older_than_s=retentions[table.name], limit=BATCH) == 0
            idle_ms[table.name] = round((time.perf_counter() - t0) * 1000, 2)
        await conn.execute("VACUUM")  # what autovacuum does after a mass delete: the dead index entries go
        vacuumed_ms = {}
        for table in cleaning.TABLES:
            t0 = time.perf_counter()
            assert await table.delete(conn, older_than_s=retentions[table.name], limit=BATCH) == 0
            vacuumed_ms[table.name] = round((time.perf_counter() - t0) * 1000, 2)
        kept_outbox = await conn.fetchval("SELECT count(*) FROM outbox_events")
    finally:
        await conn.close()
    statements = {
        table: {
            "deleted": deleted[table],
            "statements": len(ms),
            "max_ms": round(max(ms), 2),
            "p99_ms": round(sorted(ms)[max(0, int(len(ms) * 0.99) - 1)], 2),
            "median_ms": round(statistics.median(ms), 2),
        }
        for table, ms in durations.items()
    }
    all_ms = [m for ms in durations.values() for m in ms]
    index_only = all(
        scans and not any(s.startswith("Seq Scan") for s in scans) and any("Index" in s for s in scans)
        for scans in plans.values()
    )
    results = {
        "seed_s": round(seed_s, 1),
        "batch_size": BATCH,
        "plans": plans,
        "statements": statements,
        "all_statements": {"count": len(all_ms), "max_ms": round(max(all_ms), 2),
                           "p99_ms": round(sorted(all_ms)[int(len(all_ms) * 0.99) - 1], 2)},
        "idle_statement_ms": idle_ms,
        "idle_statement_after_vacuum_ms": vacuumed_ms,
        "total_s": round(total_s, 1),
        "rows_per_s": round(sum(deleted.values()) / total_s),
        "kept_outbox_events": kept_outbox,
    }
    passed = (
        index_only
        and max(all_ms) < STATEMENT_MAX_MS
        and max(vacuumed_ms.values()) < STATEMENT_MAX_MS / 10
        and deleted["outbox_events"] == OUTBOX_OLD
        and kept_outbox == OUTBOX_RECENT + OUTBOX_UNPUBLISHED
    )
    return results, passed


TARGETS = {"plans": "index or TID scans only, never a sequential scan", "statement_max_ms": STATEMENT_MAX_MS,
           "idle_statement_after_vacuum_max_ms": STATEMENT_MAX_MS / 10}


async def bench_cleaner(url: str) -> tuple[dict[str, Any], dict[str, Any], bool]:
    """The scenario as hack/bench.py runs it, in the database it created and migrated."""
    results, passed = await bench(url)
    return results, TARGETS, passed


async def _main(admin_url: str) -> int:
    name = f"lading_bench_cleaner_{os.getpid()}_{secrets.token_hex(3)}"
    admin = await asyncpg.connect(admin_url)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    url = admin_url.rsplit("/", 1)[0] + "/" + name
    try:
        conn = await dbpool.connect(url)
        try:
            await migrating.migrate(conn)
        finally:
            await conn.close()
        results, passed = await bench(url)
    finally:
        admin = await asyncpg.connect(admin_url)
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await admin.close()
    print(json.dumps({"scenario": "cleaner", "results": results, "targets": TARGETS, "pass": passed}, indent=2))
    return 0 if passed else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database-url", default=os.environ.get("DATABASE_URL") or LOCAL_ADMIN_URL,
                        help="an admin URL (default: the local server)")
    return asyncio.run(_main(parser.parse_args().database_url))


if __name__ == "__main__":
    sys.exit(main())
