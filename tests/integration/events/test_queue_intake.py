"""
The queue intake against real RabbitMQ and PostgreSQL: `document.submitted.v1` messages become
jobs through the one acceptance path (`lading.intake`), each document once whatever the broker
redelivers; malformed and refused messages reach the dead-letter queue with the reason in a
header and leave nothing behind; a full tenant queue holds the message back instead; a broker
connection cut mid-stream ends with every document accepted once and nothing acked before commit.
"""

from __future__ import annotations

import uuid
from typing import Any

import aio_pika
import aio_pika.abc
import asyncpg
import orjson
from lading_worker import consuming

from lading import failpoints, metrics, reasons
from lading.events import messages
from lading.settings import BrokerTopology, EventSettings
from tests.integration.events import helpers
from tests.integration.test_admission_rules import seed
from tests.support import broker, faultproxy, waiting


def document(key: str, **fields: Any) -> dict[str, Any]:
    return {"namespace": "acme", "idempotencyKey": f"key-{key}", "key": key, "text": f"Invoice {key}",
            "inferencePoolRef": "cheap", **fields}  # fmt: skip


async def publish(
        channel: aio_pika.abc.AbstractChannel,
        names: BrokerTopology,
        body: dict[str, Any],
        *,
        message_id: str | None = None,
) -> None:
    exchange = await channel.get_exchange(names.name(names.exchange), ensure=False)
    message = aio_pika.Message(orjson.dumps(body), message_id=message_id or str(uuid.uuid4()),
                               type=messages.DOCUMENT_SUBMITTED, delivery_mode=aio_pika.DeliveryMode.PERSISTENT)
    await exchange.publish(message, routing_key=messages.DOCUMENT_SUBMITTED)  # fmt: skip


async def handled(consumer: consuming.IngressConsumer, n: int) -> bool:
    c = consumer.counts
    return c.accepted + c.recorded + c.duplicate + c.quarantined + c.rejected >= n


async def count(db: asyncpg.Connection, table: str) -> int:
    return int(await db.fetchval(f"SELECT count(*) FROM {table}"))


async def test_each_document_is_accepted_once_whatever_is_sent_again(
        db: asyncpg.Connection, dbpool: asyncpg.Pool, amqp_url: str, event_settings: EventSettings,
        channel: aio_pika.abc.AbstractChannel, names: BrokerTopology,
) -> None:
    await seed(db)
    first = str(uuid.uuid4())
    await publish(channel, names, document("inv-1"), message_id=first)
    await publish(channel, names, document("inv-1"), message_id=first)  # the same message again
    await publish(channel, names, document("inv-1"))  # another message, same key and document: replayed
    await publish(channel, names, document("inv-2", priority="normal"))
    consumer = consuming.IngressConsumer(dbpool, amqp_url=amqp_url, settings=event_settings)
    async with waiting.running(consumer.run_forever):
        await waiting.until(lambda: handled(consumer, 4), timeout_s=15)
    c = consumer.counts
    assert (c.accepted, c.duplicate, c.rejected) == (3, 1, 0)
    rows = await db.fetch("SELECT document_key, state FROM extraction_jobs ORDER BY document_key")
    assert [tuple(r) for r in rows] == [("inv-1", "READY"), ("inv-2", "READY")]
    assert await count(db, "document_submissions") == 2
    inbox = await db.fetch("SELECT type, payload FROM execution_inbox")
    assert len(inbox) == 3 and {r["type"] for r in inbox} == {messages.DOCUMENT_SUBMITTED}
    assert all("text" not in r["payload"] and r["payload"]["namespace"] == "acme" for r in inbox)
    assert "Invoice" not in str([r["payload"] for r in inbox])  # the inbox keeps no document text
    assert await broker.queue_depth(channel, names.name(names.ingress_queue)) == 0


async def test_malformed_and_refused_messages_are_dead_lettered_with_the_reason_and_leave_nothing(
        db: asyncpg.Connection, dbpool: asyncpg.Pool, amqp_url: str, event_settings: EventSettings,
        channel: aio_pika.abc.AbstractChannel, names: BrokerTopology,
) -> None:
    await seed(db, allowedPools=["acme/cheap"])
    await publish(channel, names, document("ok"))
    refused = {
        "Unparseable": {k: v for k, v in document("a").items() if k != "namespace"},
        "InvalidSpec": document("../b", priority="urgent", deadlineSeconds=5),
        "PoolNotAllowed": document("c", inferencePoolRef="acme/fast"),
        "NoTenantQuota": document("d", namespace="globex"),
        "IdempotencyMismatch": document("other", idempotencyKey="key-ok"),
    }
    for body in refused.values():
        await publish(channel, names, body)
    await publish(channel, names, {**document("e"), "secretField": 1})  # a field a document does not have
    await publish(channel, names, document("last"))
    consumer = consuming.IngressConsumer(dbpool, amqp_url=amqp_url, settings=event_settings)
    async with waiting.running(consumer.run_forever):
        await waiting.until(lambda: handled(consumer, 8), timeout_s=15)
    assert (consumer.counts.accepted, consumer.counts.rejected) == (2, 6)
    assert [r["document_key"] for r in await db.fetch("SELECT document_key FROM extraction_jobs ORDER BY id")] == [
        "ok", "last"
    ]
    assert (await count(db, "document_submissions"), await count(db, "execution_inbox")) == (2, 2)

    dead = await helpers.drain(channel, names.name(names.dead_letter_queue))
    assert len(dead) == 6
    why_by_key = {orjson.loads(m.body).get("key"): _why(m) for m in dead}
    assert why_by_key["a"] == ("Unparseable", why_by_key["a"][1]) and "no string 'namespace'" in why_by_key["a"][1]
    code, why = why_by_key["../b"]
    assert code == "InvalidSpec" and "key: " in why and "priority: " in why and "deadlineSeconds: " in why
    code, why = why_by_key["c"]
    assert code == "PoolNotAllowed" and "inferencePoolRef: TenantQuota acme does not allow" in why
    assert why_by_key["d"][0] == "NoTenantQuota" and "namespace globex is not covered" in why_by_key["d"][1]
    assert why_by_key["other"][0] == "IdempotencyMismatch" and "'key-ok' was already used" in why_by_key["other"][1]
    assert why_by_key["e"][0] == "Unparseable" and "unknown fields secretField" in why_by_key["e"][1]
    assert all(m.message_id and m.type == messages.DOCUMENT_SUBMITTED for m in dead)  # kept as sent


