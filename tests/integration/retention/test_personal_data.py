"""
TenantQuota spec.retention: a terminal job's document goes after documentsDays, then its result
after resultsDays; the job row keeps its digests, states, attempts and verdict. What is still
needed stays: a job not yet ended keeps its text, a result with a delivery to send stays until the
delivery settles, and a redelivery and the result's deletion never both succeed. `jobs show`,
`review show` and `deliveries redeliver` say that the data is gone instead of failing.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys

import asyncpg
import pydantic
import pytest
from lading_worker import cleaning

from lading.db import jobs, registry, results
from lading.db import pool as dbpool
from lading.delivery import resolving
from lading.ids import DeliveryId, JobId, TenantName
from lading.models import specs
from tests.integration.delivery import helpers
from tests.support import factories

SETTINGS = cleaning.CleanerSettings(batch_size=2)
async def _lading(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """`lading ...` as a separate process (the CLI runs its own event loop), off this loop's thread."""
    return await asyncio.to_thread(
        subprocess.run, [*LADING, *args], capture_output=True, text=True, timeout=60, check=check
    )


LADING = [sys.executable, "-c", "from lading_cli.main import main; raise SystemExit(main())"]


async def _retain(db: asyncpg.Connection, *, documents_days: int, results_days: int | None) -> None:
    retention: dict[str, int] = {"documentsDays": documents_days}
    if results_days is not None:
        retention["resultsDays"] = results_days
    await registry.upsert_tenant(
        db, name=TenantName(factories.TENANT), namespaces=[factories.TENANT], weight=1, max_queued_jobs=None,
        max_in_flight=None, spec={"namespaces": [factories.TENANT], "retention": retention},
    )


async def _ended_days_ago(db: asyncpg.Connection, job_id: JobId, days: int) -> None:
    await db.execute("UPDATE extraction_jobs SET finished_at = now() - make_interval(days => $2) WHERE id = $1",
                     job_id, days)


async def _audit(db: asyncpg.Connection, job_id: JobId) -> asyncpg.Record:
    return await db.fetchrow(
        "SELECT j.state, j.content_sha256, j.request_hash, j.attempt, j.fence,"
        " (SELECT count(*) FROM job_attempts a WHERE a.job_id = j.id) AS attempts,"
        " (SELECT validation FROM results r WHERE r.job_id = j.id) AS verdict,"
        " (SELECT count(*) FROM outbox_events o WHERE o.aggregate_id = j.id) AS events"
        " FROM extraction_jobs j WHERE j.id = $1", job_id,
    )


async def test_text_then_result_go_and_the_audit_trail_stays(db: asyncpg.Connection) -> None:
    both, text_only, recent = await helpers.succeed(db, count=3, endpoint=None)
    waiting = (await helpers.accept(db, count=1, name="b2", endpoint=None))[0]
    await _retain(db, documents_days=30, results_days=60)
    await _ended_days_ago(db, both, 90)
    await _ended_days_ago(db, text_only, 45)
    await db.execute("UPDATE extraction_jobs SET created_at = now() - interval '400 days' WHERE id = $1", waiting)
    before = {job: await _audit(db, job) for job in (both, text_only, recent)}

    deleted = await cleaning.clean_personal_data(db, settings=SETTINGS)

    assert deleted == {"job_documents": 2, "results": 1}
    documents = {r["job_id"] for r in await db.fetch("SELECT job_id FROM job_documents")}
    assert documents == {recent, waiting}, "a job not yet ended keeps its text, however old"
    assert {job: await _audit(db, job) for job in before} == before, "digests, states, attempts, verdict, events"
    stored = {r["job_id"]: r["result"] for r in await db.fetch("SELECT job_id, result FROM results")}
    assert stored[both] is None and stored[text_only] is not None and stored[recent] is not None
    shown = await jobs.get_job(db, job_id=both)
    assert shown is not None and shown.document_deleted_at is not None and shown.result_deleted_at is not None
    kept = await jobs.get_job(db, job_id=text_only)
    assert kept is not None and kept.document_deleted_at is not None and kept.result_deleted_at is None
    result = await results.result_of(db, job_id=both)
    assert result is not None and result.result is None and result.passed is True
    assert await cleaning.clean_personal_data(db, settings=SETTINGS) == {"job_documents": 0, "results": 0}


