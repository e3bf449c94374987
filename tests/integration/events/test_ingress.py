"""
The ingress consumer against real RabbitMQ and PostgreSQL: each event is recorded once in the
inbox; a redelivery is a no-op, a conflicting one is quarantined; what is not an event is
dead-lettered with the reason in a header; no event ever moves a job's state. Documents sent to
the queue intake: tests/integration/events/test_queue_intake.py.
"""

from __future__ import annotations

import asyncio
import functools
import uuid
from typing import Any

import aio_pika
import aio_pika.abc
import asyncpg
import orjson
from lading_worker import consuming, relaying

from lading import accepting
from lading.db import jobs
from lading.db import pool as dbpool_module
from lading.events import topology
from lading.ids import PoolName, WorkerId
from lading.settings import BrokerTopology, EventSettings
from tests.integration.events import helpers
from tests.support import broker, factories, faultproxy, waiting


async def _publish(
        channel: aio_pika.abc.AbstractChannel,
        names: BrokerTopology,
        *,
        body: bytes,
        type: str = "extraction.completed.v1",
        message_id: str | None = None,
        routing_key: str | None = None,
) -> None:
    exchange = await channel.get_exchange(names.name(names.exchange), ensure=False)
    await exchange.publish(aio_pika.Message(body, message_id=message_id, type=type), routing_key=routing_key or type)


def _event(payload: dict[str, Any]) -> bytes:
    return orjson.dumps(payload)


async def _inbox(db: asyncpg.Connection) -> int:
    return int(await db.fetchval("SELECT count(*) FROM execution_inbox"))


async def _handled(consumer: consuming.IngressConsumer, n: int) -> bool:
    c = consumer.counts
    return c.recorded + c.accepted + c.duplicate + c.quarantined + c.rejected >= n


async def test_an_accepted_batch_is_only_recorded_and_wakes_no_one(
        db: asyncpg.Connection, dbpool: asyncpg.Pool, database_url: str, amqp_url: str,
        event_settings: EventSettings, channel: aio_pika.abc.AbstractChannel,
) -> None:
    await factories.seed(db)
    accepted = await accepting.accept_batch(db, factories.batch_request(count=3))
    woken: list[str] = []
    listener = await dbpool_module.connect(database_url)
    try:
        await listener.add_listener("lading_jobs", lambda *args: woken.append(args[3]))
        outbox_relay = relaying.OutboxRelay(dbpool, amqp_url=amqp_url, settings=event_settings)
        await outbox_relay.connect()
        try:
            assert (await outbox_relay.run_once()).marked == 1
        finally:
            await outbox_relay.close()
        consumer = consuming.IngressConsumer(dbpool, amqp_url=amqp_url, settings=event_settings)
        async with waiting.running(consumer.run_forever):
            await waiting.until(lambda: _handled(consumer, 1), timeout_s=15)
        await listener.execute("SELECT 1")  # a notification would have arrived by now
    finally:
        await listener.close()
    # Acceptance's own NOTIFY woke the claimers at its commit; the event is the durable log only.
    assert woken == []
    row = await db.fetchrow("SELECT type, payload, digest FROM execution_inbox")
    assert row["type"] == "batch.accepted.v1" and row["payload"]["batch_id"] == accepted.batch_id
    assert consumer.counts.recorded == 1
    assert await db.fetchval("SELECT array_agg(DISTINCT state) FROM extraction_jobs") == ["READY"]


async def _async(value: bool) -> bool:
    return value


