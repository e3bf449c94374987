"""
The wire format without a broker: what the relay sends, what the ingress accepts, and the
error that names what is wrong with a message that is not an event.
"""

from __future__ import annotations

import datetime
import uuid
from typing import Any

import aio_pika
import aiormq.abc
import pytest
from pamqp import commands as spec
from pamqp.header import ContentHeader

from lading import looping
from lading.db import outbox
from lading.events import messages


def _incoming(body: bytes, *, message_id: str | None, type: str | None = "extraction.completed.v1",
              redelivered: bool = False) -> aio_pika.IncomingMessage:  # fmt: skip
    delivered = aiormq.abc.DeliveredMessage(
        delivery=spec.Basic.Deliver(consumer_tag="t", delivery_tag=1, redelivered=redelivered,
                                    exchange="lading.events", routing_key=type or "x.v1"),
        header=ContentHeader(properties=spec.Basic.Properties(message_id=message_id, message_type=type)),
        body=body,
        channel=None,  # type: ignore[arg-type]
    )  # fmt: skip
    return aio_pika.IncomingMessage(delivered, no_ack=True)


def test_an_outbox_row_becomes_a_persistent_traceable_message() -> None:
    event = outbox.OutboxEvent(
        id=1, event_id=uuid.uuid4(), aggregate_type="job", aggregate_id=42, type="extraction.completed.v1",
        payload={"job_id": 42, "batch_id": 7, "tenant": "acme", "document_key": "inv-1"},
        created_at=datetime.datetime.now(datetime.UTC),
    )  # fmt: skip
    message = messages.to_message(event)
    assert message.message_id == str(event.event_id)
    assert message.type == "extraction.completed.v1"
    assert message.delivery_mode == aio_pika.DeliveryMode.PERSISTENT
    assert message.content_type == "application/json"
    assert message.headers == {
        "lading-aggregate": "job/42", "lading-job-id": 42, "lading-batch-id": 7, "lading-tenant": "acme"
    }  # fmt: skip


def test_the_digest_ignores_key_order_but_not_values_or_type() -> None:
    a = messages.digest(type="extraction.completed.v1", payload={"job_id": 1, "state": "SUCCEEDED"})
    assert a == messages.digest(type="extraction.completed.v1", payload={"state": "SUCCEEDED", "job_id": 1})
    assert a != messages.digest(type="extraction.completed.v1", payload={"job_id": 1, "state": "FAILED_TERMINAL"})
    assert a != messages.digest(type="extraction.failed.v1", payload={"job_id": 1, "state": "SUCCEEDED"})


def test_a_valid_message_parses_into_an_event() -> None:
    event_id = uuid.uuid4()
    event = messages.parse(_incoming(b'{"job_id": 3}', message_id=str(event_id), redelivered=True))
    assert (event.event_id, event.type, event.payload, event.redelivered) == (
        event_id, "extraction.completed.v1", {"job_id": 3}, True
    )  # fmt: skip


@pytest.mark.parametrize(
    ("body", "message_id", "type", "says"),
    [
        (b'{"job_id": 3}', None, "extraction.completed.v1", "no message_id"),
        (b'{"job_id": 3}', "42", "extraction.completed.v1", "'42' is not a UUID"),
        (b'{"job_id": 3}', str(uuid.UUID(int=1)), "Completed", "not a versioned event type"),
        (b"{oops", str(uuid.UUID(int=1)), "extraction.completed.v1", "body is not JSON"),
        (b'"text"', str(uuid.UUID(int=1)), "extraction.completed.v1", "JSON str, not an object"),
        (b'{"job_id": "3"}', str(uuid.UUID(int=1)), "extraction.completed.v1", "no positive integer 'job_id'"),
        (b'{"pool": "p"}', str(uuid.UUID(int=1)), "batch.accepted.v1", "no positive integer 'batch_id'"),
        (b"{" + b" " * messages.MAX_BODY_BYTES + b"}", str(uuid.UUID(int=1)), "x.v1", "the limit is"),
        # orjson read an integer past 64 bits as a float: recorded with its value changed.
        (b'{"job_id": 3, "fence": 18446744073709551616}', str(uuid.UUID(int=1)), "extraction.completed.v1",
         "body.fence: integer out of range"),
        (b'{"job_id": 3, "n": -1' + b"0" * 30 + b"}", str(uuid.UUID(int=1)), "x.v1", "body.n: integer out of range"),
        (b'{"job_id": 3, "n": NaN}', str(uuid.UUID(int=1)), "x.v1", "NaN is not JSON"),
        # Past orjson's 254 levels the digest raised TypeError: never recorded, never dead-lettered.
        (b'{"job_id": 3, "x": ' + b"[" * 300 + b"]" * 300 + b"}", str(uuid.UUID(int=1)), "extraction.completed.v1",
         "nested more than 64 levels deep"),
        (b'{"x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", str(uuid.UUID(int=1)), "x.v1", "nested more than 64"),
    ],
)
def test_a_message_that_is_not_an_event_is_refused_with_a_reason(
        body: bytes, message_id: str | None, type: str, says: str
) -> None:
    with pytest.raises(messages.Unparseable, match=says.replace("(", r"\(")):
        messages.parse(_incoming(body, message_id=message_id, type=type))


@pytest.mark.parametrize("failures", [1, 2, 5, 50])
def test_backoff_waits_are_jittered_and_capped(failures: int) -> None:
    waits: list[Any] = [looping.full_jitter(failures, base_s=0.5, cap_s=4.0) for _ in range(200)]
    assert all(0 <= w <= min(4.0, 0.5 * 2 ** (failures - 1)) for w in waits)
    assert len(set(waits)) > 1