async def test_a_tenant_without_retention_keeps_everything(db: asyncpg.Connection) -> None:
    (job,) = await helpers.succeed(db, count=1, endpoint=None)
    await _ended_days_ago(db, job, 3650)
    assert await cleaning.clean_personal_data(db, settings=SETTINGS) == {"job_documents": 0, "results": 0}
    assert await db.fetchval("SELECT count(*) FROM job_documents") == 1


async def test_a_result_with_a_delivery_to_send_stays_then_redeliver_says_it_is_gone(
        db: asyncpg.Connection, database_url: str,
) -> None:
    (job,) = await helpers.succeed(db, count=1)
    await _retain(db, documents_days=1, results_days=1)
    await _ended_days_ago(db, job, 5)
    assert await cleaning.clean_personal_data(db, settings=SETTINGS) == {"job_documents": 1, "results": 0}
    delivery = await helpers.delivery_of(db, job)
    await db.execute("UPDATE deliveries SET state = 'FAILED_TERMINAL' WHERE delivery_id = $1", delivery.id)
    assert await cleaning.clean_personal_data(db, settings=SETTINGS) == {"job_documents": 0, "results": 1}

    with pytest.raises(resolving.ResultDeleted, match="deleted by retention"):
        await resolving.redeliver(db, delivery_id=delivery.id, operator="ops", reason="ERP asked again")
    assert (await helpers.delivery_of(db, job)).state.value == "FAILED_TERMINAL", "nothing changed"

    out = await _lading("deliveries", "redeliver", str(delivery.id), "--operator", "ops", "--reason", "again",
                        "--database-url", database_url, check=False)
    assert out.returncode != 0 and "deleted by retention" in out.stderr and "Traceback" not in out.stderr
    shown = await _lading("jobs", "show", str(job), "--show-document", "--database-url", database_url)
    assert "document deleted by retention" in shown.stdout
    assert "extracted result deleted by retention" in shown.stdout
    as_json = await _lading("jobs", "show", str(job), "--json", "--database-url", database_url)
    document = json.loads(as_json.stdout)
    assert document["job"]["result_deleted_at"] and document["result"]["extracted"] is None
    assert document["result"]["verdict"]["passed"] is True
    review = await _lading("review", "show", str(job), "--database-url", database_url, check=False)
    assert "extracted result deleted by retention" in review.stdout, review.stderr


async def test_a_redelivery_in_progress_keeps_the_result(db: asyncpg.Connection, database_url: str) -> None:
    (job,) = await helpers.succeed(db, count=1)
    await _retain(db, documents_days=1, results_days=1)
    await _ended_days_ago(db, job, 5)
    delivery = await helpers.delivery_of(db, job)
    await db.execute("UPDATE deliveries SET state = 'UNKNOWN_EXTERNAL' WHERE delivery_id = $1", delivery.id)
    operator = await dbpool.connect(database_url)
    try:
        async with operator.transaction():  # the redelivery holds the job FOR SHARE until it commits
            await resolving.redeliver(operator, delivery_id=DeliveryId(delivery.id), operator="ops", reason="r")
            deleted = await asyncio.wait_for(cleaning.clean_personal_data(db, settings=SETTINGS), 10)
            assert deleted["results"] == 0, "the job is locked: passed over, not waited for"
        after = await cleaning.clean_personal_data(db, settings=SETTINGS)
        assert after == {"job_documents": 1, "results": 0}, "the text goes; the result waits for the delivery"
        assert await db.fetchval("SELECT result IS NOT NULL FROM results WHERE job_id = $1", job)
    finally:
        await operator.close()


@pytest.mark.parametrize("retention, message", [
    ({"resultsDays": 30}, "resultsDays requires documentsDays"),
    ({"documentsDays": 30, "resultsDays": 7}, "resultsDays (7) must be at least documentsDays (30)"),
    ({"documentsDays": 0}, "documentsDays"),
])  # fmt: skip
def test_a_retention_that_would_delete_the_result_before_the_text_is_refused(
        retention: dict[str, int], message: str,
) -> None:
    with pytest.raises(pydantic.ValidationError, match=re.escape(message)):
        specs.TenantQuotaSpec.model_validate({"namespaces": ["acme"], "retention": retention})
