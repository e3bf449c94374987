"""
Repository of what the operator reports in custom resource status: a batch's progress, a
tenant's quota use, an endpoint's health. (A pool's load is `lading.db.scaling`.) Reads only, one
short query each, so a status refresh costs the database as little as a `kubectl get` costs the API
server. The queries live with their tables (`batch_get_observed` in sql/batches.sql,
`tenant_usage_now` in sql/tenants.sql, `endpoint_get_health` in sql/deliveries.sql, ...); this module
is the operator's read model over them.

The delivery tables belong to the dispatcher's schema; queries over them run only once
`has_table` says they exist, so the operator works against any schema version it supports.
"""

from __future__ import annotations

import dataclasses
import datetime as dt

import asyncpg

from lading.db import queries
from lading.ids import BatchId, TenantName
from lading.jobs.states import JobState


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


@dataclasses.dataclass(frozen=True)
class Failure:
    document_key: str
    error_class: str
    error: str
    at: dt.datetime


@dataclasses.dataclass(frozen=True)
class TenantUsage:
    queued_jobs: int
    queued_bytes: int
    in_flight: int


@dataclasses.dataclass(frozen=True)
class EndpointHealth:
    breaker_state: str
    auth_failing: bool
    last_auth_status: int | None
    delivered: int
    pending: int
    unknown: int
    failed: int


async def batch(
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


async def batch_failures(conn: asyncpg.Connection | asyncpg.Pool, *, batch_id: BatchId, limit: int) -> list[Failure]:
    rows = await conn.fetch(queries.sql("job_list_failures_of_batch"), batch_id, limit)
    return [Failure(r["document_key"], r["error_class"], r["error"], r["finished_at"]) for r in rows]


async def has_table(conn: asyncpg.Connection | asyncpg.Pool, *, name: str) -> bool:
    return bool(await conn.fetchval(queries.sql("catalog_table_exists"), name))


async def batch_delivered(conn: asyncpg.Connection | asyncpg.Pool, *, batch_id: BatchId) -> int:
    return int(await conn.fetchval(queries.sql("delivery_count_delivered_of_batch"), batch_id))


async def tenant_usage(conn: asyncpg.Connection | asyncpg.Pool, *, tenant: TenantName) -> TenantUsage:
    row = await conn.fetchrow(queries.sql("tenant_usage_now"), tenant)
    assert row is not None, "an aggregate always returns a row"
    return TenantUsage(row["queued_jobs"], row["queued_bytes"], row["in_flight"])


async def endpoint_health(conn: asyncpg.Connection | asyncpg.Pool, *, endpoint: str) -> EndpointHealth | None:
    row = await conn.fetchrow(queries.sql("endpoint_get_health"), endpoint)
    if row is None:
        return None
    return EndpointHealth(
        row["breaker_state"], row["auth_failing"], row["last_auth_status"],
        row["delivered"], row["pending"], row["unknown"], row["failed"],
    )  # fmt: skip


async def tenant_max_queued_bytes(conn: asyncpg.Connection | asyncpg.Pool, *, tenant: TenantName) -> int | None:
    value = await conn.fetchval(queries.sql("tenant_max_queued_bytes"), tenant)
    return None if value is None else int(value)


async def batch_tenant(conn: asyncpg.Connection | asyncpg.Pool, *, idempotency_key: str) -> TenantName | None:
    value = await conn.fetchval(queries.sql("batch_tenant_by_key"), idempotency_key)
    return None if value is None else TenantName(value)
