"""
How a process runs the event loops: the broker URL (a secret, kept out of every repr) and the
settings, turned into named loops for the process's task list (lading_worker.running wires
them beside its other loops; `lading relay` runs them alone).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Coroutine
from typing import Any

import asyncpg

from lading.settings import EventSettings
from lading_worker import consuming, relaying

Loop = Callable[[asyncio.Event], Coroutine[Any, Any, None]]
AMQP_URL_ENV = "LADING_AMQP_URL"
"""Where processes read the broker URL from by default (a flag would show the password in `ps`)."""


@dataclasses.dataclass(frozen=True)
class BrokerConfig:
    amqp_url: str = dataclasses.field(repr=False)
    """amqp://user:password@host:port/vhost; never logged, never in a repr."""
    settings: EventSettings = dataclasses.field(default_factory=EventSettings)
    relay: bool = True
    """Run the outbox relay (any number of replicas may: claims are SKIP LOCKED leases)."""
    ingress: bool = True
    """Run the ingress consumer (any number of replicas may: the inbox dedups)."""

    @property
    def connections(self) -> int:
        """Database connections the loops may hold at once, for sizing a shared pool."""
        return (1 if self.relay else 0) + (self.settings.ingress.db_concurrency if self.ingress else 0)

    def loops(self, db: asyncpg.Pool, *, owner: str) -> list[tuple[str, Loop]]:
        """(task name, loop) pairs; each loop runs until its stop event is set."""
        loops: list[tuple[str, Loop]] = []
        if self.relay:
            outbox_relay = relaying.OutboxRelay(db, amqp_url=self.amqp_url, settings=self.settings, owner=owner)
            loops.append(("outbox relay", outbox_relay.run_forever))
        if self.ingress:
            consumer = consuming.IngressConsumer(db, amqp_url=self.amqp_url, settings=self.settings)
            loops.append(("ingress consumer", consumer.run_forever))
        return loops
