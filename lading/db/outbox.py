"""
Repository of the outbox relay and the broker ingress inbox: one function per query in
`sql/outbox.sql`.

The relay's cycle is claim (one statement, committed) -> publish outside any transaction ->
mark published or release. The inbox functions run inside the caller's transaction, so the
record and its effect commit together. A job's events and the unpublished backlog are read here
for `lading jobs show` and `lading status`.
"""

from __future__ import annotations

import dataclasses
import datetime
import uuid
from collections.abc import Sequence
from typing import Any

import asyncpg

from lading.db import backlogs, queries
from lading.ids import JobId


@dataclasses.dataclass(frozen=True)
class OutboxEvent:
    """One claimed outbox row, as the relay publishes it."""

    id: int
    event_id: uuid.UUID
    aggregate_type: str
    aggregate_id: int
    type: str
    payload: Any
    created_at: datetime.datetime


async def insert_batch_accepted(conn: asyncpg.Connection, *, batch_id: int, payload: dict[str, Any]) -> None:
    """The `batch.accepted.v1` event of a batch, in the accepting transaction."""
    await conn.execute(queries.sql("outbox_insert_batch_accepted"), batch_id, payload)


async def claim_batch(
        conn: asyncpg.Connection | asyncpg.Pool,
        *,
        owner: str,
        limit: int,
        ttl_s: float,
) -> list[OutboxEvent]:
    """Claim up to `limit` unpublished events for `ttl_s` seconds (SKIP LOCKED), oldest first."""
    rows = await conn.fetch(queries.sql("outbox_claim_batch"), owner, limit, float(ttl_s))
    events = [
        OutboxEvent(
            id=r["id"],
            event_id=r["event_id"],
            aggregate_type=r["aggregate_type"],
            aggregate_id=r["aggregate_id"],
            type=r["type"],
            payload=r["payload"],
            created_at=r["created_at"],
        )
        for r in rows
    ]
    events.sort(key=lambda e: e.id)
    return events


async def mark_published(conn: asyncpg.Connection | asyncpg.Pool, *, ids: Sequence[int], owner: str) -> int:
    """Mark confirmed events published if `owner` still holds their claim; how many were marked."""
    if not ids:
        return 0
    rows = await conn.fetch(queries.sql("outbox_mark_published"), list(ids), owner)
    return len(rows)


async def release(
        conn: asyncpg.Connection | asyncpg.Pool,
        *,
        ids: Sequence[int],
        owner: str,
        after_s: float,
) -> int:
    """Give unconfirmed events back to any relay after `after_s` seconds; how many were released."""
    if not ids:
        return 0
    rows = await conn.fetch(queries.sql("outbox_release"), list(ids), owner, float(after_s))
    return len(rows)


async def set_aside(
        conn: asyncpg.Connection | asyncpg.Pool,
        *,
        id: int,
        owner: str,
        error_class: str,
        error: str,
) -> bool:
    """Set event `id` aside for good (never claimed again) while `owner` holds its claim; False
    when another relay took it over meanwhile."""
    row = await conn.fetchrow(queries.sql("outbox_set_aside"), id, owner, error_class, error)
    return row is not None


async def oldest_unpublished_age(conn: asyncpg.Connection | asyncpg.Pool) -> float | None:
    """Seconds the oldest unpublished event has waited, or None when everything is published."""
    age: float | None = await conn.fetchval(queries.sql("outbox_oldest_unpublished"))
    return age


async def inbox_record(
        conn: asyncpg.Connection,
        *,
        event_id: uuid.UUID,
        type: str,
        digest: str,
        payload: Any,
) -> bool:
    """Record an event in the inbox; False when its id was already recorded (nothing changed)."""
    inserted = await conn.fetchval(queries.sql("inbox_record"), event_id, type, digest, payload)
    return inserted is not None


async def inbox_digest(conn: asyncpg.Connection, *, event_id: uuid.UUID) -> str | None:
    """The digest recorded for `event_id`, or None if it is not in the inbox."""
    digest: str | None = await conn.fetchval(queries.sql("inbox_digest"), event_id)
    return digest


async def quarantine(
        conn: asyncpg.Connection,
        *,
        event_id: uuid.UUID,
        digest: str,
        first_digest: str,
        payload: Any,
) -> bool:
    """Keep a conflicting redelivery for an operator; False when this (id, digest) was already kept."""
    inserted = await conn.fetchval(queries.sql("inbox_quarantine_insert"), event_id, digest, first_digest, payload)
    return inserted is not None


@dataclasses.dataclass(frozen=True)
class BacklogSummary:
    unpublished: int
    """Events waiting for the relay."""
    oldest_age_s: float
    """Age of the oldest of them; 0 when none."""
    set_aside: int
    """Events set aside as unstorable: they wait for a human, not for the relay."""


async def backlog_summary(conn: asyncpg.Connection) -> BacklogSummary:
    row = await conn.fetchrow(queries.sql("outbox_backlog_summary"))
    assert row is not None  # an aggregate without GROUP BY: always one row
    return BacklogSummary(
        unpublished=int(row["unpublished"]), oldest_age_s=float(row["oldest_age_s"]), set_aside=int(row["set_aside"])
    )


# Reads for people (`lading jobs`, `lading status`, review and redelivery screens): the `*_report`
# queries, ages by the database clock (`now()`, the caller's transaction), never the document text
# unless asked for by name.
EVENTS_LIMIT = 100
"""Outbox events shown for one job (a job writes one per settling state change: a handful)."""


@dataclasses.dataclass(frozen=True)
class EventSummary:
    """One outbox event of a job, as `lading jobs show` lists it."""

    id: int
    event_id: uuid.UUID
    type: str
    created_at: datetime.datetime
    published_at: datetime.datetime | None


async def events_of(conn: asyncpg.Connection, *, job_id: JobId, limit: int = EVENTS_LIMIT) -> list[EventSummary]:
    """The outbox events the job's state changes wrote, oldest first."""
    rows = await conn.fetch(queries.sql("outbox_list_report"), job_id, limit)
    return [
        EventSummary(
            id=r["id"],
            event_id=r["event_id"],
            type=r["type"],
            created_at=r["created_at"],
            published_at=r["published_at"],
        )
        for r in rows
    ]


async def outbox_backlog(conn: asyncpg.Connection) -> backlogs.Backlog:
    """Outbox events not yet published, and how long the oldest has waited for the relay."""
    r = await conn.fetchrow(queries.sql("outbox_backlog_report"))
    assert r is not None, "a SELECT without FROM returns one row"
    return backlogs.Backlog(
        size=r["unpublished"], oldest_at=r["oldest_at"], oldest_age_s=backlogs.age(r["oldest_age_s"])
    )
