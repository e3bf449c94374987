"""Rows and messages the event tests share."""

from __future__ import annotations

import uuid
from typing import Any

import aio_pika
import aio_pika.abc
import asyncpg


async def add_event(
        db: asyncpg.Connection,
        *,
        type: str = "extraction.completed.v1",
        payload: dict[str, Any] | None = None,
        aggregate_id: int = 1,
) -> uuid.UUID:
    event_id: uuid.UUID = await db.fetchval(
        "INSERT INTO outbox_events (event_id, aggregate_type, aggregate_id, type, payload)"
        " VALUES (gen_random_uuid(), 'job', $1, $2, $3) RETURNING event_id",
        aggregate_id, type, payload if payload is not None else {"job_id": aggregate_id, "tenant": "acme"},
    )  # fmt: skip
    return event_id


async def unpublished(db: asyncpg.Connection) -> int:
    return int(await db.fetchval("SELECT count(*) FROM outbox_events WHERE published_at IS NULL"))


async def drain(
        channel: aio_pika.abc.AbstractChannel,
        queue: str,
        *,
        limit: int = 10_000,
) -> list[aio_pika.abc.AbstractIncomingMessage]:
    """Every message ready in `queue`, acked."""
    q = await channel.declare_queue(queue, passive=True)
    got: list[aio_pika.abc.AbstractIncomingMessage] = []
    while len(got) < limit:
        message = await q.get(fail=False, no_ack=True)
        if message is None:
            break
        got.append(message)
    return got
