"""
The outbox relay: committed outbox rows -> RabbitMQ, with publisher confirms.

One round (`run_once`):

    claim   one committed statement: up to batch_size unpublished rows whose claim is free or
            expired, SKIP LOCKED, claimed for claim_ttl_s (a lease on the database clock)
    publish outside any transaction: persistent, mandatory, all of the batch in flight at once;
            each publish waits for the broker's answer (confirm, nack, or return + confirm)
    mark    one statement: the confirmed rows, only while this relay still owns their claim
    release nacked/returned rows after refused_retry_s; unanswered rows at once

Marking and releasing are one statement per group. If PostgreSQL refuses one with a data error
(`storable.is_data_error`: a fact about a row, not about the server), the group is bisected
(`storable.isolate`) so every other row is settled, and each refused row is set aside for good
(`set_aside_at`, error class UNSTORABLE, migration 0015): it never comes back to block a group.

A crash between confirm and mark republishes the batch once the claim expires: consumers
dedup by `event_id` (the message id). Nothing is ever marked without a confirm. A relay whose
claim expired and was taken over marks nothing, so it cannot undo the new owner's claim.

`run_forever` keeps a connection, rebuilds it with jittered backoff when the broker goes away
(meanwhile it claims nothing and rows simply wait), and sets the oldest-unpublished-age gauge
every round. Ordering: rows are published in id order within a batch, but a retried row may
overtake later ones; consumers must not rely on order.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import os
import secrets
import socket
from collections.abc import Awaitable, Callable, Sequence

import aio_pika
import aio_pika.abc
import aio_pika.exceptions
import aiormq.exceptions
import asyncpg

from lading import errors, failpoints, looping, metrics, storable, tracing
from lading.db import conflicts, outbox
from lading.events import messages, topology
from lading.settings import EventSettings

logger = logging.getLogger(__name__)

BROKER_ERRORS: tuple[type[Exception], ...] = (
    aiormq.exceptions.AMQPError,
    aiormq.exceptions.ChannelInvalidStateError,
    aio_pika.exceptions.AMQPException,
    OSError,
    TimeoutError,
)
"""What a lost or refusing broker raises (ConnectionError is an OSError)."""
DATABASE_ERRORS: tuple[type[Exception], ...] = (asyncpg.PostgresError, asyncpg.InterfaceError, OSError)
"""What a lost database raises (asyncpg raises OSError when it cannot connect)."""


class BrokerLost(errors.TemporaryError):
    """Publishes went unanswered: the connection is presumed dead and is rebuilt."""


_RECONNECT_ERRORS: tuple[type[Exception], ...] = (*BROKER_ERRORS, BrokerLost)


def new_owner() -> str:
    return f"relay-{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(2)}"


@dataclasses.dataclass(frozen=True)
class RelayResult:
    claimed: int = 0
    confirmed: int = 0
    marked: int = 0
    nacked: int = 0
    returned: int = 0
    unconfirmed: int = 0
    set_aside: int = 0
    """Rows whose mark or release PostgreSQL refused (a data error): set aside as UNSTORABLE."""


class OutboxRelay:
    def __init__(
            self,
            db: asyncpg.Pool,
            *,
            amqp_url: str,
            settings: EventSettings,
            owner: str | None = None,
    ) -> None:
        self._db = db
        self._url = amqp_url
        self.settings = settings
        self.owner = owner or new_owner()
        self._connection: aio_pika.abc.AbstractConnection | None = None
        self._exchange: aio_pika.abc.AbstractExchange | None = None

    def __repr__(self) -> str:  # never the URL: it carries a password
        return f"<OutboxRelay {self.owner}>"

    @property
    def connected(self) -> bool:
        connection = self._connection
        return connection is not None and not connection.is_closed and connection.connected.is_set()

    async def connect(self) -> None:
        """Open a connection and a confirming channel, and declare the topology."""
        await self.close()
        connection = await aio_pika.connect(self._url, timeout=self.settings.relay.publish_timeout_s)
        try:
            channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
            declared = await topology.declare(channel, self.settings.topology)
        except BaseException:
            await connection.close()
            raise
        self._connection, self._exchange = connection, declared.exchange

    async def close(self) -> None:
        connection, self._connection, self._exchange = self._connection, None, None
        if connection is not None and not connection.is_closed:
            try:
                await asyncio.wait_for(connection.close(), timeout=5)
            except BROKER_ERRORS as exc:
                logger.debug("Closing the broker connection failed: %r", exc)

    async def run_once(self) -> RelayResult:
        """One claim-publish-mark round; `connect()` first. Raises BrokerLost when publishes went
        unanswered (after the confirmed ones were marked and the others released)."""
        if self._exchange is None:
            raise BrokerLost("the relay is not connected")
        s = self.settings.relay
        metrics.OUTBOX_OLDEST_UNPUBLISHED_AGE.set(await outbox.oldest_unpublished_age(self._db) or 0.0)
        events = await outbox.claim_batch(self._db, owner=self.owner, limit=s.batch_size, ttl_s=s.claim_ttl_s)
        if not events:
            return RelayResult()
        answers = await asyncio.gather(*(self._publish(self._exchange, e) for e in events))
        await failpoints.ahit("relay.after_publish_before_mark")
        confirmed = [e.id for e, a in zip(events, answers, strict=True) if a == "confirmed"]
        refused = [e.id for e, a in zip(events, answers, strict=True) if a in ("nacked", "returned")]
        lost = [e.id for e, a in zip(events, answers, strict=True) if a == "unconfirmed"]
        # Each is one statement locking its rows in id order; a conflict (deadlock, serialization) reruns it.
        marked, set_aside = await self._settle(
            confirmed, "Marking outbox events",
            lambda ids: outbox.mark_published(self._db, ids=ids, owner=self.owner),
        )  # fmt: skip
        for ids, after_s, what in ((refused, s.refused_retry_s, "refused"), (lost, 0.0, "unconfirmed")):
            _, refused_rows = await self._settle(
                ids, f"Releasing {what} outbox events", functools.partial(self._release, after_s=after_s)
            )
            set_aside += refused_rows
        metrics.OUTBOX_MARKED.inc(marked)
        for answer in ("confirmed", "nacked", "returned", "unconfirmed"):
            if n := answers.count(answer):
                metrics.OUTBOX_PUBLISHES.labels(result=answer).inc(n)
        result = RelayResult(
            claimed=len(events),
            confirmed=len(confirmed),
            marked=marked,
            nacked=answers.count("nacked"),
            returned=answers.count("returned"),
            unconfirmed=len(lost),
            set_aside=set_aside,
        )
        if result.nacked or result.returned:
            logger.warning("Broker refused outbox events (retried in %.0f s): %s", s.refused_retry_s, result)
        if marked < len(confirmed):
            logger.info("%d confirmed events were taken over by another relay after our claim expired",
                        len(confirmed) - marked)  # fmt: skip
        if lost:
            raise BrokerLost(f"{len(lost)} of {len(events)} publishes got no answer from the broker")
        return result

    async def _release(self, ids: Sequence[int], *, after_s: float) -> int:
        return await outbox.release(self._db, ids=ids, owner=self.owner, after_s=after_s)

    async def _settle(
            self,
            ids: Sequence[int],
            what: str,
            statement: Callable[[Sequence[int]], Awaitable[int]],
    ) -> tuple[int, int]:
        """Run `statement` over `ids` as one statement (conflicts retried); on a data error, bisect
        and set each refused row aside. (rows the statements counted, rows set aside)"""
        outcome = await storable.isolate(
            ids, lambda group: conflicts.retrying(lambda: statement(group), what=what)
        )
        set_aside = 0
        for event_id, exc in outcome.refused:
            error = f"{what}: {type(exc).__name__} (SQLSTATE {exc.sqlstate})"  # never the value
            if await outbox.set_aside(self._db, id=event_id, owner=self.owner, error_class=storable.UNSTORABLE,
                                      error=error):  # fmt: skip
                set_aside += 1
                logger.error("ALARM: outbox event row %d set aside as %s: %s", event_id, storable.UNSTORABLE, error)
        return sum(outcome.results), set_aside

    async def _publish(self, exchange: aio_pika.abc.AbstractExchange, event: outbox.OutboxEvent) -> str:
        batch_id = event.payload.get("batch_id") if isinstance(event.payload, dict) else None
        if not isinstance(batch_id, int):
            return await self._publish_one(exchange, event)
        with tracing.span("lading.publish", batch_id=batch_id, attributes={
            "event_id": str(event.event_id), "event_type": event.type, "job_id": event.payload.get("job_id"),
        }):
            return await self._publish_one(exchange, event)

    async def _publish_one(self, exchange: aio_pika.abc.AbstractExchange, event: outbox.OutboxEvent) -> str:
        try:
            await exchange.publish(
                messages.to_message(event),
                routing_key=event.type,
                mandatory=True,
                timeout=self.settings.relay.publish_timeout_s,
            )
        except aio_pika.exceptions.PublishError:
            return "returned"
        except aio_pika.exceptions.DeliveryError:
            return "nacked"
        except BROKER_ERRORS as exc:
            logger.debug("Publish of event %s got no answer: %r", event.event_id, exc)
            return "unconfirmed"
        return "confirmed"

    async def run_forever(self, stop: asyncio.Event) -> None:
        s = self.settings.relay
        backoff = looping.Backoff(base_s=s.reconnect_base_s, cap_s=s.reconnect_cap_s)
        try:
            while not stop.is_set():
                try:
                    if not self.connected:
                        await self.connect()
                        if backoff.failures:
                            logger.info("Outbox relay reconnected to the broker")
                        backoff.succeeded()
                    result = await self.run_once()
                    if result.claimed:
                        logger.debug("Relayed outbox events: %s", result)
                    if result.claimed < s.batch_size:
                        await looping.wait_or_stop(stop, s.poll_interval_s)
                    continue
                except _RECONNECT_ERRORS as exc:
                    wait = backoff.failed()
                    metrics.BROKER_RECONNECTS.labels(loop="relay").inc()
                    logger.warning("Outbox relay lost its connection (attempt %d): %s", backoff.failures,
                                   _describe(exc))  # fmt: skip
                    await self.close()
                except DATABASE_ERRORS as exc:
                    wait = backoff.failed()
                    logger.warning("Outbox relay cannot reach the database: %s", exc)
                await looping.wait_or_stop(stop, wait)
        finally:
            await self.close()


def _describe(exc: BaseException) -> str:
    """An error without the connection URL (aiormq puts the URL, password included, in some)."""
    return type(exc).__name__ if "amqp" in str(exc).lower() and "@" in str(exc) else f"{type(exc).__name__}: {exc}"

