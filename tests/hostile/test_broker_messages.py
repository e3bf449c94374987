"""
Hostile broker messages through the real ingress consumer, real RabbitMQ and real PostgreSQL.

One consumer (a single prefetch slot: the harshest case, where one stuck message stops all)
runs for the whole test. Each example publishes its messages raw to the ingress queue (any
message id, any type, any body), then a good event. Invariants: every message ends acked
(recorded, duplicate, quarantined) or dead-lettered, and the dead-letter queue holds exactly
the rejected ones; the ingress queue is empty; the good event behind them is recorded; the
consumer is still running.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aio_pika
import aio_pika.abc
import asyncpg
import hypothesis
import orjson
import pytest
from hypothesis import strategies as st
from lading_worker import consuming

from lading.settings import BrokerTopology, EventSettings, IngressSettings
from tests.hostile import strategies, tally
from tests.integration.events import helpers
from tests.support import broker, waiting


@dataclasses.dataclass
class Ingress:
    db: asyncpg.Connection
    channel: aio_pika.abc.AbstractChannel
    names: BrokerTopology
    consumer: consuming.IngressConsumer
    task: asyncio.Task[None]
    dead: list[bytes] = dataclasses.field(default_factory=list)
    """Every dead letter drained so far (dead-lettering is asynchronous: one may land late)."""

    async def dead_lettered(self) -> list[bytes]:
        """Wait until the dead-letter queue has had one message per rejection; all of them so far."""

        async def complete() -> bool:
            self.dead.extend(m.body for m in await helpers.drain(self.channel, self.names.name(
                self.names.dead_letter_queue)))  # fmt: skip
            return len(self.dead) >= self.consumer.counts.rejected

        await waiting.until(complete, timeout_s=20)
        return self.dead

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:  # printed with a failing example: keep it short
        printer.text("<Ingress>")

    def handled(self) -> int:
        c = self.consumer.counts
        return c.recorded + c.duplicate + c.quarantined + c.rejected

    async def publish(self, message: strategies.BrokerMessage) -> None:
        await self.channel.default_exchange.publish(
            aio_pika.Message(message.body, message_id=message.message_id, type=message.type),
            routing_key=self.names.name(self.names.ingress_queue),
        )


@pytest.fixture
async def pipeline(db: asyncpg.Connection, dbpool: asyncpg.Pool, amqp_url: str) -> AsyncIterator[Ingress]:
    names = broker.unique_topology()
    settings = EventSettings(topology=names, ingress=IngressSettings(
        prefetch=1, retry_base_s=0.05, retry_cap_s=0.5, reconnect_base_s=0.05, reconnect_cap_s=0.5,
    ))  # fmt: skip
    async with broker.declared(amqp_url, names) as channel:
        consumer = consuming.IngressConsumer(dbpool, amqp_url=amqp_url, settings=settings)
        stop = asyncio.Event()
        task = asyncio.create_task(consumer.run_forever(stop), name="ingress")
        try:
            await asyncio.wait_for(consumer.consuming.wait(), 20)
            yield Ingress(db=db, channel=channel, names=names, consumer=consumer, task=task)
        finally:
            stop.set()
            await asyncio.wait_for(task, 30)


@hypothesis.settings(
    max_examples=40, deadline=None, suppress_health_check=[hypothesis.HealthCheck.function_scoped_fixture],
)  # fmt: skip
@hypothesis.given(messages=st.lists(strategies.broker_messages(), min_size=1, max_size=5))
@hypothesis.example(messages=list(strategies.HUGE_MESSAGES))
@hypothesis.example(messages=list(strategies.FOUND_MESSAGES))
async def test_every_message_is_acked_or_dead_lettered_and_the_consumer_goes_on(
        pipeline: Ingress, messages: list[strategies.BrokerMessage],
) -> None:
    before = pipeline.handled()
    for message in messages:
        await pipeline.publish(message)
    tally.tried("broker-message", len(messages))
    good = str(uuid.uuid4())
    await pipeline.publish(strategies.BrokerMessage("good", orjson.dumps({"job_id": 7}), good,
                                                    "extraction.completed.v1"))  # fmt: skip

    async def all_handled() -> bool:
        tally.check("ingress", not pipeline.task.done(), "the consumer stopped")
        return pipeline.handled() >= before + len(messages) + 1

    try:
        await waiting.until(all_handled, timeout_s=30)
    except TimeoutError:
        tally.wedged("ingress")
        raise
    assert pipeline.handled() == before + len(messages) + 1, "a message was handled twice"
    recorded = await pipeline.db.fetchval("SELECT count(*) FROM execution_inbox WHERE event_id = $1", uuid.UUID(good))
    tally.check("ingress", recorded == 1, "the good event behind the hostile ones was not recorded")
    dead = await pipeline.dead_lettered()
    assert len(dead) == pipeline.consumer.counts.rejected, "the dead-letter queue holds exactly the rejected messages"
    depth = await broker.queue_depth(pipeline.channel, pipeline.names.name(pipeline.names.ingress_queue))
    tally.check("ingress", depth == 0, f"{depth} messages left in the ingress queue")
    never_events = [m.body for m in messages if m.kind in ("huge-int", "not-object", "huge", "deep")]
    assert all(body in dead for body in never_events), "a body that can never be an event was not dead-lettered"
