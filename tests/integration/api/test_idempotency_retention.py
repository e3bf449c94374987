"""
Idempotency-Key records are kept at least a day, then the cleaner prunes them (bounded batches,
oldest first); a retention shorter than a day is refused.
"""

from __future__ import annotations

import asyncpg
import pytest
from lading_worker import cleaning


async def test_records_past_the_retention_go_younger_ones_stay(db: asyncpg.Connection) -> None:
    for i, hours in enumerate((90, 60, 49, 47, 1)):
        await db.execute(
            "INSERT INTO api_requests (namespace, idempotency_key, request_sha256, status, location, body, created_at)"
            " VALUES ('acme', $1, 'd', 202, '/v1/jobs/1', '{}', now() - make_interval(hours => $2))", f"k{i}", hours,
        )  # fmt: skip
    deleted = await cleaning.clean(db, settings=cleaning.CleanerSettings(batch_size=2))
    assert deleted["api_requests"] == 3
    assert sorted(r["idempotency_key"] for r in await db.fetch("SELECT idempotency_key FROM api_requests")) == [
        "k3", "k4"]


def test_a_retention_under_a_day_is_refused() -> None:
    with pytest.raises(ValueError, match="Idempotency-Key retention"):
        cleaning.CleanerSettings(api_requests_s=3600)
