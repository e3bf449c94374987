"""
The outbox relay against real RabbitMQ and PostgreSQL: a row is marked published only after the
broker confirmed it; a return (unroutable) or a nack leaves it unpublished and counted; claims
are leases a stale relay cannot undo; a broker cut through a fault proxy loses nothing.
"""

from __future__ import annotations

import asyncio
import uuid

import aio_pika
import aio_pika.abc
import asyncpg
import orjson
from lading_worker import consuming, relaying

from lading import metrics
from lading.db import outbox
from lading.settings import BrokerTopology, EventSettings
from tests.integration.events import helpers
from tests.support import broker, faultproxy, waiting


def _counter(result: str) -> float:
    return float(metrics.OUTBOX_PUBLISHES.labels(result=result)._value.get())


async def test_confirmed_events_are_published_as_persistent_messages_and_then_marked(
        db: asyncpg.Connection, dbpool: asyncpg.Pool, amqp_url: str, event_settings: EventSettings,
        channel: aio_pika.abc.AbstractChannel, names: BrokerTopology,
) -> None:
    ids = [await helpers.add_event(db, aggregate_id=i, payload={"job_id": i, "tenant": "acme", "batch_id": 7})
           for i in (1, 2, 3)]  # fmt: skip
    r = relaying.OutboxRelay(dbpool, amqp_url=amqp_url, settings=event_settings)
    await r.connect()
    try:
        result = await r.run_once()
    finally:
        await r.close()
    assert (result.claimed, result.confirmed, result.marked) == (3, 3, 3)
    assert await helpers.unpublished(db) == 0
    assert await db.fetchval("SELECT count(*) FROM outbox_events WHERE claim_owner IS NOT NULL") == 0

    got = await helpers.drain(channel, names.name(names.ingress_queue))
    assert [uuid.UUID(m.message_id or "") for m in got] == ids
    first = got[0]
    assert first.delivery_mode == aio_pika.DeliveryMode.PERSISTENT
    assert first.content_type == "application/json"
    assert first.type == first.routing_key == "extraction.completed.v1"
    assert first.headers["lading-job-id"] == 1 and first.headers["lading-tenant"] == "acme"
    assert first.headers["lading-batch-id"] == 7
    assert orjson.loads(first.body) == {"job_id": 1, "tenant": "acme", "batch_id": 7}


async def test_an_unroutable_event_is_returned_left_unpublished_and_counted(
        db: asyncpg.Connection, dbpool: asyncpg.Pool, amqp_url: str, event_settings: EventSettings,
        channel: aio_pika.abc.AbstractChannel,
) -> None:
    routable = await helpers.add_event(db, aggregate_id=1)
    unroutable = await helpers.add_event(db, type="audit.nobody_listens.v1", aggregate_id=2)
    returned_before = _counter("returned")
    r = relaying.OutboxRelay(dbpool, amqp_url=amqp_url, settings=event_settings)
    await r.connect()
    try:
        result = await r.run_once()
        again = await r.run_once()  # the refused row is held back for refused_retry_s, not spun on
    finally:
        await r.close()
    assert (result.claimed, result.confirmed, result.returned) == (2, 1, 1)
    assert again.claimed == 0
    assert _counter("returned") == returned_before + 1
    rows = {r["event_id"]: r for r in await db.fetch("SELECT event_id, published_at, claim_until FROM outbox_events")}
    assert rows[routable]["published_at"] is not None
    assert rows[unroutable]["published_at"] is None