def _why(message: aio_pika.abc.AbstractIncomingMessage) -> tuple[str, str]:
    return str(message.headers[consuming.CODE_HEADER]), str(message.headers[consuming.REASON_HEADER])


async def test_a_full_tenant_queue_holds_the_message_back_until_there_is_room(
        db: asyncpg.Connection, dbpool: asyncpg.Pool, amqp_url: str, event_settings: EventSettings,
        channel: aio_pika.abc.AbstractChannel, names: BrokerTopology,
) -> None:
    await seed(db, maxQueuedJobs=1)
    await publish(channel, names, document("first"))
    consumer = consuming.IngressConsumer(dbpool, amqp_url=amqp_url, settings=event_settings)
    async with waiting.running(consumer.run_forever):
        await waiting.until(lambda: handled(consumer, 1), timeout_s=15)
        refusals = metrics.ADMISSION_REJECTIONS.labels(reasons.QUOTA_EXCEEDED)
        before = refusals._value.get()
        await publish(channel, names, document("second"))
        # Tried twice and held back: neither accepted nor dead-lettered while the queue is full.
        await waiting.until(lambda: _async_true(refusals._value.get() >= before + 2), timeout_s=10)
        assert await broker.queue_depth(channel, names.name(names.ingress_queue)) == 0  # taken, unacked
        assert (consumer.counts.accepted, consumer.counts.rejected) == (1, 0)
        await db.execute("UPDATE extraction_jobs SET state = 'CANCELLED', finished_at = now()")
        await waiting.until(lambda: handled(consumer, 2), timeout_s=15)
    assert (consumer.counts.accepted, consumer.counts.rejected) == (2, 0)
    assert await helpers.drain(channel, names.name(names.dead_letter_queue)) == []


async def _async(depth: Any, expected: int) -> bool:
    return int(await depth) == expected


async def test_a_broker_cut_mid_stream_ends_with_every_document_accepted_once(
        db: asyncpg.Connection, dbpool: asyncpg.Pool, amqp_url: str, event_settings: EventSettings,
        channel: aio_pika.abc.AbstractChannel, names: BrokerTopology,
) -> None:
    await seed(db)
    host, port = broker.target(amqp_url)
    proxy = faultproxy.FaultProxy(target_host=host, target_port=port, target_unix=None)
    await proxy.start()
    consumer = consuming.IngressConsumer(dbpool, amqp_url=broker.through(amqp_url, port=proxy.port),
                                         settings=event_settings)  # fmt: skip
    reconnects = metrics.BROKER_RECONNECTS.labels(loop="ingress")
    before = reconnects._value.get()
    total = 60
    try:
        # Every ack waits a little after its commit, so the cut finds committed, unacked messages.
        with failpoints.enabled("ingress.after_commit_before_ack", "sleep(50)"):
            async with waiting.running(consumer.run_forever):
                for i in range(total):
                    await publish(channel, names, document(f"inv-{i:03d}"))
                await waiting.until(lambda: _jobs_at_least(db, 15), timeout_s=20)
                proxy.cut()  # the consumer's connection drops mid-stream; it reconnects through the proxy
                await waiting.until(lambda: _async_true(reconnects._value.get() > before), timeout_s=20)
                await waiting.until(lambda: _jobs_at_least(db, total), timeout_s=30)
                await waiting.until(
                    lambda: _async(broker.queue_depth(channel, names.name(names.ingress_queue)), 0), timeout_s=20
                )
                await waiting.until(lambda: _async_true(not consumer._handlers), timeout_s=20)
    finally:
        await proxy.stop()
    keys = [r["document_key"] for r in await db.fetch("SELECT document_key FROM extraction_jobs ORDER BY document_key")]
    assert keys == [f"inv-{i:03d}" for i in range(total)]  # every document once
    assert await count(db, "document_submissions") == total
    # Committed but unacked at the cut (an outcome is counted once its ack is sent; an ack the cut
    # swallowed counts too): redelivered and recognised by the inbox, never accepted twice.
    c = consumer.counts
    assert c.accepted <= total <= c.accepted + c.duplicate and c.duplicate >= 1
    assert await helpers.drain(channel, names.name(names.dead_letter_queue)) == []


async def _jobs_at_least(db: asyncpg.Connection, n: int) -> bool:
    return await count(db, "extraction_jobs") >= n


async def _async_true(value: bool) -> bool:
    return value
