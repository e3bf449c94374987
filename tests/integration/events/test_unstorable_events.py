"""
Events PostgreSQL cannot store, against real RabbitMQ and PostgreSQL: the ingress dead-letters
them (a data error is about the message, never "database unavailable") and goes on with the
next message, even with a single prefetch slot; the relay sets an outbox row aside when marking
it fails with a data error, and the rest of its group is marked.
"""

from __future__ import annotations

import dataclasses
import uuid

import aio_pika
import aio_pika.abc
import asyncpg
import orjson
from lading_worker import consuming, relaying

from lading import storable
from lading.settings import BrokerTopology, EventSettings
from tests.integration.events import helpers
from tests.support import waiting


async def _publish(channel: aio_pika.abc.AbstractChannel, names: BrokerTopology, *, body: bytes,
                   message_id: str, type: str = "extraction.completed.v1") -> None:  # fmt: skip
    exchange = await channel.get_exchange(names.name(names.exchange), ensure=False)
    await exchange.publish(aio_pika.Message(body, message_id=message_id, type=type), routing_key=type)


async def _dead_letters(channel: aio_pika.abc.AbstractChannel, names: BrokerTopology, n: int) -> list[bytes]:
    got: list[bytes] = []

    async def enough() -> bool:
        got.extend(m.body for m in await helpers.drain(channel, names.name(names.dead_letter_queue)))
        return len(got) >= n

    await waiting.until(enough, timeout_s=15)
    return got


async def test_unstorable_bodies_are_dead_lettered_and_the_consumer_goes_on(
        db: asyncpg.Connection, dbpool: asyncpg.Pool, amqp_url: str, event_settings: EventSettings,
        channel: aio_pika.abc.AbstractChannel, names: BrokerTopology,
) -> None:
    """Valid JSON, but not storable: a NUL in a string or a key, an integer beyond bigint. Each
    used to fail the inbox INSERT, be taken for an outage and retried for ever, holding the only
    prefetch slot: the good event behind them was never recorded."""
    bad = [
        b'{"job_id": 1, "note": "a\\u0000b"}',
        b'{"job_id": 2, "nested": {"k\\u0000": 1}}',
        b'{"job_id": 3, "fence": 9223372036854775808}',
    ]
    for body in bad:
        await _publish(channel, names, body=body, message_id=str(uuid.uuid4()))
    good = str(uuid.uuid4())
    await _publish(channel, names, body=orjson.dumps({"job_id": 9}), message_id=good)
    one_slot = dataclasses.replace(event_settings, ingress=dataclasses.replace(event_settings.ingress, prefetch=1))
    consumer = consuming.IngressConsumer(dbpool, amqp_url=amqp_url, settings=one_slot)

    async with waiting.running(consumer.run_forever):
        await waiting.until(lambda: _recorded(consumer), timeout_s=20)

    assert (consumer.counts.rejected, consumer.counts.recorded) == (3, 1)
    assert [str(r["event_id"]) for r in await db.fetch("SELECT event_id FROM execution_inbox")] == [good]
    assert sorted(await _dead_letters(channel, names, 3)) == sorted(bad)


