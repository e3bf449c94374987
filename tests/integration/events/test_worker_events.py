"""
A worker given a broker runs the outbox relay and the ingress consumer beside its other loops:
every event its jobs write reaches RabbitMQ and comes back into the inbox once.
"""

from __future__ import annotations

import asyncpg
from lading_worker import broker, running

from lading import accepting
from lading.settings import ClaimerSettings, EventSettings, LeaseSettings, ReaperSettings, WorkerProcessSettings
from tests.support import factories, waiting


async def _settled(db: asyncpg.Connection) -> bool:
    events = await db.fetchval("SELECT count(*) FROM outbox_events")
    return bool(
        await db.fetchval("SELECT count(*) FROM extraction_jobs WHERE state IN ('READY', 'RUNNING', 'RETRY_SCHEDULED')")
        == 0
        and await db.fetchval("SELECT count(*) FROM outbox_events WHERE published_at IS NULL") == 0
        and await db.fetchval("SELECT count(*) FROM execution_inbox") == events
    )


async def test_a_worker_with_a_broker_relays_its_events_into_the_inbox(
        db: asyncpg.Connection, dbpool: asyncpg.Pool, amqp_url: str, event_settings: EventSettings, channel: object,
) -> None:
    await factories.seed(db)
    await accepting.accept_batch(db, factories.batch_request(count=5))
    settings = WorkerProcessSettings(
        pool=factories.POOL,
        lease=LeaseSettings(ttl_s=10, heartbeat_interval_s=0.1),
        claimer=ClaimerSettings(poll_interval_s=0.05),
        reaper=ReaperSettings(interval_s=0.1),
        shutdown_grace_s=5,
    )
    worker = running.Worker(
        dbpool, settings=settings, events=broker.BrokerConfig(amqp_url=amqp_url, settings=event_settings)
    )
    async with waiting.running(worker.run):
        await waiting.until(lambda: _settled(db), timeout_s=30)
    types = await db.fetch("SELECT type, count(*) AS n FROM execution_inbox GROUP BY type ORDER BY type")
    assert types[0]["type"] == "batch.accepted.v1" and types[0]["n"] == 1
    assert sum(r["n"] for r in types) == 6  # the acceptance and one terminal event per job
    assert "amqp" not in repr(worker.events)  # the URL (password) never shows in a repr