async def test_a_redelivery_is_a_no_op_and_a_different_payload_under_the_same_id_is_quarantined(
        db: asyncpg.Connection, dbpool: asyncpg.Pool, amqp_url: str, event_settings: EventSettings,
        channel: aio_pika.abc.AbstractChannel, names: BrokerTopology,
) -> None:
    event_id = str(uuid.uuid4())
    original = {"job_id": 5, "state": "SUCCEEDED", "tenant": "acme"}
    await _publish(channel, names, body=_event(original), message_id=event_id)
    # The same event again, its JSON spaced and ordered differently: the same canonical digest.
    await _publish(channel, names, body=b'{"tenant": "acme", "state": "SUCCEEDED",  "job_id": 5}', message_id=event_id)
    await _publish(channel, names, body=_event({**original, "state": "FAILED_TERMINAL"}), message_id=event_id)
    consumer = consuming.IngressConsumer(dbpool, amqp_url=amqp_url, settings=event_settings)
    async with waiting.running(consumer.run_forever):
        await waiting.until(lambda: _handled(consumer, 3), timeout_s=15)
    c = consumer.counts
    assert (c.recorded, c.duplicate, c.quarantined, c.rejected) == (1, 1, 1, 0)
    assert await _inbox(db) == 1
    assert (await db.fetchval("SELECT payload FROM execution_inbox"))["state"] == "SUCCEEDED"
    kept = await db.fetchrow("SELECT event_id, digest, first_digest, payload FROM inbox_quarantine")
    assert str(kept["event_id"]) == event_id and kept["payload"]["state"] == "FAILED_TERMINAL"
    assert kept["first_digest"] == await db.fetchval("SELECT digest FROM execution_inbox")
    assert kept["digest"] != kept["first_digest"]
    assert await helpers.drain(channel, names.name(names.ingress_queue)) == []  # all acked


async def test_messages_that_are_not_events_are_dead_lettered_without_requeue(
        db: asyncpg.Connection, dbpool: asyncpg.Pool, amqp_url: str, event_settings: EventSettings,
        channel: aio_pika.abc.AbstractChannel, names: BrokerTopology,
) -> None:
    good = str(uuid.uuid4())
    await _publish(channel, names, body=b"{not json", message_id=str(uuid.uuid4()))
    await _publish(channel, names, body=_event({"job_id": 1}), message_id=str(uuid.uuid4()), type="Completed!",
                   routing_key="extraction.completed.v1")  # fmt: skip
    await _publish(channel, names, body=_event({"job_id": 1}), message_id="not-a-uuid")
    await _publish(channel, names, body=b"[1, 2]", message_id=str(uuid.uuid4()))
    await _publish(channel, names, body=_event({"pool": "x"}), type="batch.accepted.v1", message_id=str(uuid.uuid4()))
    await _publish(channel, names, body=_event({"job_id": 9}), message_id=good)
    consumer = consuming.IngressConsumer(dbpool, amqp_url=amqp_url, settings=event_settings)
    async with waiting.running(consumer.run_forever):
        await waiting.until(lambda: _handled(consumer, 6), timeout_s=15)
    assert (consumer.counts.rejected, consumer.counts.recorded) == (5, 1)
    assert [str(r["event_id"]) for r in await db.fetch("SELECT event_id FROM execution_inbox")] == [good]
    dead = await _wait_for_messages(channel, names.name(names.dead_letter_queue), 5)
    assert all(m.headers[consuming.CODE_HEADER] == "Unparseable" for m in dead)
    why = {m.body: m.headers[consuming.REASON_HEADER] for m in dead}
    assert "is not JSON" in why[b"{not json"]
    assert "has no positive integer 'batch_id'" in why[_event({"pool": "x"})]


async def _wait_for_messages(channel: aio_pika.abc.AbstractChannel, queue: str, n: int) -> list[Any]:
    got: list[Any] = []

    async def enough() -> bool:
        got.extend(await helpers.drain(channel, queue))
        return len(got) >= n

    await waiting.until(enough, timeout_s=10)
    return got


async def test_a_message_over_the_explicit_delivery_limit_is_dead_lettered(amqp_url: str) -> None:
    names = broker.unique_topology(delivery_limit=2)
    async with broker.declared(amqp_url, names) as channel:
        await _publish(channel, names, body=b"crashes every consumer", message_id=str(uuid.uuid4()))
        queue = await channel.declare_queue(names.name(names.ingress_queue), passive=True)
        deliveries = 0
        while (message := await _get(queue)) is not None:
            deliveries += 1
            await message.nack(requeue=True)  # a consumer that fails on it every time
            assert deliveries <= 5, "the delivery limit did not stop the redeliveries"
        dead = await _wait_for_messages(channel, names.name(names.dead_letter_queue), 1)
    assert deliveries == 3  # the first delivery, then two redeliveries: delivery_limit=2
    assert dead[0].headers["x-death"][0]["reason"] == "delivery_limit"


async def _get(queue: aio_pika.abc.AbstractQueue) -> aio_pika.abc.AbstractIncomingMessage | None:
    for _ in range(20):  # a nacked message is requeued asynchronously: give it a moment to be ready
        message = await queue.get(fail=False, no_ack=False)
        if message is not None:
            return message
        await asyncio.sleep(0.05)
    return None


