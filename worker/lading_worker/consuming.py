"""
The ingress consumer: broker messages -> the durable inbox (`execution_inbox`).

For each message, in ONE transaction: insert the inbox row keyed by `event_id` (unique) with
the payload digest, and apply the event's effect; ack only after that commit.

    new event id                 record + effect, ack
    same id, same digest         nothing (a redelivery, or a relay that republished), ack
    same id, other digest        quarantined (inbox_quarantine) and alarmed, never applied, ack
    not an event (messages.py)   rejected without requeue -> dead-letter queue
    refused by PostgreSQL        rejected without requeue -> dead-letter queue: a data error
                                 (`storable.is_data_error`) is about the message, not the
                                 database, and would fail the same way on every retry
    database unavailable         the message stays unacked; the transaction is retried with
                                 backoff (the delivery count does not grow meanwhile)

Each message is its own transaction, so a refused one never holds back the others: it is
dead-lettered, and the consumer goes on (it does not keep a prefetch slot).

Effects are deliberately small. `batch.accepted.v1`: the jobs are already READY from the
acceptance transaction, so the effect is a NOTIFY to the claimers of the batch's pool (the pool
read from the batch row, never from the message). Terminal job events (`extraction.*.v1`) are
only recorded: the inbox is the durable event log that readers such as a batch-status refresher
can consume. No effect ever touches a job's state, so a redelivered or forged event can never
reset a RUNNING or finished job.

A consumer killed after commit but before its ack gets the message again (`redelivered`): the
inbox row makes that a no-op. Failpoint: `ingress.after_commit_before_ack`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging

import aio_pika
import aio_pika.abc
import asyncpg

from lading import failpoints, looping, metrics, storable, tracing
from lading.db import outbox
from lading.events import messages, topology
from lading.settings import EventSettings
from lading_worker.relaying import BROKER_ERRORS, DATABASE_ERRORS

logger = logging.getLogger(__name__)

RECORDED, DUPLICATE, QUARANTINED, REJECTED = "recorded", "duplicate", "quarantined", "rejected"


@dataclasses.dataclass
class IngressCounts:
    """What this consumer did since it started (also exported as lading_inbox_messages_total)."""

    recorded: int = 0
    duplicate: int = 0
    quarantined: int = 0
    rejected: int = 0
    redelivered: int = 0

    def add(self, outcome: str) -> None:
        setattr(self, outcome, getattr(self, outcome) + 1)
        metrics.INBOX_MESSAGES.labels(outcome=outcome).inc()


class IngressConsumer:
    def __init__(
            self,
            db: asyncpg.Pool,
            *,
            amqp_url: str,
            settings: EventSettings,
    ) -> None:
        self._db = db
        self._url = amqp_url
        self.settings = settings
        self.counts = IngressCounts()
        self.consuming = asyncio.Event()
        """Set while a consumer is registered on the queue (tests wait on it)."""
        self._handlers: set[asyncio.Task[None]] = set()
        self._stop = asyncio.Event()
        self._transactions = asyncio.Semaphore(settings.ingress.db_concurrency)

    def __repr__(self) -> str:  # never the URL: it carries a password
        return "<IngressConsumer>"

    async def record(self, event: messages.Event) -> str:
        """Record one event and apply its effect in one transaction; the outcome."""
        batch_id = event.payload.get("batch_id")
        if not isinstance(batch_id, int):
            return await self._record(event)
        with tracing.span("lading.ingress", batch_id=batch_id, attributes={
            "event_id": str(event.event_id), "event_type": event.type, "job_id": event.payload.get("job_id"),
        }):
            return await self._record(event)

    async def _record(self, event: messages.Event) -> str:
        async with self._transactions, self._db.acquire() as conn, conn.transaction():
            inserted = await outbox.inbox_record(
                conn, event_id=event.event_id, type=event.type, digest=event.digest, payload=event.payload
            )
            if inserted:
                await self._apply(conn, event)
                return RECORDED
            first = await outbox.inbox_digest(conn, event_id=event.event_id)
            if first == event.digest:
                return DUPLICATE
            if await outbox.quarantine(
                conn, event_id=event.event_id, digest=event.digest, first_digest=first or "", payload=event.payload
            ):
                logger.error(
                    "ALARM: event %s (%s) was delivered again with a different payload (digest %s…, first %s…); "
                    "kept in inbox_quarantine, not applied",
                    event.event_id, event.type, event.digest[:12], (first or "")[:12],
                )  # fmt: skip
            return QUARANTINED

    async def _apply(self, conn: asyncpg.Connection, event: messages.Event) -> None:
        if event.type == messages.BATCH_ACCEPTED:
            if not await outbox.wake_batch_pool(conn, batch_id=int(event.payload["batch_id"])):
                logger.warning("Event %s names batch %s, which is not in the database", event.event_id,
                               event.payload["batch_id"])  # fmt: skip

    async def handle(self, message: aio_pika.abc.AbstractIncomingMessage, stop: asyncio.Event) -> str:
        """Parse, record (retrying the database), ack; or reject to the dead-letter queue."""
        try:
            event = messages.parse(message)
        except messages.Unparseable as exc:
            return await self._dead_letter(message, str(exc))
        s = self.settings.ingress
        backoff = looping.Backoff(base_s=s.retry_base_s, cap_s=s.retry_cap_s)
        while True:
            try:
                outcome = await self.record(event)
                break
            except DATABASE_ERRORS as exc:
                if storable.is_data_error(exc):  # rolled back; the same message fails the same way every time
                    return await self._dead_letter(
                        message, f"event {event.event_id} ({event.type}) refused by PostgreSQL: {type(exc).__name__} "
                        f"(SQLSTATE {getattr(exc, 'sqlstate', '?')})",
                    )
                wait = backoff.failed()
                if stop.is_set():
                    raise
                logger.warning("Inbox transaction for event %s failed (attempt %d): %s",
                               event.event_id, backoff.failures, exc)  # fmt: skip
                await looping.wait_or_stop(stop, wait)
        await failpoints.ahit("ingress.after_commit_before_ack")
        await message.ack()
        if event.redelivered:
            self.counts.redelivered += 1
        self.counts.add(outcome)
        return outcome

    async def _dead_letter(self, message: aio_pika.abc.AbstractIncomingMessage, why: str) -> str:
        """Reject without requeue: the queue's dead-letter exchange keeps the message for a human."""
        logger.warning("Rejecting a message to the dead-letter queue: %s", why)
        await message.reject(requeue=False)
        self.counts.add(REJECTED)
        return REJECTED

    async def _on_message(self, message: aio_pika.abc.AbstractIncomingMessage) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            await self.handle(message, self._stop)
        except BROKER_ERRORS as exc:  # the ack could not be sent: the broker redelivers, the inbox dedups
            logger.warning("Could not settle a message with the broker; it will be redelivered: %s", exc)
        except DATABASE_ERRORS as exc:  # stopping while the database is away: left unacked
            logger.warning("Left a message unacked while stopping: %s", exc)
        finally:
            self._handlers.discard(task)

    async def run_forever(self, stop: asyncio.Event) -> None:
        s = self.settings.ingress
        backoff = looping.Backoff(base_s=s.reconnect_base_s, cap_s=s.reconnect_cap_s)
        while not stop.is_set():
            try:
                await self._consume_until_closed(stop)
                backoff.succeeded()
                if stop.is_set():
                    break
                raise ConnectionError("the broker closed the connection")
            except BROKER_ERRORS as exc:
                wait = backoff.failed()
                metrics.BROKER_RECONNECTS.labels(loop="ingress").inc()
                logger.warning("Ingress consumer lost the broker (attempt %d): %s",
                               backoff.failures, type(exc).__name__)  # fmt: skip
            await looping.wait_or_stop(stop, wait)

    async def _consume_until_closed(self, stop: asyncio.Event) -> None:
        connection = await aio_pika.connect(self._url, timeout=30)
        lost = asyncio.Event()  # set when the connection or the channel closes under us
        connection.close_callbacks.add(lambda _sender, _exc: lost.set())
        try:
            channel = await connection.channel()
            channel.close_callbacks.add(lambda _sender, _exc: lost.set())
            await channel.set_qos(prefetch_count=self.settings.ingress.prefetch)
            declared = await topology.declare(channel, self.settings.topology)
            self._stop = stop
            tag = await declared.ingress.consume(self._on_message, no_ack=False)
            self.consuming.set()
            stopped = asyncio.ensure_future(stop.wait())
            closed = asyncio.ensure_future(lost.wait())
            try:
                await asyncio.wait([stopped, closed], return_when=asyncio.FIRST_COMPLETED)
            finally:
                stopped.cancel()
                closed.cancel()
            self.consuming.clear()
            if not lost.is_set():
                await declared.ingress.cancel(tag)
                await self._drain()
        finally:
            self.consuming.clear()
            if not connection.is_closed:
                try:
                    await asyncio.wait_for(connection.close(), timeout=5)
                except BROKER_ERRORS as exc:
                    logger.debug("Closing the broker connection failed: %r", exc)
            await self._drain(cancel=True)

    async def _drain(self, *, cancel: bool = False) -> None:
        """Let handlers in progress finish (they commit, then ack); cancel them if the channel is gone."""
        handlers = list(self._handlers)
        if not handlers:
            return
        if cancel:
            for task in handlers:
                task.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)
