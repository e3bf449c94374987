"""
The oldest retained row's age for document texts and results under TenantQuota spec.retention:
`lading_cleaner_oldest_retained_age_seconds{table="job_documents"|"results"}` is the age of the
oldest ended job still holding what the cleaner would take once its days pass, and goes away when
no such row is left.
"""

from __future__ import annotations

import asyncpg
import pytest
from lading_worker import cleaning

from lading import metrics
from lading.db import registry
from lading.ids import JobId, TenantName
from tests.integration.delivery import helpers
from tests.support import factories

DAY_S = 86_400.0


def _gauge(table: str) -> float | None:
    value: float | None = metrics.REGISTRY.get_sample_value("lading_cleaner_oldest_retained_age_seconds",
                                                            {"table": table})  # fmt: skip
    return value


async def _ended_days_ago(db: asyncpg.Connection, job_id: JobId, days: float) -> None:
    await db.execute("UPDATE extraction_jobs SET finished_at = now() - make_interval(secs => $2) WHERE id = $1",
                     job_id, days * DAY_S)  # fmt: skip


async def test_the_oldest_kept_text_and_result_ages_are_exported_and_cleared(db: asyncpg.Connection) -> None:
    old, recent = await helpers.succeed(db, count=2, endpoint=None)
    await registry.upsert_tenant(
        db, name=TenantName(factories.TENANT), namespaces=[factories.TENANT], weight=1, max_queued_jobs=None,
        max_in_flight=None,
        spec={"namespaces": [factories.TENANT], "retention": {"documentsDays": 30, "resultsDays": 60}},
    )  # fmt: skip
    await _ended_days_ago(db, old, 45)  # its text goes now, its result in 15 days
    await _ended_days_ago(db, recent, 10)  # both kept

    await cleaning.clean_personal_data(db, settings=cleaning.CleanerSettings())

    assert _gauge("job_documents") == pytest.approx(10 * DAY_S, abs=60)  # the text of `recent`
    assert _gauge("results") == pytest.approx(45 * DAY_S, abs=60)  # the result of `old`, its text gone

    await _ended_days_ago(db, old, 61)
    await _ended_days_ago(db, recent, 61)
    await cleaning.clean_personal_data(db, settings=cleaning.CleanerSettings())
    assert _gauge("job_documents") is None and _gauge("results") is None  # nothing kept: no gauge