async def test_a_nack_from_a_full_queue_leaves_the_event_unpublished_and_counted(
        db: asyncpg.Connection, dbpool: asyncpg.Pool, amqp_url: str, event_settings: EventSettings,
) -> None:
    names = broker.unique_topology(max_length=1)  # reject-publish: publishes beyond the limit are nacked
    settings = EventSettings(topology=names, relay=event_settings.relay, ingress=event_settings.ingress)
    nacked_before = _counter("nacked")
    async with broker.declared(amqp_url, names):
        r = relaying.OutboxRelay(dbpool, amqp_url=amqp_url, settings=settings)
        await r.connect()
        try:
            await helpers.add_event(db, aggregate_id=1)
            await helpers.add_event(db, aggregate_id=2)
            filling = await r.run_once()  # a quorum queue notices it is over its limit after these
            late = await helpers.add_event(db, aggregate_id=3)
            await waiting.until(lambda: _nacked_once(r, late), timeout_s=10)
        finally:
            await r.close()
    assert filling.confirmed == filling.marked == 2
    assert _counter("nacked") >= nacked_before + 1
    assert await db.fetchval("SELECT published_at FROM outbox_events WHERE event_id = $1", late) is None


async def _nacked_once(r: relaying.OutboxRelay, _event: uuid.UUID) -> bool:
    # The refused event is held back for refused_retry_s, so each event is offered at most once here.
    result = await r.run_once()
    assert result.confirmed == 0, "the queue is over its limit: nothing more may be confirmed"
    return result.nacked == 1


async def test_a_relay_whose_claim_was_taken_over_marks_nothing(db: asyncpg.Connection) -> None:
    await helpers.add_event(db)
    stale = await outbox.claim_batch(db, owner="relay-a", limit=10, ttl_s=0.001)
    await asyncio.sleep(0.01)  # the claim's lease (1 ms) is over on the database clock
    taken = await outbox.claim_batch(db, owner="relay-b", limit=10, ttl_s=30)
    assert [e.id for e in stale] == [e.id for e in taken]
    assert await outbox.mark_published(db, ids=[stale[0].id], owner="relay-a") == 0
    assert await outbox.release(db, ids=[stale[0].id], owner="relay-a", after_s=0) == 0
    assert await db.fetchval("SELECT claim_owner FROM outbox_events") == "relay-b"
    assert await outbox.mark_published(db, ids=[taken[0].id], owner="relay-b") == 1


async def test_concurrent_claims_take_disjoint_events(db: asyncpg.Connection, dbpool: asyncpg.Pool) -> None:
    for i in range(50):
        await helpers.add_event(db, aggregate_id=i + 1)
    batches = await asyncio.gather(*(outbox.claim_batch(dbpool, owner=f"relay-{n}", limit=20, ttl_s=30)
                                     for n in range(4)))  # fmt: skip
    claimed = [e.id for batch in batches for e in batch]
    assert len(claimed) == len(set(claimed)) == 50


async def test_the_relay_measures_the_age_of_the_oldest_unpublished_event(
        db: asyncpg.Connection, dbpool: asyncpg.Pool, amqp_url: str, event_settings: EventSettings,
        channel: aio_pika.abc.AbstractChannel,
) -> None:
    await helpers.add_event(db, type="audit.nobody_listens.v1")
    await db.execute("UPDATE outbox_events SET created_at = clock_timestamp() - interval '90 seconds'")
    r = relaying.OutboxRelay(dbpool, amqp_url=amqp_url, settings=event_settings)
    await r.connect()
    try:
        await r.run_once()
        await r.run_once()  # still there: the unroutable event keeps the age growing
    finally:
        await r.close()
    assert 90 <= metrics.OUTBOX_OLDEST_UNPUBLISHED_AGE._value.get() < 120
    assert 90 <= (await outbox.oldest_unpublished_age(db) or 0) < 120


