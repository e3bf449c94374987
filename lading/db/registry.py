"""
Repository of the data plane's mirrors of custom resources: tenants, pools, endpoints.

The operator (and `lading run`) upserts these from TenantQuota, InferencePool and
DeliveryEndpoint objects; workers and acceptance read them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import asyncpg

from lading.db import queries
from lading.ids import PoolName, TenantName


@dataclasses.dataclass(frozen=True)
class Pool:
    name: PoolName
    provider: str
    model: str | None
    spec: dict[str, Any]
    paused: bool


async def upsert_tenant(
        conn: asyncpg.Connection,
        *,
        name: TenantName,
        namespaces: Sequence[str],
        weight: int,
        max_queued_jobs: int | None,
        max_in_flight: int | None,
        spec: dict[str, Any],
) -> None:
    await conn.execute(
        queries.sql("tenant_upsert"), name, list(namespaces), weight, max_queued_jobs, max_in_flight, spec
    )


async def tenant_for_namespace(conn: asyncpg.Connection, *, namespace: str) -> TenantName | None:
    """The tenant whose quota covers `namespace`, or None (then nothing is admitted)."""
    rows = await conn.fetch(queries.sql("tenant_for_namespace"), namespace)
    return TenantName(rows[0]["name"]) if rows else None


async def upsert_pool(
        conn: asyncpg.Connection,
        *,
        name: PoolName,
        provider: str,
        model: str | None,
        spec: dict[str, Any],
        paused: bool = False,
) -> None:
    await conn.execute(queries.sql("pool_upsert"), name, provider, model, spec, paused)


async def get_pool(conn: asyncpg.Connection, *, name: PoolName) -> Pool | None:
    row = await conn.fetchrow(queries.sql("pool_get"), name)
    if row is None:
        return None
    return Pool(PoolName(row["name"]), row["provider"], row["model"], row["spec"], row["paused"])


async def upsert_endpoint(conn: asyncpg.Connection, *, name: str, url: str, spec: dict[str, Any]) -> None:
    await conn.execute(queries.sql("endpoint_upsert"), name, url, spec)


async def tenant_queued_jobs(conn: asyncpg.Connection, *, tenant: TenantName) -> int:
    return int(await conn.fetchval(queries.sql("tenant_queued_jobs"), tenant))


async def tenant_max_queued_jobs(conn: asyncpg.Connection, *, tenant: TenantName) -> int | None:
    value = await conn.fetchval(queries.sql("tenant_max_queued_jobs"), tenant)
    return None if value is None else int(value)


async def batch_exists(conn: asyncpg.Connection, *, tenant: TenantName, idempotency_key: str) -> bool:
    return bool(await conn.fetchval(queries.sql("batch_exists"), tenant, idempotency_key))


async def pause_pool(conn: asyncpg.Connection, *, name: PoolName, seconds: float, reason: str) -> None:
    """Stop claims for `name` for `seconds` (a longer pause already in force stays)."""
    await conn.execute(queries.sql("pool_pause"), name, seconds, reason)
