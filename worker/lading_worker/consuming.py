"""
The ingress consumer: the queue intake of single documents, and the durable inbox
(`execution_inbox`) of every message it takes.

For each message, in ONE transaction: insert the inbox row keyed by `event_id` (the message id,
unique) with the payload digest, and apply the message's effect; ack only after that commit.

    document.submitted.v1        the document accepted (`lading.intake`, the HTTP API's
                                 acceptance path), job and inbox row in one commit, ack
    Lading's own events          only recorded: the inbox is the durable event log
    same id, same digest         nothing (a redelivery, or a producer that resent), ack
    same id, other digest        quarantined (inbox_quarantine) and alarmed, never applied, ack
    not an event (messages.py)   dead-lettered, the reason in the header `lading-dead-letter-reason`
    a document refused           dead-lettered with the reason (invalid field, no quota, pool not
                                 allowed, idempotency key used for another document, ...); the
                                 transaction rolled back, so nothing of it was accepted
    refused by PostgreSQL        dead-lettered: a data error (`storable.is_data_error`) is about the
                                 message, not the database, and would fail the same way every time
    database unavailable,        the message stays unacked; the transaction is retried with
    the same key being accepted, backoff (the delivery count does not grow meanwhile): the queue
    the tenant's queue full      is the buffer, and a full quota is backpressure, not a refusal

Dead-lettering publishes a copy of the message, with the reason in headers, to the dead-letter
exchange (publisher confirms), then acks the original; if that publish fails, the message is
rejected without requeue and the broker dead-letters it (its `x-death` header says `rejected`).
Each message is its own transaction, so a refused one never holds back the others.

The namespace of a `document.submitted.v1` is its tenant identity, and it comes from the message
body: it is trusted only as far as the broker's permissions go (who may publish to the ingress
queue may submit for any namespace), see docs/security.md.

A consumer killed after commit but before its ack gets the message again (`redelivered`): the
inbox row makes that a no-op, and the document's idempotency key would too. Failpoint:
`ingress.after_commit_before_ack`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging

import aio_pika
import aio_pika.abc
import asyncpg

from lading import applying, errors, failpoints, intake, looping, metrics, reasons, storable, tracing
from lading.db import outbox
from lading.events import messages, topology
from lading.settings import EventSettings
from lading_worker.relaying import BROKER_ERRORS, DATABASE_ERRORS

logger = logging.getLogger(__name__)

RECORDED, DUPLICATE, QUARANTINED, REJECTED = "recorded", "duplicate", "quarantined", "rejected"
ACCEPTED = "accepted"
"""A document.submitted.v1 whose document was accepted (or replayed under its idempotency key)."""
REASON_HEADER = "lading-dead-letter-reason"
"""Why a message was dead-lettered, in words: the field or rule, never a document's text."""
CODE_HEADER = "lading-dead-letter-code"
"""The same as a CamelCase code: Unparseable, Unstorable, IdempotencyMismatch or an admission reason."""
REASON_MAX = 1000
"""Characters of the reason kept in the header (a document with many field errors)."""