async def test_a_message_whose_insert_fails_with_a_data_error_is_dead_lettered(
        db: asyncpg.Connection, dbpool: asyncpg.Pool, amqp_url: str, event_settings: EventSettings,
        channel: aio_pika.abc.AbstractChannel, names: BrokerTopology,
) -> None:
    """Defence in depth: a value the checks let through but the server refuses (here, a trigger
    raising SQLSTATE 22021 for one payload) is dead-lettered, not retried as an outage."""
    await db.execute(
        """CREATE FUNCTION refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$
           BEGIN
             IF NEW.payload ? 'poison' THEN
               RAISE EXCEPTION 'refused' USING ERRCODE = 'character_not_in_repertoire';
             END IF;
             RETURN NEW;
           END $$;
           CREATE TRIGGER refuse_poison BEFORE INSERT ON execution_inbox
              FOR EACH ROW EXECUTE FUNCTION refuse_poison();"""
    )
    poisoned = orjson.dumps({"job_id": 1, "poison": True})
    await _publish(channel, names, body=poisoned, message_id=str(uuid.uuid4()))
    good = str(uuid.uuid4())
    await _publish(channel, names, body=orjson.dumps({"job_id": 2}), message_id=good)
    one_slot = dataclasses.replace(event_settings, ingress=dataclasses.replace(event_settings.ingress, prefetch=1))
    consumer = consuming.IngressConsumer(dbpool, amqp_url=amqp_url, settings=one_slot)

    async with waiting.running(consumer.run_forever):
        await waiting.until(lambda: _recorded(consumer), timeout_s=20)

    assert (consumer.counts.rejected, consumer.counts.recorded) == (1, 1)
    assert [str(r["event_id"]) for r in await db.fetch("SELECT event_id FROM execution_inbox")] == [good]
    assert await _dead_letters(channel, names, 1) == [poisoned]


async def _recorded(consumer: consuming.IngressConsumer) -> bool:
    return consumer.counts.recorded >= 1


async def test_a_row_the_relay_cannot_mark_is_set_aside_and_the_rest_of_its_group_is_marked(
        db: asyncpg.Connection, dbpool: asyncpg.Pool, amqp_url: str, event_settings: EventSettings,
        channel: aio_pika.abc.AbstractChannel, names: BrokerTopology,
) -> None:
    """Marking a group published is one statement: a data error on one row (here, a trigger raising
    SQLSTATE 22021 when one poisoned row is marked) used to fail the whole mark, so the group was
    republished and failed again for ever. Now the group is bisected, the good rows are marked,
    and the bad one is set aside as UNSTORABLE and never claimed again."""
    await db.execute(
        """CREATE FUNCTION refuse_poison_mark() RETURNS trigger LANGUAGE plpgsql AS $$
           BEGIN
             IF NEW.published_at IS NOT NULL AND NEW.payload ? 'poison' THEN
               RAISE EXCEPTION 'refused' USING ERRCODE = 'character_not_in_repertoire';
             END IF;
             RETURN NEW;
           END $$;
           CREATE TRIGGER refuse_poison_mark BEFORE UPDATE ON outbox_events
              FOR EACH ROW EXECUTE FUNCTION refuse_poison_mark();"""
    )
    ids = [await helpers.add_event(db, aggregate_id=n, payload={"job_id": n, **({"poison": 1} if n == 5 else {})})
           for n in range(1, 9)]  # fmt: skip
    outbox_relay = relaying.OutboxRelay(dbpool, amqp_url=amqp_url, settings=event_settings)
    await outbox_relay.connect()
    try:
        first = await outbox_relay.run_once()
        again = await outbox_relay.run_once()
    finally:
        await outbox_relay.close()

    assert (first.claimed, first.confirmed, first.marked, first.set_aside) == (8, 8, 7, 1)
    assert again.claimed == 0, "the set-aside row is never claimed again"
    rows = await db.fetch(
        "SELECT event_id, published_at IS NOT NULL AS published, set_aside_at IS NOT NULL AS set_aside, error_class,"
        " error, claim_owner FROM outbox_events ORDER BY id"
    )
    assert [r["published"] for r in rows] == [True] * 4 + [False] + [True] * 3
    poisoned = rows[4]
    assert poisoned["event_id"] == ids[4] and poisoned["set_aside"] and poisoned["claim_owner"] is None
    assert poisoned["error_class"] == storable.UNSTORABLE
    assert "CharacterNotInRepertoireError (SQLSTATE 22021)" in poisoned["error"]
    assert await db.fetchval(
        "SELECT count(*) FROM outbox_events WHERE published_at IS NULL AND set_aside_at IS NULL"
    ) == 0
    published = await helpers.drain(channel, names.name(names.ingress_queue))
    assert len(published) == 8, "every row reached the broker once; only its bookkeeping was refused"
