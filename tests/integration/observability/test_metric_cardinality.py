"""Label sets stay bounded: 1,000 jobs across 5 tenants produce a handful of series, and no
label value is ever a job id, a document key or a URL."""

import asyncpg
from lading_worker import running

from lading import accepting, metrics
from lading.db import registry
from lading.ids import TenantName
from lading.settings import ClaimerSettings, LeaseSettings, ReaperSettings, WorkerProcessSettings
from lading_elected import gauges
from tests.support import factories, waiting

TENANTS = [f"tenant-{i}" for i in range(5)]
JOBS_PER_TENANT = 200


async def test_a_thousand_jobs_across_five_tenants_make_few_series(
        db: asyncpg.Connection, dbpool: asyncpg.Pool, database_url: str
) -> None:
    await factories.seed(db)
    keys: set[str] = set()
    ids: set[str] = set()
    for tenant in TENANTS:
        await registry.upsert_tenant(db, name=TenantName(tenant), namespaces=[tenant], weight=1, max_queued_jobs=None,
                                     max_in_flight=None, spec={})  # fmt: skip
        request = factories.batch_request(name=f"b-{tenant}", tenant=tenant, count=JOBS_PER_TENANT)
        accepted = await accepting.accept_batch(db, request)
        ids.update(str(i) for i in accepted.job_ids)
        keys.update(d.key for d in request.documents)
    settings = WorkerProcessSettings(
        pool=factories.POOL,
        claimer=ClaimerSettings(concurrency=64, batch_size=64, poll_interval_s=0.05),
        lease=LeaseSettings(),
        reaper=ReaperSettings(),
    )

    async def settled() -> bool:
        left = await db.fetchval("SELECT count(*) FROM extraction_jobs WHERE state IN ('READY', 'RUNNING', "
                                 "'RETRY_SCHEDULED')")  # fmt: skip
        return left == 0

    async with waiting.running(running.Worker(dbpool, settings=settings).run):
        await waiting.until(settled, timeout_s=90)
    refresher = gauges.GaugeRefresher(database_url)
    try:
        assert await refresher.run_once()
        series = [
            (family.name, sample.labels)
            for family in metrics.REGISTRY.collect()
            if family.name.startswith("lading_")
            for sample in family.samples
        ]
    finally:
        await refresher._resign()

    values = {value for _, labels in series for value in labels.values()}
    assert not values & ids, "a job id is a label value"
    assert not values & keys, "a document key is a label value"
    assert not any("://" in value for value in values), "a URL is a label value"
    per_family: dict[str, int] = {}
    for name, _ in series:
        per_family[name] = per_family.get(name, 0) + 1
    # Histograms carry one series per bucket; everything else a few per pool, tenant and state.
    assert max(per_family.values()) <= 100, per_family
    assert len(series) < 2_000
    tenants_seen = {labels["tenant"] for _, labels in series if "tenant" in labels}
    assert tenants_seen <= set(TENANTS) | {factories.TENANT}
