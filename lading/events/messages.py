"""
The wire format of events, both ways.

Out (relay): one persistent AMQP message per outbox row. `message_id` is the row's `event_id`
(the consumers' dedup key), `type` and the routing key are the event type, the body is the
payload as JSON, and headers carry the tenant, batch and job ids for tracing.

In (ingress): a message is an event only if it has a UUID `message_id`, a versioned type
(`batch.accepted.v1`) and a JSON object body of bounded size and nesting that PostgreSQL can store (no
U+0000 in a string or a key, no integer beyond 64 bits: the inbox keeps the payload as jsonb);
the types the ingress acts on must also carry the ids it needs (`document.submitted.v1`: its
namespace and idempotency key as strings, and no field a document does not have). Anything else is `Unparseable`
and goes to the dead-letter queue: retrying it could never succeed. The digest that decides
"same event" is over the type and the canonical payload (sorted keys), so it does not depend
on how a producer spaced or ordered its JSON.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import uuid
from typing import Any

import aio_pika
import aio_pika.abc
import orjson

from lading import errors, intake, storable
from lading.db import outbox

MAX_BODY_BYTES = 1 << 20
"""Largest event body the ingress accepts (1 MiB). Events carry ids and states, not documents."""
MAX_DEPTH = 64
"""Deepest nesting of arrays and objects in an event body. Events are a few levels deep; orjson,
which writes the digest and the inbox's jsonb, refuses past 254 levels (a TypeError, not a data
error), so a deeper body would never be recorded nor dead-lettered."""
BATCH_ACCEPTED = "batch.accepted.v1"
DOCUMENT_SUBMITTED = "document.submitted.v1"
"""A document sent to the queue intake (docs/events.md): the HTTP API's document fields, plus the
`namespace` and `idempotencyKey` the HTTP API takes from its path and header."""
DOCUMENT_FIELDS = (
    "key", "text", "uri", "sha256", "bytes", "inferencePoolRef", "deliveryEndpointRef", "priority", "deadlineSeconds",
)  # fmt: skip
SUBMISSION_FIELDS = ("namespace", "idempotencyKey", *DOCUMENT_FIELDS)
_TYPE = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)*\.v[0-9]+$")
_TRACE_HEADERS = {"tenant": "lading-tenant", "batch_id": "lading-batch-id", "job_id": "lading-job-id"}


class Unparseable(errors.PermanentError):
    """A broker message that is not a Lading event; the message says what was wrong."""


@dataclasses.dataclass(frozen=True)
class Event:
    """A validated incoming event."""

    event_id: uuid.UUID
    type: str
    payload: dict[str, Any]
    digest: str
    redelivered: bool = False


def digest(*, type: str, payload: Any) -> str:
    """sha256 over the type and the canonical JSON of the payload."""
    canonical = orjson.dumps({"type": type, "payload": payload}, option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(canonical).hexdigest()


def to_message(event: outbox.OutboxEvent) -> aio_pika.Message:
    """The persistent AMQP message for one outbox row."""
    headers: dict[str, Any] = {"lading-aggregate": f"{event.aggregate_type}/{event.aggregate_id}"}
    if isinstance(event.payload, dict):
        for key, header in _TRACE_HEADERS.items():
            value = event.payload.get(key)
            if isinstance(value, (str, int)) and not isinstance(value, bool):
                headers[header] = value
    return aio_pika.Message(
        body=orjson.dumps(event.payload),
        message_id=str(event.event_id),
        type=event.type,
        content_type="application/json",
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        timestamp=event.created_at,
        headers=headers,
    )


def parse(message: aio_pika.abc.AbstractIncomingMessage) -> Event:
    """The event a message carries, or `Unparseable` naming what is wrong with it."""
    if not message.message_id:
        raise Unparseable("message has no message_id (the event id)")
    try:
        event_id = uuid.UUID(message.message_id)
    except ValueError:
        raise Unparseable(f"message_id {message.message_id[:64]!r} is not a UUID") from None
    type_ = message.type or message.routing_key or ""
    if not _TYPE.match(type_) or len(type_) > 200:
        raise Unparseable(f"event type {type_[:64]!r} is not a versioned event type such as {BATCH_ACCEPTED!r}")
    if len(message.body) > MAX_BODY_BYTES:
        raise Unparseable(f"event {event_id} body is {len(message.body)} bytes; the limit is {MAX_BODY_BYTES}")
    try:
        payload = _loads(message.body)
    except RecursionError:
        raise Unparseable(f"event {event_id} body is nested more than {MAX_DEPTH} levels deep") from None
    except ValueError as exc:
        raise Unparseable(f"event {event_id} body is not JSON: {exc}") from None
    if not isinstance(payload, dict):
        raise Unparseable(f"event {event_id} body is JSON {type(payload).__name__}, not an object")
    if _depth(payload) > MAX_DEPTH:
        raise Unparseable(f"event {event_id} body is nested more than {MAX_DEPTH} levels deep")
    reason = storable.unstorable_reason(payload, where="body")
    if reason is not None:
        raise Unparseable(f"event {event_id} cannot be stored: {reason}")
    _require_ids(event_id, type_, payload)
    return Event(
        event_id=event_id,
        type=type_,
        payload=payload,
        digest=digest(type=type_, payload=payload),
        redelivered=bool(message.redelivered),
    )


def _loads(body: bytes) -> Any:
    """Strict JSON, integers kept exact. Not orjson: it reads an integer past 64 bits as a float,
    silently changing the value instead of letting the storable check refuse it."""
    return json.loads(body.decode("utf-8"), parse_constant=_reject_constant)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _depth(value: Any) -> int:
    """How deeply arrays and objects nest in `value` (a scalar is 0); iterative, whatever the depth."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            item = list(item.values())
        if isinstance(item, list):
            deepest = max(deepest, depth + 1)
            stack.extend((child, depth + 1) for child in item)
    return deepest