@dataclasses.dataclass
class IngressCounts:
    """What this consumer did since it started (also exported as lading_inbox_messages_total)."""

    recorded: int = 0
    accepted: int = 0
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
        self._dead_letter_exchange: aio_pika.abc.AbstractExchange | None = None

    def __repr__(self) -> str:  # never the URL: it carries a password
        return "<IngressConsumer>"

    async def record(self, event: messages.Event, document: _Document | None = None) -> str:
        """Record one event and apply its effect (a document's acceptance) in one transaction; the
        outcome. Raises what `intake.submit_validated` raises for a document."""
        batch_id = event.payload.get("batch_id")
        if not isinstance(batch_id, int):
            return await self._record(event, document)
        with tracing.span("lading.ingress", batch_id=batch_id, attributes={
            "event_id": str(event.event_id), "event_type": event.type, "job_id": event.payload.get("job_id"),
        }):
            return await self._record(event, document)

    async def _record(self, event: messages.Event, document: _Document | None) -> str:
        # A document's text stays out of the inbox: it keeps who sent which document.
        payload = event.payload if document is None else document.submitted.inbox_payload()
        async with self._transactions, self._db.acquire() as conn, conn.transaction():
            inserted = await outbox.inbox_record(
                conn, event_id=event.event_id, type=event.type, digest=event.digest, payload=payload
            )
            if inserted and document is not None:
                await intake.submit_validated(
                    conn, namespace=document.submitted.namespace, request=document.request,
                    idempotency_key=document.submitted.idempotency_key,
                    request_digest=intake.request_digest(document.request),
                )  # fmt: skip
                return ACCEPTED
            if inserted:
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

    async def handle(self, message: aio_pika.abc.AbstractIncomingMessage, stop: asyncio.Event) -> str:
        """Parse, record (retrying the database), ack; or dead-letter with the reason."""
        try:
            event = messages.parse(message)
            document = _document(event)
        except messages.Unparseable as exc:
            return await self._dead_letter(message, str(exc), code="Unparseable")
        except applying.AdmissionRejected as exc:
            return await self._dead_letter(message, _refusal(event, exc), code=exc.reason)
        s = self.settings.ingress
        backoff = looping.Backoff(base_s=s.retry_base_s, cap_s=s.retry_cap_s)
        while True:
            try:
                outcome = await self.record(event, document)
                break
            except applying.AdmissionRejected as exc:
                if exc.reason != reasons.QUOTA_EXCEEDED:
                    return await self._dead_letter(message, _refusal(event, exc), code=exc.reason)
                wait = backoff.failed()  # backpressure: the document waits in the queue for room
                if stop.is_set():
                    raise _LeftUnacked(f"tenant queue full: {exc}") from None
                logger.info("Document of event %s waits for room in its tenant's queue (attempt %d): %s",
                            event.event_id, backoff.failures, exc)  # fmt: skip
                await looping.wait_or_stop(stop, wait)
                continue
            except intake.IdempotencyMismatch as exc:
                return await self._dead_letter(message, _refusal(event, exc), code="IdempotencyMismatch")
            except errors.AcceptanceInProgress as exc:
                wait = backoff.failed()
                if stop.is_set():
                    raise _LeftUnacked(str(exc)) from None
                await looping.wait_or_stop(stop, wait)
                continue
            except DATABASE_ERRORS as exc:
                if storable.is_data_error(exc):  # rolled back; the same message fails the same way every time
                    return await self._dead_letter(
                        message, f"event {event.event_id} ({event.type}) refused by PostgreSQL: {type(exc).__name__} "
                        f"(SQLSTATE {getattr(exc, 'sqlstate', '?')})", code="Unstorable",
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

    async def _dead_letter(self, message: aio_pika.abc.AbstractIncomingMessage, why: str, *, code: str) -> str:
        """Keep the message for a human in the dead-letter queue, with the reason in its headers:
        a copy published there (confirmed) and the original acked; failing that, the original
        rejected without requeue, which the broker dead-letters (x-death says `rejected`)."""
        logger.warning("Dead-lettering a message (%s): %s", code, why)
        exchange = self._dead_letter_exchange
        published = False
        if exchange is not None:
            headers = {**(message.headers or {}), REASON_HEADER: why[:REASON_MAX], CODE_HEADER: code}
            copy = aio_pika.Message(
                body=message.body, headers=headers,
                message_id=message.message_id, type=message.type, content_type=message.content_type,
                timestamp=message.timestamp, delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            )  # fmt: skip
            try:
                await exchange.publish(copy, routing_key=message.routing_key or "")
                published = True
            except _DEAD_LETTER_PUBLISH_ERRORS as exc:
                logger.warning("Could not publish the dead letter with its reason; rejecting instead: %r", exc)
        if published:
            await message.ack()
        else:
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
        except _UNACKED_ON_STOP as exc:  # stopping while it cannot commit: left unacked
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
            self._dead_letter_exchange = declared.dead_letter_exchange
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


class _LeftUnacked(Exception):
    """Stopping while a message still cannot be committed (its document waits): it stays unacked."""


@dataclasses.dataclass(frozen=True)
class _Document:
    """A `document.submitted.v1`'s document, its fields validated."""

    submitted: messages.Submitted
    request: intake.DocumentRequest


def _document(event: messages.Event) -> _Document | None:
    """The validated document of a `document.submitted.v1` (None for other events); raises
    applying.InvalidDocument naming every field error."""
    if event.type != messages.DOCUMENT_SUBMITTED:
        return None
    submitted = messages.submitted(event)
    request = intake.validated(
        submitted.document, namespace=submitted.namespace, idempotency_key=submitted.idempotency_key
    )
    return _Document(submitted=submitted, request=request)


def _refusal(event: messages.Event, exc: Exception) -> str:
    return f"event {event.event_id} ({event.type}) refused: {exc}"


_DEAD_LETTER_PUBLISH_ERRORS: tuple[type[Exception], ...] = (*BROKER_ERRORS, aio_pika.exceptions.DeliveryError)
_UNACKED_ON_STOP: tuple[type[Exception], ...] = (*DATABASE_ERRORS, _LeftUnacked)
