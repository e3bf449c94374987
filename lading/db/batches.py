"""
Repository of `batches` (`sql/batches.sql`): the batch row acceptance inserts (decided by the
unique (tenant, idempotency key) index, never by "SELECT then INSERT"), the row an idempotent
re-acceptance compares against, suspension, and progress counts and timing for status and
`lading run`; what the operator writes into an ExtractionBatch's status; the batches in progress
that `lading status` lists.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterable, Mapping

import asyncpg

from lading.db import queries
from lading.ids import BatchId, PoolName, TenantName
from lading.jobs.states import SETTLED, JobState


@dataclasses.dataclass(frozen=True)
class Progress:
    batch_id: BatchId
    total: int
    counts: dict[JobState, int]

    @property
    def settled(self) -> int:
        return sum(n for state, n in self.counts.items() if state in SETTLED)

    @property
    def done(self) -> bool:
        return self.settled >= self.total


@dataclasses.dataclass(frozen=True)
class NewBatch:
    """A batch row as acceptance inserts it."""

    tenant: TenantName
    namespace: str
    name: str
    uid: str
    idempotency_key: str
    request_hash: str
    hash_version: int
    schema: str
    pool: PoolName
    validation_policy: str
    priority: int
    deadline_s: int
    endpoint: str | None
    suspended: bool
    total_jobs: int
    reuse: bool = True
    """Jobs may take an earlier accepted result and wait for duplicates (ExtractionBatch spec.reuse)."""


@dataclasses.dataclass(frozen=True)
class Inserted:
    id: BatchId
    now: dt.datetime
    """Database time of the insert (clock_timestamp()): the jobs' deadlines count from it."""


@dataclasses.dataclass(frozen=True)
class Stored:
    """The batch already holding a (tenant, idempotency key)."""

    id: BatchId
    request_hash: str
    hash_version: int
    total_jobs: int


async def insert(conn: asyncpg.Connection, batch: NewBatch) -> Inserted | None:
    """Insert the batch row; None when a batch with the same (tenant, idempotency key) exists (the caller
    then compares request hashes). A concurrent insert of the same key waits for the first to end."""
    row = await conn.fetchrow(
        queries.sql("batch_insert"),
        batch.tenant, batch.namespace, batch.name, batch.uid, batch.idempotency_key, batch.request_hash,
        batch.hash_version, batch.schema, batch.pool, batch.validation_policy, batch.priority, batch.deadline_s,
        batch.endpoint, batch.suspended, batch.total_jobs, batch.reuse,
    )  # fmt: skip
    return None if row is None else Inserted(id=BatchId(row["id"]), now=row["now"])


async def get_by_key(conn: asyncpg.Connection, *, tenant: TenantName, idempotency_key: str) -> Stored | None:
    row = await conn.fetchrow(queries.sql("batch_get_by_key"), tenant, idempotency_key)
    if row is None:
        return None
    return Stored(
        id=BatchId(row["id"]), request_hash=row["request_hash"], hash_version=row["hash_version"],
        total_jobs=row["total_jobs"],
    )


async def progress(conn: asyncpg.Connection, *, batch_id: BatchId, total: int) -> Progress:
    rows = await conn.fetch(queries.sql("batch_counts"), batch_id)
    counts = {state: 0 for state in JobState}
    for row in rows:
        counts[JobState(row["state"])] = row["n"]
    return Progress(batch_id=batch_id, total=total, counts=counts)


async def set_suspended(conn: asyncpg.Connection, *, batch_id: BatchId, suspended: bool) -> int | None:
    """Suspend or resume a batch and its jobs in one statement; how many jobs changed, or None
    when there is no such batch. Suspended jobs are never claimed and never scanned by claims."""
    row = await conn.fetchrow(queries.sql("batch_set_suspended"), batch_id, suspended)
    return None if row is None else int(row["jobs"])


async def timing(conn: asyncpg.Connection, *, batch_id: BatchId) -> tuple[dt.datetime, dt.datetime | None]:
    row = await conn.fetchrow(queries.sql("batch_timing"), batch_id)
    assert row is not None, f"batch {batch_id} exists"
    return row["started_at"], row["last_change_at"]


@dataclasses.dataclass(frozen=True)
class OpenRolling:
    """The open batch of a rolling group, locked by the caller's transaction."""

    id: BatchId
    namespace: str
    name: str
    total_jobs: int
    taking: bool
    """Still inside its open period (a batch past it takes no more documents)."""
    key_taken: bool
    """The document key asked about is in the batch already (keys are unique per batch)."""


async def open_rolling(
        conn: asyncpg.Connection,
        batch: NewBatch,
        *,
        group: str,
        open_s: float,
) -> BatchId | None:
    """Insert an open rolling batch for `group`; None when the group has an open batch already
    (a concurrent opener waits for the first to end)."""
    row = await conn.fetchrow(
        queries.sql("batch_open_rolling"),
        batch.tenant, batch.namespace, batch.name, batch.uid, batch.idempotency_key, batch.request_hash,
        batch.hash_version, batch.schema, batch.pool, batch.validation_policy, batch.priority, batch.deadline_s,
        batch.endpoint, batch.suspended, batch.total_jobs, group, open_s,
    )  # fmt: skip
    return None if row is None else BatchId(row["id"])