async def test_a_broker_cut_mid_run_loses_no_event_and_the_outbox_drains_after_reconnect(
        db: asyncpg.Connection, dbpool: asyncpg.Pool, amqp_url: str, event_settings: EventSettings,
        channel: aio_pika.abc.AbstractChannel, names: BrokerTopology,
) -> None:
    host, port = broker.target(amqp_url)
    proxy = faultproxy.FaultProxy(target_host=host, target_port=port, target_unix=None)
    await proxy.start()
    reconnects = metrics.BROKER_RECONNECTS.labels(loop="relay")
    before = reconnects._value.get()
    expected: set[uuid.UUID] = set()
    r = relaying.OutboxRelay(dbpool, amqp_url=broker.through(amqp_url, port=proxy.port), settings=event_settings)
    try:
        async with waiting.running(r.run_forever):
            for i in range(100):
                expected.add(await helpers.add_event(db, aggregate_id=i + 1))
            await waiting.until(lambda: _published_at_least(db, 1), timeout_s=20)
            proxy.set_mode("reset")  # cuts the open connection and refuses new ones
            for i in range(100, 200):
                expected.add(await helpers.add_event(db, aggregate_id=i + 1))
            await waiting.until(lambda: _reconnects_above(reconnects, before), timeout_s=20)
            assert await helpers.unpublished(db) > 0  # rows wait while the broker is away
            proxy.set_mode("pass")
            await waiting.until(lambda: _all_published(db), timeout_s=30)
    finally:
        await proxy.stop()
    got = await helpers.drain(channel, names.name(names.ingress_queue))
    delivered = {uuid.UUID(m.message_id or "") for m in got}
    assert delivered >= expected  # nothing lost; a publish whose confirm was cut may arrive twice
    assert len(got) - len(delivered) <= event_settings.relay.batch_size


async def _published_at_least(db: asyncpg.Connection, n: int) -> bool:
    return int(await db.fetchval("SELECT count(*) FROM outbox_events WHERE published_at IS NOT NULL")) >= n


async def _all_published(db: asyncpg.Connection) -> bool:
    return await helpers.unpublished(db) == 0


async def _reconnects_above(counter: object, before: float) -> bool:
    return float(counter._value.get()) > before  # type: ignore[attr-defined]


async def test_a_broker_cut_under_relay_and_consumer_ends_with_every_event_in_the_inbox_once(
        db: asyncpg.Connection, dbpool: asyncpg.Pool, amqp_url: str, event_settings: EventSettings,
        channel: aio_pika.abc.AbstractChannel,
) -> None:
    host, port = broker.target(amqp_url)
    proxy = faultproxy.FaultProxy(target_host=host, target_port=port, target_unix=None)
    await proxy.start()
    proxied = broker.through(amqp_url, port=proxy.port)
    consumer = consuming.IngressConsumer(dbpool, amqp_url=proxied, settings=event_settings)
    r = relaying.OutboxRelay(dbpool, amqp_url=proxied, settings=event_settings)
    ingress_reconnects = metrics.BROKER_RECONNECTS.labels(loop="ingress")
    before = ingress_reconnects._value.get()
    try:
        async with waiting.running(consumer.run_forever), waiting.running(r.run_forever):
            for i in range(150):
                await helpers.add_event(db, aggregate_id=i + 1)
            await waiting.until(lambda: _inbox_at_least(db, 1), timeout_s=20)
            proxy.set_mode("reset")
            for i in range(150, 300):
                await helpers.add_event(db, aggregate_id=i + 1)
            await waiting.until(lambda: _reconnects_above(ingress_reconnects, before), timeout_s=20)
            proxy.set_mode("pass")
            await waiting.until(lambda: _all_published(db), timeout_s=30)
            await waiting.until(lambda: _inbox_at_least(db, 300), timeout_s=30)
    finally:
        await proxy.stop()
    assert await db.fetchval("SELECT count(*) FROM execution_inbox") == 300
    assert await db.fetchval(
        "SELECT count(*) FROM outbox_events o LEFT JOIN execution_inbox i USING (event_id) WHERE i.event_id IS NULL"
    ) == 0


async def _inbox_at_least(db: asyncpg.Connection, n: int) -> bool:
    return int(await db.fetchval("SELECT count(*) FROM execution_inbox")) >= n
