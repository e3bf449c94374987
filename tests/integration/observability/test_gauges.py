"""The database gauges: one elected refresher across processes, values that match the database."""

import dataclasses

import asyncpg
import pytest

from lading import accepting, metrics
from lading.db import jobs, registry
from lading.ids import WorkerId
from lading_elected import gauges
from tests.support import factories


def sample(name: str, **labels: str) -> float | None:
    return metrics.REGISTRY.get_sample_value(name, labels or None)


@pytest.fixture(autouse=True)
def clean_gauges() -> None:
    gauges._clear()


async def test_only_one_refresher_is_elected(db: asyncpg.Connection, database_url: str) -> None:
    first = gauges.GaugeRefresher(database_url)
    second = gauges.GaugeRefresher(database_url)
    try:
        assert await first.run_once() is True
        assert await second.run_once() is False
        assert (first.leader, second.leader) == (True, False)
        # The leader goes away (its session ends): the other takes over at its next round.
        await first._resign()
        assert await second.run_once() is True
    finally:
        await first._resign()
        await second._resign()


async def test_values_follow_the_database(db: asyncpg.Connection, database_url: str) -> None:
    await factories.seed(db)
    await accepting.accept_batch(db, factories.batch_request(count=5))
    refresher = gauges.GaugeRefresher(database_url)
    try:
        assert await refresher.run_once()
        pool, tenant = factories.POOL, factories.TENANT
        assert sample("lading_jobs", pool=pool, tenant=tenant, state="READY") == 5
        assert sample("lading_oldest_eligible_age_seconds", pool=pool) is not None
        assert sample("lading_pool_paused", pool=pool) == 0

        await db.execute("UPDATE pools SET paused_until = now() + interval '1 minute'")
        await refresher.run_once()
        assert sample("lading_pool_paused", pool=pool) == 1
        await db.execute("UPDATE pools SET paused_until = NULL")

        claimed = await jobs.claim_batch(db, pool=pool, worker_id=WorkerId("w"), limit=2, lease_ttl_s=30)
        assert len(claimed) == 2
        await refresher.run_once()
        assert sample("lading_jobs", pool=pool, tenant=tenant, state="READY") == 3
        assert sample("lading_jobs", pool=pool, tenant=tenant, state="RUNNING") == 2

        await db.execute("UPDATE extraction_jobs SET state = 'CANCELLED', lease_until = NULL, worker_id = NULL, "
                         "finished_at = now()")
        await refresher.run_once()
        # Drained: the series are gone, not stuck at their last value.
        assert sample("lading_jobs", pool=pool, tenant=tenant, state="READY") is None
        assert sample("lading_oldest_eligible_age_seconds", pool=pool) is None
        assert sample("lading_outbox_unpublished") is not None and sample("lading_outbox_unpublished") > 0
    finally:
        await refresher._resign()
    # A process that is not the leader exports no values.
    assert sample("lading_jobs", pool=factories.POOL, tenant=factories.TENANT, state="READY") is None


async def test_deliveries_waiting_for_a_missing_endpoint_are_counted_per_tenant(
    db: asyncpg.Connection, database_url: str
) -> None:
    await factories.seed(db)
    request = dataclasses.replace(factories.batch_request(count=3), endpoint="acme/erp")
    await accepting.accept_batch(db, request)
    await db.execute("UPDATE extraction_jobs SET state = 'SUCCEEDED', finished_at = now()")  # deliveries: trigger
    assert await db.fetchval("SELECT count(*) FROM deliveries WHERE state = 'PENDING'") == 3
    refresher = gauges.GaugeRefresher(database_url)
    try:
        assert await refresher.run_once()
        assert sample("lading_deliveries_waiting_for_endpoint", tenant=factories.TENANT) == 3
        # The endpoint appears: nothing waits for it any more, and the series is gone.
        await registry.upsert_endpoint(db, name="acme/erp", url="https://erp.example/hook", spec={})
        await refresher.run_once()
        assert sample("lading_deliveries_waiting_for_endpoint", tenant=factories.TENANT) is None
    finally:
        await refresher._resign()


async def test_outbox_events_set_aside_are_counted_apart_from_the_backlog(
    db: asyncpg.Connection, database_url: str
) -> None:
    await factories.seed(db)
    await accepting.accept_batch(db, factories.batch_request(count=1))
    backlog = await db.fetchval("SELECT count(*) FROM outbox_events WHERE published_at IS NULL")
    assert backlog >= 1
    await db.execute(
        "UPDATE outbox_events SET set_aside_at = now(), error_class = 'UNSTORABLE', error = 'DataError 22021' "
        "WHERE id = (SELECT min(id) FROM outbox_events)"
    )
    refresher = gauges.GaugeRefresher(database_url)
    try:
        assert await refresher.run_once()
        assert sample("lading_outbox_set_aside") == 1
        assert sample("lading_outbox_unpublished") == backlog - 1
    finally:
        await refresher._resign()
