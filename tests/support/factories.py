"""Factories for rows the tests need: a tenant, a pool, a batch of documents."""

from __future__ import annotations

import asyncpg

from lading import accepting
from lading.db import registry
from lading.ids import PoolName, TenantName

TENANT = TenantName("acme")
POOL = PoolName("lading-system/builtin")


async def seed(conn: asyncpg.Connection, *, tenant: str = TENANT, pool: str = POOL) -> None:
    await registry.upsert_tenant(
        conn, name=TenantName(tenant), namespaces=[tenant], weight=1, max_queued_jobs=None, max_in_flight=None,
        spec={},
    )
    await registry.upsert_pool(conn, name=PoolName(pool), provider="builtin", model="lading-builtin", spec={})


def batch_request(
        *,
        name: str = "b1",
        count: int = 10,
        tenant: str = TENANT,
        pool: str = POOL,
        deadline_s: int = 3600,
        max_attempts: int = 5,
        priority: str = "normal",
        text_prefix: str = "document",
) -> accepting.BatchRequest:
    return accepting.BatchRequest(
        tenant=TenantName(tenant),
        namespace=tenant,
        name=name,
        uid="uid-" + name,
        schema="invoice.v1",
        pool=PoolName(pool),
        model_policy={"pool": pool, "provider": "builtin", "model": "lading-builtin"},
        validation_policy="invoice-strict-v1",
        priority=priority,
        deadline_s=deadline_s,
        max_attempts=max_attempts,
        documents=[accepting.DocumentInput(key=f"doc-{i:05d}", text=f"{text_prefix} {i}") for i in range(count)],
    )
