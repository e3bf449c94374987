"""
The inbox transaction: deliveries are recorded with their ERP effects in one transaction, each
answered only after the commit that holds it.

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

Group commit (`GroupCommitter`, what the HTTP handler uses): deliveries that arrive while the
receiver's transactions are busy are collected and recorded together, the same steps set-based
(claim the ids, apply the effects, record the answers: a few statements and one durable commit
for the whole group). The window adapts by itself: a delivery that arrives while fewer than
`commit_groups` transactions run starts its own at once (no waiting when idle); under load the
next group is whatever arrived while the running ones committed, up to `commit_group_max`.
Within a group:

    the same id twice        the first is recorded; the others are answered after its commit as
                             a redelivery would be (same body: its answer, as a duplicate; another
                             body: DeliveryConflict), or are written in a following transaction
                             of the same group if the first was not recorded
    the same intent twice    the first books it, the others are duplicates with its reference
    a data error             the group is split until each unstorable delivery is alone (it
                             fails, 400); every other delivery commits
    a lost connection,       every delivery of the group fails (503; nothing is known to be
      any other error        committed, the sender retries and the inbox dedups)

Rows are locked in one order in every group (inbox ids sorted, then intent keys sorted), so
concurrent groups never deadlock by design; a deadlock or serialization failure all the same
reruns the group's transaction.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any, Literal

import asyncpg

from lading import errors, failpoints, grouping, storable
from lading.db import conflicts
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


@dataclasses.dataclass(eq=False)
class _Pending:
    """One delivery waiting for its group's commit (compared and hashed by identity: copies of one
    delivery are distinct items of a group)."""

    delivery_id: str
    sha256: bytes
    event_type: str
    operation: Any


class GroupCommitter:
    """Records deliveries in groups: `await receive(...)` returns the delivery's answer once the
    transaction holding it has committed (see the module). The grouping is `lading.grouping`'s;
    what a group does with copies of one delivery is decided here."""

    def __init__(
            self,
            pool: asyncpg.Pool,
            *,
            adapter: adapters.ErpAdapter[Any],
            timeout_s: float,
            groups: int = 4,
            group_max: int = 256,
            observe: metrics.ReceiverMetrics | None = None,
    ) -> None:
        if groups < 1 or group_max < 1:
            raise ValueError(f"need at least one group of at least one delivery, got {groups} and {group_max}")
        self.pool = pool
        self.adapter = adapter
        self.timeout_s = timeout_s
        self.observe = observe
        # Every _Pending is its own identity: copies of one delivery id share a group, and _commit
        # answers the later copies from the first one's commit rather than from a later group.
        self._groups: grouping.Groups[_Pending, Answer] = grouping.Groups(
            self._commit, identity=lambda pending: pending, max_items=group_max, concurrency=groups
        )

    @property
    def queued(self) -> int:
        """Deliveries waiting for a group transaction to start (all of them run)."""
        return self._groups.waiting

    async def receive(self, *, delivery_id: str, sha256: bytes, event_type: str, operation: Any) -> Answer:
        """Record one delivery and apply its effect; the answer to give, after the commit.

        Raises DeliveryConflict, a data error of this delivery alone (asyncpg's, nothing recorded),
        or the database's own errors (connection lost, timeout) when nothing is known to be
        committed: the caller answers 503 and the sender retries."""
        return await self._groups.run(_Pending(delivery_id, sha256, event_type, operation))

    async def _commit(self, group: Sequence[_Pending]) -> list[Answer | Exception]:
        """Every delivery's outcome: the first copy of each id is written (one transaction, split
        only around data errors); a later copy is answered as a redelivery of the first, or is
        written in a following transaction when the first was not recorded."""
        if self.observe is not None:
            self.observe.group_size.observe(len(group))
        outcomes: dict[_Pending, Answer | Exception] = {}
        remaining = list(group)
        while remaining:
            leaders: dict[str, _Pending] = {}
            followers: list[_Pending] = []
            for pending in remaining:
                if pending.delivery_id in leaders:
                    followers.append(pending)
                else:
                    leaders[pending.delivery_id] = pending
            try:
                isolated = await storable.isolate(
                    sorted(leaders.values(), key=lambda p: p.delivery_id), self._write_retrying
                )
            except Exception as exc:  # nothing of this transaction is known to be committed
                outcomes.update((pending, exc) for pending in remaining)
                break
            for answers in isolated.results:
                outcomes.update(answers)
            outcomes.update(isolated.refused)
            remaining = []
            for follower in followers:
                first = leaders[follower.delivery_id]
                answer = outcomes[first]
                if isinstance(answer, Exception):
                    remaining.append(follower)  # the first of its id was not recorded: try it afresh
                elif first.sha256 != follower.sha256:
                    outcomes[follower] = DeliveryConflict(
                        delivery_id=follower.delivery_id, stored_sha256=first.sha256, new_sha256=follower.sha256
                    )
                else:
                    outcomes[follower] = Answer(
                        status="duplicate", reference=answer.reference, outcome=metrics.DUPLICATE_DELIVERY
                    )
        return [outcomes[pending] for pending in group]

    async def _write_retrying(self, group: Sequence[_Pending]) -> list[tuple[_Pending, Answer | Exception]]:
        return await conflicts.retrying(lambda: self._write(group), what="Recording a group of deliveries")

    async def _write(self, group: Sequence[_Pending]) -> list[tuple[_Pending, Answer | Exception]]:
        """One transaction for `group` (distinct ids, in id order): every delivery's answer, or the
        DeliveryConflict of one that came again with another body."""
        timeout = self.timeout_s
        async with self.pool.acquire(timeout=timeout) as conn:
            started = time.monotonic()
            async with conn.transaction():
                claimed = {
                    r["delivery_id"]
                    for r in await conn.fetch(
                        queries.ERP_INBOX_CLAIM_MANY, [p.delivery_id for p in group], [p.sha256 for p in group],
                        [p.event_type for p in group], self.adapter.name, timeout=timeout,
                    )
                }  # fmt: skip
                fresh = [p for p in group if p.delivery_id in claimed]
                seen = [p for p in group if p.delivery_id not in claimed]
                outcomes: dict[str, Answer | Exception] = {}
                if seen:
                    rows = await conn.fetch(queries.ERP_INBOX_GET_MANY, [p.delivery_id for p in seen], timeout=timeout)
                    stored_rows = {r["delivery_id"]: r for r in rows}
                    for pending in seen:
                        row = stored_rows.get(pending.delivery_id)
                        if row is None or row["reference"] is None:  # deleted by retention in between
                            raise asyncpg.exceptions.SerializationError("inbox row changed concurrently; retry")
                        stored = bytes(row["payload_sha256"])
                        outcomes[pending.delivery_id] = (
                            Answer(status="duplicate", reference=row["reference"], outcome=metrics.DUPLICATE_DELIVERY)
                            if stored == pending.sha256
                            else DeliveryConflict(
                                delivery_id=pending.delivery_id, stored_sha256=stored, new_sha256=pending.sha256
                            )
                        )  # fmt: skip
                if fresh:
                    effects = await _apply_many(conn, self.adapter, fresh)
                    answered = [
                        Answer(
                            status="accepted" if effect.created else "duplicate",
                            reference=effect.reference,
                            outcome=metrics.ACCEPTED if effect.created else metrics.DUPLICATE_INTENT,
                        )
                        for effect in effects
                    ]
                    await conn.execute(
                        queries.ERP_INBOX_RECORD_ANSWERS, [p.delivery_id for p in fresh],
                        [a.status for a in answered], [a.reference for a in answered], timeout=timeout,
                    )  # fmt: skip
                    outcomes.update((p.delivery_id, a) for p, a in zip(fresh, answered, strict=True))
                await failpoints.ahit("receiver.before_commit")
            if self.observe is not None:
                self.observe.transaction_seconds.observe(time.monotonic() - started)
        return [(p, outcomes[p.delivery_id]) for p in group]


async def _apply_many(
        conn: asyncpg.Connection, adapter: adapters.ErpAdapter[Any], fresh: Sequence[_Pending]
) -> list[adapters.Effect]:
    if isinstance(adapter, adapters.GroupApplying):
        return await adapter.apply_many(conn, operations=[(p.operation, p.delivery_id) for p in fresh])
    # One at a time, in the group's order (ids sorted): the adapter's own keys decide races.
    return [await adapter.apply(conn, operation=p.operation, delivery_id=p.delivery_id) for p in fresh]