async def test_redelivered_events_never_reset_a_running_or_finished_job(
        db: asyncpg.Connection, dbpool: asyncpg.Pool, amqp_url: str, event_settings: EventSettings,
        channel: aio_pika.abc.AbstractChannel,
) -> None:
    await factories.seed(db)
    await accepting.accept_batch(db, factories.batch_request(count=3))
    running, done = await jobs.claim_batch(db, pool=PoolName(factories.POOL), worker_id=WorkerId("w1"), limit=2,
                                           lease_ttl_s=300)  # fmt: skip
    await db.execute(
        "UPDATE extraction_jobs SET state = 'SUCCEEDED', lease_until = NULL, worker_id = NULL,"
        " finished_at = clock_timestamp() WHERE id = $1", done.id,
    )  # fmt: skip
    snapshot = "SELECT id, state, attempt, fence, lease_until, worker_id, finished_at FROM extraction_jobs ORDER BY id"
    before = [dict(r) for r in await db.fetch(snapshot)]
    assert [r["state"] for r in before] == ["RUNNING", "SUCCEEDED", "READY"]
    events = await db.fetchval("SELECT count(*) FROM outbox_events")  # batch.accepted + extraction.completed
    assert events == 2

    consumer = consuming.IngressConsumer(dbpool, amqp_url=amqp_url, settings=event_settings)
    outbox_relay = relaying.OutboxRelay(dbpool, amqp_url=amqp_url, settings=event_settings)
    async with waiting.running(consumer.run_forever):
        await outbox_relay.connect()
        try:
            for handled in (events, events * 2, events * 3):  # published, then republished twice (relay crashes)
                await db.execute("UPDATE outbox_events SET published_at = NULL")
                assert (await outbox_relay.run_once()).marked == events
                await waiting.until(functools.partial(_handled, consumer, handled), timeout_s=15)
        finally:
            await outbox_relay.close()
    assert (consumer.counts.recorded, consumer.counts.duplicate) == (2, 4)
    assert await _inbox(db) == 2
    assert [dict(r) for r in await db.fetch(snapshot)] == before
    assert running.id == before[0]["id"]


async def test_the_topology_declares_the_rabbitmq_3_10_arguments(names: BrokerTopology) -> None:
    args = topology.ingress_arguments(names)
    assert args["x-queue-type"] == "quorum"
    assert args["x-delivery-limit"] == 20
    assert args["x-dead-letter-strategy"] == "at-least-once"
    assert args["x-overflow"] == "reject-publish"  # without it at-least-once silently becomes at-most-once
    assert args["x-dead-letter-exchange"] == names.prefix + "lading.dlx"


async def test_declaring_the_topology_twice_is_a_no_op(amqp_url: str, names: BrokerTopology) -> None:
    async with broker.declared(amqp_url, names) as channel:
        again = await topology.declare(channel, names)
        assert again.ingress.name == names.prefix + "lading.ingress"


async def test_the_inbox_survives_a_database_outage_without_acking_early(
        db: asyncpg.Connection, database_url: str, amqp_url: str, event_settings: EventSettings,
        channel: aio_pika.abc.AbstractChannel, names: BrokerTopology,
) -> None:
    async with faultproxy.in_front_of(database_url) as (proxy, proxied):
        pool = await dbpool_module.create_pool(proxied, min_size=1, max_size=4)
        try:
            consumer = consuming.IngressConsumer(pool, amqp_url=amqp_url, settings=event_settings)
            async with waiting.running(consumer.run_forever):
                await asyncio.wait_for(consumer.consuming.wait(), 15)
                proxy.set_mode("reset")
                await _publish(channel, names, body=_event({"job_id": 3}), message_id=str(uuid.uuid4()))
                await waiting.until(lambda: _taken_by_the_consumer(channel, names), timeout_s=15)
                assert await _inbox(db) == 0
                proxy.set_mode("pass")
                await waiting.until(lambda: _handled(consumer, 1), timeout_s=15)
        finally:
            pool.terminate()
    assert consumer.counts.recorded == 1 and await _inbox(db) == 1


async def _taken_by_the_consumer(channel: aio_pika.abc.AbstractChannel, names: BrokerTopology) -> bool:
    """The message was delivered (no longer ready); the consumer holds it unacked while it cannot commit."""
    return await broker.queue_depth(channel, names.name(names.ingress_queue)) == 0
