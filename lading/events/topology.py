"""
What Lading declares on RabbitMQ, declared idempotently by every relay and consumer at start.

    exchange  <prefix>lading.events       topic, durable; routing key = event type
    queue     <prefix>lading.ingress      quorum; bound to settings.ingress_bindings: documents sent
                                          to the queue intake (`document.submitted.v1`) and Lading's
                                          own events
    exchange  <prefix>lading.dlx          fanout, durable; the ingress queue's dead-letter exchange
    queue     <prefix>lading.ingress.dead quorum; bound to the dead-letter exchange

The queue arguments are written for RabbitMQ 3.10 (Debian bookworm ships 3.10.8):

- `x-delivery-limit` is explicit: 3.10 has no default, so a message that crashes every consumer
  would be redelivered forever.
- `x-dead-letter-strategy: at-least-once` keeps a dead letter in the source queue until the
  dead-letter queue confirms it. It only takes effect with `x-overflow: reject-publish`; with the
  default `drop-head` RabbitMQ silently falls back to at-most-once dead-lettering. It also needs
  the `stream_queue` feature flag (enabled on a fresh 3.10 node).
- `x-max-length` bounds both queues; a full queue nacks the relay's publishes, so events wait in
  the outbox instead of being dropped.

A queue's arguments cannot be changed by declaring it again (PRECONDITION_FAILED): a changed
setting needs the queue deleted while it is empty, or a policy (docs/events.md).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import aio_pika
import aio_pika.abc

from lading.settings import BrokerTopology


@dataclasses.dataclass(frozen=True)
class Declared:
    exchange: aio_pika.abc.AbstractExchange
    ingress: aio_pika.abc.AbstractQueue
    dead_letters: aio_pika.abc.AbstractQueue
    dead_letter_exchange: aio_pika.abc.AbstractExchange
    """Where the consumer publishes a refused message itself, with the reason in a header."""


def ingress_arguments(topology: BrokerTopology) -> dict[str, Any]:
    """The ingress queue's arguments: quorum, explicit delivery limit, at-least-once dead-lettering."""
    return {
        "x-queue-type": "quorum",
        "x-delivery-limit": topology.delivery_limit,
        "x-dead-letter-exchange": topology.name(topology.dead_letter_exchange),
        "x-dead-letter-strategy": "at-least-once",
        "x-overflow": "reject-publish",
        "x-max-length": topology.max_length,
    }


def dead_letter_arguments(topology: BrokerTopology) -> dict[str, Any]:
    """The dead-letter queue's arguments: quorum and bounded; when it is full, at-least-once
    dead-lettering keeps the letters in the ingress queue rather than dropping them."""
    return {
        "x-queue-type": "quorum",
        "x-overflow": "reject-publish",
        "x-max-length": topology.max_length,
    }


async def declare(channel: aio_pika.abc.AbstractChannel, topology: BrokerTopology) -> Declared:
    """Declare everything (idempotent: an identical declaration is a no-op)."""
    exchange = await channel.declare_exchange(
        topology.name(topology.exchange), aio_pika.ExchangeType.TOPIC, durable=True
    )
    dlx = await channel.declare_exchange(
        topology.name(topology.dead_letter_exchange), aio_pika.ExchangeType.FANOUT, durable=True
    )
    dead = await channel.declare_queue(
        topology.name(topology.dead_letter_queue), durable=True, arguments=dead_letter_arguments(topology)
    )
    await dead.bind(dlx, routing_key="")
    ingress = await channel.declare_queue(
        topology.name(topology.ingress_queue), durable=True, arguments=ingress_arguments(topology)
    )
    for key in topology.ingress_bindings:
        await ingress.bind(exchange, routing_key=key)
    return Declared(exchange=exchange, ingress=ingress, dead_letters=dead, dead_letter_exchange=dlx)


async def delete(channel: aio_pika.abc.AbstractChannel, topology: BrokerTopology) -> None:
    """Delete everything `declare` made, messages included (tests, and decommissioning)."""
    await channel.queue_delete(topology.name(topology.ingress_queue))
    await channel.queue_delete(topology.name(topology.dead_letter_queue))
    await channel.exchange_delete(topology.name(topology.exchange))
    await channel.exchange_delete(topology.name(topology.dead_letter_exchange))