def _require_ids(event_id: uuid.UUID, type_: str, payload: dict[str, Any]) -> None:
    if type_ == DOCUMENT_SUBMITTED:
        for key in ("namespace", "idempotencyKey"):
            if not isinstance(payload.get(key), str):
                raise Unparseable(f"event {event_id} of type {type_} has no string {key!r}")
        if unknown := sorted(set(payload) - set(SUBMISSION_FIELDS)):
            raise Unparseable(f"event {event_id} of type {type_} has unknown fields {', '.join(unknown)[:200]} "
                              f"(a document has {', '.join(SUBMISSION_FIELDS)})")  # fmt: skip
        return
    needed = ("batch_id",) if type_ == BATCH_ACCEPTED else ("job_id",) if type_.startswith("extraction.") else ()
    for key in needed:
        value = payload.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise Unparseable(f"event {event_id} of type {type_} has no positive integer {key!r}")


@dataclasses.dataclass(frozen=True)
class Submitted:
    """What a `document.submitted.v1` event asks for, not validated yet (`lading.intake` does)."""

    namespace: str
    idempotency_key: str
    document: intake.SubmittedDocument

    def inbox_payload(self, *, job_id: int | None = None) -> dict[str, Any]:
        """What the inbox keeps of the event: who sent which document, never its text."""
        d = self.document
        text_sha256 = hashlib.sha256(d.text.encode("utf-8", "replace")).hexdigest() if isinstance(d.text, str) else None
        return {
            "namespace": self.namespace, "idempotencyKey": self.idempotency_key, "key": d.key,
            "sha256": d.sha256 if d.sha256 is not None else text_sha256, "job_id": job_id,
        }  # fmt: skip


def submitted(event: Event) -> Submitted:
    """The document a `document.submitted.v1` event carries (its fields as sent)."""
    body = event.payload
    return Submitted(
        namespace=body["namespace"],
        idempotency_key=body["idempotencyKey"],
        # As sent, any JSON type: a missing or mistyped field is named by the intake's validation.
        document=intake.SubmittedDocument(**{
            name: body.get(field) for name, field in zip(_DOCUMENT_ATTRIBUTES, DOCUMENT_FIELDS, strict=True)
        }),  # type: ignore[arg-type]
    )


_DOCUMENT_ATTRIBUTES = tuple(f.name for f in dataclasses.fields(intake.SubmittedDocument))
"""SubmittedDocument's attributes, in the order of DOCUMENT_FIELDS."""