async def lock_open_rolling(conn: asyncpg.Connection, *, group: str, document_key: str) -> OpenRolling | None:
    """The open batch of `group`, locked until the transaction ends; None when none is open."""
    row = await conn.fetchrow(queries.sql("batch_lock_open_rolling"), group, document_key)
    if row is None:
        return None
    return OpenRolling(
        id=BatchId(row["id"]), namespace=row["namespace"], name=row["name"], total_jobs=row["total_jobs"],
        taking=row["taking"], key_taken=row["key_taken"],
    )  # fmt: skip


async def pick_open_rolling(
        conn: asyncpg.Connection,
        *,
        groups: list[str],
        document_key: str,
) -> OpenRolling | None:
    """An open batch of `groups` no other transaction holds, locked until the transaction ends
    (SKIP LOCKED, never waits); None when every open one is held, or none is open."""
    row = await conn.fetchrow(queries.sql("batch_pick_open_rolling"), groups, document_key)
    if row is None:
        return None
    return OpenRolling(
        id=BatchId(row["id"]), namespace=row["namespace"], name=row["name"], total_jobs=row["total_jobs"],
        taking=row["taking"], key_taken=row["key_taken"],
    )  # fmt: skip


async def close_rolling(conn: asyncpg.Connection, *, batch_id: BatchId) -> None:
    """The rolling batch takes no more documents; the next of its group opens a new one."""
    await conn.execute(queries.sql("batch_close_rolling"), batch_id)


# What the operator writes into custom resource status: reads only, one short query each.
@dataclasses.dataclass(frozen=True)
class ObservedBatch:
    batch_id: BatchId
    total: int
    admitted_at: dt.datetime
    suspended: bool
    endpoint: str | None
    counts: dict[JobState, int]
    oldest_eligible_s: float | None
    last_finished_at: dt.datetime | None


async def get_observed(
    conn: asyncpg.Connection | asyncpg.Pool, *, tenant: TenantName, idempotency_key: str
) -> ObservedBatch | None:
    row = await conn.fetchrow(queries.sql("batch_get_observed"), tenant, idempotency_key)
    if row is None:
        return None
    counts = {state: 0 for state in JobState}
    for state, n in (row["counts"] or {}).items():
        counts[JobState(state)] = int(n)
    return ObservedBatch(
        batch_id=BatchId(row["id"]),
        total=row["total_jobs"],
        admitted_at=row["created_at"],
        suspended=row["suspended"],
        endpoint=row["endpoint"],
        counts=counts,
        oldest_eligible_s=row["oldest_eligible_s"],
        last_finished_at=row["last_finished_at"],
    )


async def tenant_by_key(conn: asyncpg.Connection | asyncpg.Pool, *, idempotency_key: str) -> TenantName | None:
    value = await conn.fetchval(queries.sql("batch_tenant_by_key"), idempotency_key)
    return None if value is None else TenantName(value)


BATCHES_LIMIT = 50
"""Batches in progress on the status screen, oldest first."""


@dataclasses.dataclass(frozen=True)
class BatchStatus:
    """A batch with at least one job not yet settled."""

    id: BatchId
    tenant: TenantName
    namespace: str
    name: str
    pool: PoolName
    total: int
    suspended: bool
    counts: Mapping[JobState, int]
    """Jobs per state; every state is present (0 when none)."""
    created_at: dt.datetime
    """When the batch was accepted."""
    age_s: float
    """Seconds since it was accepted."""
    reused: int = 0
    """Succeeded jobs that took an earlier accepted result instead of calling the model."""

    @property
    def settled(self) -> int:
        """Jobs no machine will move again (terminal, or waiting for a reviewer)."""
        return sum(n for state, n in self.counts.items() if state in SETTLED)


async def batches_in_progress(conn: asyncpg.Connection, *, limit: int = BATCHES_LIMIT) -> list[BatchStatus]:
    """Batches with a job still waiting or running, oldest first, with per-state counts."""
    rows = await conn.fetch(queries.sql("batch_list_report"), limit)
    return [
        BatchStatus(
            id=BatchId(r["id"]),
            tenant=TenantName(r["tenant"]),
            namespace=r["namespace"],
            name=r["name"],
            pool=PoolName(r["pool"]),
            total=r["total_jobs"],
            suspended=r["suspended"],
            counts=_counts(zip(r["states"], r["counts"], strict=True)),
            created_at=r["created_at"],
            age_s=max(r["age_s"], 0.0),
            reused=r["reused"],
        )
        for r in rows
    ]


def _counts(pairs: Iterable[tuple[str, int]]) -> dict[JobState, int]:
    counts = {state: 0 for state in JobState}
    for state, n in pairs:
        counts[JobState(state)] = n
    return counts
