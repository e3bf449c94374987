"""Rows and dispatchers for the delivery tests: an endpoint, succeeded jobs (so the trigger writes
their deliveries), and a dispatcher with fast settings that may call 127.0.0.1."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import asyncpg
from lading_worker import dispatching

from lading import accepting
from lading.db import deliveries, jobs, registry
from lading.delivery import egress
from lading.delivery import secrets as delivery_secrets
from lading.ids import DeliveryId, JobId, WorkerId
from lading.jobs import transitions
from lading.settings import DeliverySettings
from tests.support import factories

ENDPOINT = "acme/erp"
SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
OTHER_SECRET = "whsec_dGhpcyBpcyB0aGUgbmV3IHNlY3JldCBrZXkh"
WORKER = WorkerId("w1")
LOOPBACK = egress.parse_cidrs(["127.0.0.0/8"])
RESULT: dict[str, Any] = {"invoice_number": "INV-1", "total": "24.00"}

FAST = DeliverySettings(
    concurrency=16, poll_interval_s=0.02, connect_timeout_s=1.0, read_timeout_s=1.0, total_timeout_s=2.0,
    lease_ttl_s=10.0, backoff_base_s=0.01, backoff_cap_s=0.05, breaker_threshold=1000, breaker_cooldown_s=0.2,
    breaker_cooldown_cap_s=0.5, auth_failing_threshold=3, reap_interval_s=0.1, health_interval_s=0.1,
)  # fmt: skip


async def register(
        conn: asyncpg.Connection, url: str, *, name: str = ENDPOINT, max_attempts: int = 12, max_age_s: int = 86400,
) -> None:
    await registry.upsert_endpoint(
        conn, name=name, url=url,
        spec={"url": url, "secretRef": {"name": "erp-signing", "key": "secret"},
              "retryBudget": {"maxAttempts": max_attempts, "maxAgeSeconds": max_age_s}},
    )  # fmt: skip


async def accept(conn: asyncpg.Connection, *, count: int = 1, name: str = "b1", endpoint: str | None = ENDPOINT,
                 texts: Sequence[str] | None = None) -> list[JobId]:  # fmt: skip
    await factories.seed(conn)
    request = dataclasses.replace(factories.batch_request(name=name, count=count), endpoint=endpoint)
    if texts is not None:
        request = dataclasses.replace(
            request, documents=[accepting.DocumentInput(key=f"doc-{i:05d}", text=t) for i, t in enumerate(texts)]
        )
    return list((await accepting.accept_batch(conn, request)).job_ids)


async def succeed(conn: asyncpg.Connection, *, count: int = 1, name: str = "b1", endpoint: str | None = ENDPOINT,
                  result: dict[str, Any] | None = None) -> list[JobId]:  # fmt: skip
    """`count` jobs of a new batch, claimed and succeeded by the worker's own statements."""
    job_ids = await accept(conn, count=count, name=name, endpoint=endpoint)
    claimed = await jobs.claim_batch(conn, pool=factories.POOL, worker_id=WORKER, limit=count, lease_ttl_s=600)
    finishes = [
        transitions.succeed(c.id, c.fence, result=result or RESULT, validation={"passed": True, "failed_checks": []})
        for c in claimed
    ]
    applied = await jobs.finish_many(conn, finishes, worker_id=WORKER)
    assert applied == set(job_ids)
    return job_ids


async def delivery_of(conn: asyncpg.Connection, job_id: JobId, *, endpoint: str = ENDPOINT) -> deliveries.Delivery:
    delivery_id = await conn.fetchval(
        "SELECT delivery_id FROM deliveries WHERE job_id = $1 AND endpoint = $2", job_id, endpoint
    )
    assert delivery_id is not None, f"job {job_id} has no delivery to {endpoint}"
    found = await deliveries.get(conn, delivery_id=DeliveryId(delivery_id))
    assert found is not None
    return found


async def states(conn: asyncpg.Connection) -> dict[str, int]:
    rows = await conn.fetch("SELECT state, count(*) AS n FROM deliveries GROUP BY state")
    return {r["state"]: r["n"] for r in rows}


def dispatcher(
        pool: asyncpg.Pool,
        *,
        settings: DeliverySettings = FAST,
        secrets: Sequence[str] = (SECRET,),
        allow: Sequence[egress.IPNetwork] = (),
        loopback_for: Sequence[str] = (ENDPOINT,),
        owner: str | None = None,
        resolver: Any = None,
) -> dispatching.Dispatcher:
    return dispatching.Dispatcher(
        pool,
        secrets=delivery_secrets.StaticSecrets({ENDPOINT: list(secrets)} if secrets else {}),
        policy=egress.EgressPolicy(allow=tuple(allow), endpoint_allow={name: LOOPBACK for name in loopback_for}),
        settings=settings,
        owner=owner,
        resolver=resolver,
    )
