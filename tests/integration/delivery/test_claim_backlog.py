"""
A delivery claim reads a bounded number of rows however long the backlog: each claimable
endpoint's first due deliveries, never every due delivery, and never the backlog of an endpoint it
may not claim for (migration 0048). Before, on statistics taken while the table was small, the
claim read and sorted every due delivery to return a few: a backlog of N cost O(N^2) to drain.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from lading.db import deliveries, queries
from tests.integration.delivery import helpers

BLOCKED = "acme/blocked"
OTHER = "acme/other"


@pytest.fixture
async def stale_statistics(db: asyncpg.Connection) -> AsyncIterator[None]:
    """Statistics that say `deliveries` is empty, kept so while the backlog grows."""
    await db.execute("ALTER TABLE deliveries SET (autovacuum_enabled = false)")
    await db.execute("ANALYZE deliveries")
    try:
        yield
    finally:
        await db.execute("ALTER TABLE deliveries RESET (autovacuum_enabled)")


def _rows_read(plan: dict[str, Any], relation: str) -> int:
    """Rows the scans of `relation` returned in an EXPLAIN ANALYZE plan, over all their loops."""
    own = 0
    if plan.get("Relation Name") == relation and "Scan" in plan["Node Type"]:
        own = int(plan["Actual Rows"]) * int(plan["Actual Loops"])
    return own + sum(_rows_read(child, relation) for child in plan.get("Plans", []))


async def _claim_rows_read(db: asyncpg.Connection, *, endpoints: list[str], limit: int) -> tuple[int, int]:
    """(deliveries rows the claim's scans read, deliveries it claimed); the claim is rolled back."""
    tx = db.transaction()
    await tx.start()
    try:
        raw = await db.fetchval(
            "EXPLAIN (ANALYZE, FORMAT JSON) " + queries.sql("delivery_claim"), endpoints, limit, "w", 60.0, False
        )
        claimed = await db.fetchval("SELECT count(*) FROM deliveries WHERE state = 'IN_FLIGHT'")
    finally:
        await tx.rollback()
    (top,) = json.loads(raw)
    return _rows_read(top["Plan"], "deliveries"), int(claimed)


async def test_a_claim_reads_a_bounded_number_of_rows_of_a_long_backlog(
        db: asyncpg.Connection, stale_statistics: None,
) -> None:
    await helpers.register(db, "http://127.0.0.1:9/erp")
    await helpers.register(db, "http://127.0.0.1:9/blocked", name=BLOCKED)
    await helpers.succeed(db, count=1500, name="blocked", endpoint=BLOCKED)  # older, and not claimable here
    await helpers.succeed(db, count=1500, name="due")
    read, claimed = await _claim_rows_read(db, endpoints=[helpers.ENDPOINT], limit=8)
    assert claimed == 8
    assert read <= 10 * 8, f"the claim read {read} delivery rows of a backlog of 3,000 to claim 8"


async def test_the_oldest_due_deliveries_of_all_claimable_endpoints_are_claimed_first(db: asyncpg.Connection) -> None:
    await helpers.register(db, "http://127.0.0.1:9/erp")
    await helpers.register(db, "http://127.0.0.1:9/other", name=OTHER)
    await helpers.succeed(db, count=4, name="first")
    await helpers.succeed(db, count=4, name="second", endpoint=OTHER)
    # Interleave the two endpoints' due times: erp 2, 4, 6, 8 minutes ago, other 3, 5, 7, 9.
    rows = await db.fetch("SELECT delivery_id, endpoint FROM deliveries ORDER BY delivery_id")
    minutes = {helpers.ENDPOINT: iter([2, 4, 6, 8]), OTHER: iter([3, 5, 7, 9])}
    for row in rows:
        await db.execute(
            "UPDATE deliveries SET next_attempt_at = clock_timestamp() - make_interval(mins => $2)"
            " WHERE delivery_id = $1", row["delivery_id"], next(minutes[row["endpoint"]]),
        )  # fmt: skip
    expected = await db.fetch("SELECT delivery_id FROM deliveries ORDER BY next_attempt_at LIMIT 5")
    claimed = await deliveries.claim(db, endpoints=[helpers.ENDPOINT, OTHER], owner="w", limit=5, lease_ttl_s=60)
    assert [c.id for c in claimed] == sorted(r["delivery_id"] for r in expected)  # returned in delivery_id order
    assert {c.endpoint for c in claimed} == {helpers.ENDPOINT, OTHER}


async def test_concurrent_claims_take_disjoint_full_rounds(db: asyncpg.Connection, database_url: str) -> None:
    """A claim beside another claim in flight skips its rows and still fills its round."""
    await helpers.register(db, "http://127.0.0.1:9/erp")
    await helpers.succeed(db, count=40)
    other = await asyncpg.connect(database_url)
    try:
        async with other.transaction():
            first = await deliveries.claim(other, endpoints=[helpers.ENDPOINT], owner="a", limit=8, lease_ttl_s=60)
            second = await deliveries.claim(db, endpoints=[helpers.ENDPOINT], owner="b", limit=8, lease_ttl_s=60)
    finally:
        await other.close()
    assert len(first) == 8 and len(second) == 8
    assert not {c.id for c in first} & {c.id for c in second}
