"""
The inbox transaction: one delivery, one transaction, answered only after it commits.

    BEGIN
      INSERT erp_inbox (delivery id, sha256 of the body) ON CONFLICT DO NOTHING
        ├─ conflict: the id was committed before (a concurrent twin is waited for by the
        │            INSERT itself). Same digest -> the stored answer, nothing written;
        │            other digest -> DeliveryConflict (409), nothing written.
        └─ claimed:  adapter.apply(...)  -- the ERP effect, deduplicated by business intent
                     UPDATE erp_inbox SET status, reference
    COMMIT

The inbox row and the ERP effect commit together or not at all, so a delivery whose answer
was lost (timeout after commit) is recognised when it comes again, and one whose transaction
failed is simply applied on the next try. Races are decided by unique keys, never by reading
first.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Literal

import asyncpg

from lading import errors, failpoints
from lading.webhooks import payload
from lading_webhook_receiver import adapters, metrics, queries

Status = Literal["accepted", "duplicate"]


class DeliveryConflict(errors.PermanentError):
    """This delivery id was received before with a different body. Nothing was changed.

    Holds digests only (never a body): they identify the two versions in logs.
    """

    def __init__(self, *, delivery_id: str, stored_sha256: bytes, new_sha256: bytes) -> None:
        super().__init__(
            f"delivery {delivery_id!r} was received before with a different body "
            f"(stored sha256 {stored_sha256.hex()[:16]}…, this one {new_sha256.hex()[:16]}…); nothing was changed"
        )
        self.delivery_id = delivery_id


@dataclasses.dataclass(frozen=True)
class Answer:
    status: Status
    reference: str
    outcome: str
    """One of metrics.OUTCOMES."""

    def body(self) -> dict[str, str]:
        return {"status": self.status, "reference": self.reference}


async def receive(
        pool: asyncpg.Pool,
        *,
        delivery_id: str,
        sha256: bytes,
        event: payload.CompletedEvent,
        adapter: adapters.ErpAdapter[Any],
        operation: Any,
        timeout_s: float,
        observe: metrics.ReceiverMetrics | None = None,
) -> Answer:
    """Record one delivery and apply its effect in one transaction; return the answer to give.

    Raises DeliveryConflict, or the database's own errors (connection lost, timeout) when
    nothing is known to be committed: the caller answers 503 and the sender retries.
    """
    async with pool.acquire(timeout=timeout_s) as conn:
        started = time.monotonic()
        async with conn.transaction():
            claimed = await conn.fetchval(
                queries.ERP_INBOX_CLAIM, delivery_id, sha256, event.type, adapter.name, timeout=timeout_s
            )
            if claimed is None:
                return await _replayed(conn, delivery_id=delivery_id, sha256=sha256, timeout_s=timeout_s)
            effect = await adapter.apply(conn, operation=operation, delivery_id=delivery_id)
            status: Status = "accepted" if effect.created else "duplicate"
            await conn.execute(
                queries.ERP_INBOX_RECORD_ANSWER, delivery_id, status, effect.reference, timeout=timeout_s
            )
            await failpoints.ahit("receiver.before_commit")
        if observe is not None:
            observe.transaction_seconds.observe(time.monotonic() - started)
    outcome = metrics.ACCEPTED if effect.created else metrics.DUPLICATE_INTENT
    return Answer(status=status, reference=effect.reference, outcome=outcome)


async def _replayed(conn: asyncpg.Connection, *, delivery_id: str, sha256: bytes, timeout_s: float) -> Answer:
    # A new statement: under READ COMMITTED it sees the row whose commit the INSERT waited for.
    row = await conn.fetchrow(queries.ERP_INBOX_GET, delivery_id, timeout=timeout_s)
    if row is None or row["reference"] is None:  # deleted by retention between the two statements
        raise asyncpg.exceptions.SerializationError("inbox row changed concurrently; retry")
    stored = bytes(row["payload_sha256"])
    if stored != sha256:
        raise DeliveryConflict(delivery_id=delivery_id, stored_sha256=stored, new_sha256=sha256)
    return Answer(status="duplicate", reference=row["reference"], outcome=metrics.DUPLICATE_DELIVERY)


async def count_by_status(conn: asyncpg.Connection) -> dict[str, int]:
    """Inbox rows by the answer given: {"accepted": n, "duplicate": m} (duplicate = duplicate intent)."""
    return {row["status"]: int(row["n"]) for row in await conn.fetch(queries.ERP_INBOX_COUNT_BY_STATUS)}


async def delete_expired(conn: asyncpg.Connection, *, older_than_s: float, limit: int) -> int:
    """Delete at most `limit` answered rows received more than `older_than_s` seconds ago (the
    database's clock), oldest first; how many went. The caller bounds `older_than_s` below by the
    dedup window (`settings.ReceiverSettings`)."""
    return int(await conn.fetchval(queries.ERP_INBOX_DELETE_EXPIRED, older_than_s, limit))


async def oldest_age_s(conn: asyncpg.Connection) -> float | None:
    """Age in seconds of the oldest inbox row; None when the inbox is empty."""
    age: float | None = await conn.fetchval(queries.ERP_INBOX_OLDEST_AGE)
    return age
