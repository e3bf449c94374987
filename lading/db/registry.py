"""
Repository of the data plane's mirrors of custom resources: tenants, pools, endpoints.

The operator (and `lading run`) upserts these from TenantQuota, InferencePool and
DeliveryEndpoint objects; workers and acceptance read them. The reads over a tenant's or a
pool's jobs live here too: a tenant's quota use (TenantQuota status), a pool's load for the
scaler (`pool_signals`, over `pool_scaling_load` and `pool_scaling_attempt_stats`) and each
pool's line of `lading status`.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

import asyncpg

from lading.db import backlogs, queries
from lading.ids import PoolName, TenantName


@dataclasses.dataclass(frozen=True)
class Pool:
    name: PoolName
    provider: str
    model: str | None
    spec: dict[str, Any]
    paused: bool


@dataclasses.dataclass(frozen=True)
class TenantRules:
    """What a TenantQuota lets a batch of its namespaces do: everything admission checks."""

    tenant: TenantName
    max_queued_jobs: int | None
    max_queued_bytes: int | None
    """None: no byte limit."""
    allowed_pools: tuple[PoolName, ...] | None
    """'namespace/name' of each allowed InferencePool; None: any pool."""
    allowed_priorities: tuple[str, ...] | None
    """None: every priority class."""
    budget_currency: str | None = None
    """ISO 4217 code of the TenantQuota's spec.budget; None: no money budget."""


@dataclasses.dataclass(frozen=True)
class AdmissionContext:
    """What admission (`lading.applying`) reads about some namespaces, pools and endpoints, read in
    one statement (`admission_context`, or inside another statement of the caller: `context_of`)."""

    claimants: Mapping[str, tuple[TenantName, ...]]
    """Per namespace asked about, every tenant whose quota lists it, by name: one is its tenant,
    two or more a conflict (the namespace belongs to none), none no quota."""
    rules: Mapping[TenantName, TenantRules]
    """The rules of each namespace's only tenant."""
    queued: Mapping[TenantName, tuple[int, int]]
    """Jobs and document bytes each of those tenants has queued; 0 where no limit bounds them."""
    pools: Mapping[PoolName, Pool]
    """The pools asked about that exist."""
    endpoints: frozenset[str]
    """The DeliveryEndpoints ('namespace/name') asked about that exist."""

    def tenant(self, namespace: str) -> TenantName | None:
        """The one tenant whose quota covers `namespace`, as `tenant_for_namespace` says."""
        claimants = self.claimants.get(namespace, ())
        return claimants[0] if len(claimants) == 1 else None


async def admission_context(
        conn: asyncpg.Connection,
        *,
        namespaces: Sequence[str],
        pools: Sequence[str],
        endpoints: Sequence[str],
) -> AdmissionContext:
    """The admission context of `namespaces`, `pools` and `endpoints`, in one statement."""
    value = await conn.fetchval(queries.sql("admission_context_get"), list(namespaces), list(pools), list(endpoints))
    return context_of(value)


def context_of(value: Mapping[str, Any]) -> AdmissionContext:
    """The AdmissionContext in the jsonb object of SQL fragment `admission_context` (sql/admission.sql)."""
    rules: dict[TenantName, TenantRules] = {}
    queued: dict[TenantName, tuple[int, int]] = {}
    for name, found in value["rules"].items():
        tenant = TenantName(name)
        pools, priorities = found["allowedPools"], found["allowedPriorities"]
        rules[tenant] = TenantRules(
            tenant=tenant,
            max_queued_jobs=None if found["maxQueuedJobs"] is None else int(found["maxQueuedJobs"]),
            max_queued_bytes=None if found["maxQueuedBytes"] is None else int(found["maxQueuedBytes"]),
            allowed_pools=None if pools is None else tuple(PoolName(str(p)) for p in pools),
            allowed_priorities=None if priorities is None else tuple(str(p) for p in priorities),
            budget_currency=found["budgetCurrency"],
        )
        queued[tenant] = (int(found["queuedJobs"]), int(found["queuedBytes"]))
    return AdmissionContext(
        claimants={ns: tuple(TenantName(t) for t in names) for ns, names in value["tenants"].items()},
        rules=rules,
        queued=queued,
        pools={
            PoolName(name): Pool(PoolName(name), row["provider"], row["model"], row["spec"], row["paused"])
            for name, row in value["pools"].items()
        },
        endpoints=frozenset(value["endpoints"]),
    )


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
    """The one tenant whose quota covers `namespace`, or None: no quota lists it, or two or more do
    (a conflict: a namespace listed by two quotas is admitted by neither). Nothing is admitted
    where this is None; `tenants_for_namespace` tells the two cases apart."""
    name = await conn.fetchval(queries.sql("tenant_for_namespace"), namespace)
    return None if name is None else TenantName(name)


async def tenants_for_namespace(conn: asyncpg.Connection, *, namespace: str) -> list[TenantName]:
    """Every tenant that lists `namespace`, in name order (two or more: a conflict)."""
    rows = await conn.fetch(queries.sql("tenant_list_for_namespace"), namespace)
    return [TenantName(row["name"]) for row in rows]


@dataclasses.dataclass(frozen=True)
class NamespaceConflict:
    """A namespace this tenant lists that `other` lists too: neither admits batches there."""

    namespace: str
    other: TenantName


async def tenant_namespace_conflicts(conn: asyncpg.Connection, *, tenant: TenantName) -> list[NamespaceConflict]:
    """The namespaces of `tenant` that another tenant also lists, with that tenant."""
    rows = await conn.fetch(queries.sql("tenant_namespace_conflicts"), tenant)
    return [NamespaceConflict(namespace=row["namespace"], other=TenantName(row["other"])) for row in rows]


async def revoke_tenant(conn: asyncpg.Connection, *, name: TenantName) -> list[str] | None:
    """Take every namespace away from `name` (its TenantQuota is going); the namespaces it had, or
    None when there is no such tenant. The row stays: jobs already queued keep their tenant and finish."""
    row = await conn.fetchrow(queries.sql("tenant_revoke"), name)
    return None if row is None else list(row["namespaces"])


async def tenant_rules(conn: asyncpg.Connection, *, tenant: TenantName) -> TenantRules | None:
    """The rules of `tenant`'s TenantQuota, or None when there is no such tenant."""
    row = await conn.fetchrow(queries.sql("tenant_rules_get"), tenant)
    if row is None:
        return None
    pools, priorities = row["allowed_pools"], row["allowed_priorities"]
    return TenantRules(
        tenant=TenantName(row["name"]),
        max_queued_jobs=None if row["max_queued_jobs"] is None else int(row["max_queued_jobs"]),
        max_queued_bytes=None if row["max_queued_bytes"] is None else int(row["max_queued_bytes"]),
        allowed_pools=None if pools is None else tuple(PoolName(str(p)) for p in pools),
        allowed_priorities=None if priorities is None else tuple(str(p) for p in priorities),
        budget_currency=row["budget_currency"],
    )


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


async def delete_pool_if_unused(conn: asyncpg.Connection, *, name: PoolName) -> bool:
    """Unregister pool `name` (no batch can be admitted to it any more) unless a batch refers to it;
    True when it was deleted or did not exist."""
    if await conn.fetchval(queries.sql("pool_delete_unused"), name) is not None:
        return True
    return await get_pool(conn, name=name) is None


async def get_pool(conn: asyncpg.Connection, *, name: PoolName) -> Pool | None:
    row = await conn.fetchrow(queries.sql("pool_get"), name)
    if row is None:
        return None
    return Pool(PoolName(row["name"]), row["provider"], row["model"], row["spec"], row["paused"])


async def upsert_endpoint(conn: asyncpg.Connection, *, name: str, url: str, spec: dict[str, Any]) -> None:
    await conn.execute(queries.sql("endpoint_upsert"), name, url, spec)


async def endpoint_exists(conn: asyncpg.Connection, *, name: str) -> bool:
    """Whether the DeliveryEndpoint `name` ('namespace/name') is registered."""
    return bool(await conn.fetchval(queries.sql("endpoint_exists"), name))


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


@dataclasses.dataclass(frozen=True)
class PoolFlags:
    pool: PoolName
    paused: bool
    """Paused by its spec, or for a while after the provider refused the key or the quota."""
    cooling: bool
    """Cooling down after a 429."""


async def pool_flags(conn: asyncpg.Connection) -> list[PoolFlags]:
    """Every registered pool's pause and cooldown, now."""
    rows = await conn.fetch(queries.sql("pool_list_flags"))
    return [PoolFlags(pool=PoolName(r["pool"]), paused=r["paused"], cooling=r["cooling"]) for r in rows]

@dataclasses.dataclass(frozen=True)
class TenantUsage:
    queued_jobs: int
    queued_bytes: int
    in_flight: int


async def tenant_usage(conn: asyncpg.Connection | asyncpg.Pool, *, tenant: TenantName) -> TenantUsage:
    row = await conn.fetchrow(queries.sql("tenant_usage_now"), tenant)
    assert row is not None, "an aggregate always returns a row"
    return TenantUsage(row["queued_jobs"], row["queued_bytes"], row["in_flight"])


POOLS_LIMIT = 200
"""Pools on the status screen."""


@dataclasses.dataclass(frozen=True)
class PoolStatus:
    name: PoolName
    paused: bool
    backlog: int
    """Jobs a claim could take now (`job_eligible`, lading/db/sql/jobs.sql)."""
    running: int
    oldest_available_at: dt.datetime | None
    """When the oldest job of the backlog became claimable; None for an empty backlog."""
    oldest_age_s: float | None
    """Seconds the oldest job of the backlog has been waiting."""


async def pool_status(conn: asyncpg.Connection, *, limit: int = POOLS_LIMIT) -> list[PoolStatus]:
    """Backlog, running jobs and the oldest waiting job of each pool, by pool name."""
    rows = await conn.fetch(queries.sql("pool_status_report"), limit)
    return [
        PoolStatus(
            name=PoolName(r["name"]),
            paused=r["paused"],
            backlog=r["backlog"],
            running=r["running"],
            oldest_available_at=r["oldest_available_at"],
            oldest_age_s=backlogs.age(r["oldest_age_s"]),
        )
        for r in rows
    ]


SCALING_WINDOW_S_DEFAULT = 120.0
"""Calls of the last two minutes (all the limiter keeps) describe the model as it is now."""


@dataclasses.dataclass(frozen=True)
class PoolLoad:
    """One pool's load as the database sees it, at `at` (the database clock)."""

    pool: PoolName
    at: dt.datetime
    eligible_backlog: int
    """Jobs a claim could take now (`job_eligible`, lading/db/sql/jobs.sql): waiting, not suspended, due,
    inside deadline and attempt budget."""
    oldest_eligible_at: dt.datetime | None
    oldest_eligible_age_s: float | None
    in_flight: int
    """Jobs RUNNING (a claimed attempt, lease held)."""
    cooldown_until: dt.datetime | None
    """No call to the provider before this time: it answered 429 (lading.limiting). May be past."""
    paused: bool
    """Paused by spec (InferencePool spec.paused)."""
    paused_until: dt.datetime | None
    paused_reason: str | None
    recent_attempts: int
    """Finished model calls of the window that the statistics below are computed from."""
    mean_latency_s: float | None
    mean_tokens_per_attempt: float | None


async def pool_signals(
        conn: asyncpg.Connection,
        *,
        pool: PoolName,
        window_s: float = SCALING_WINDOW_S_DEFAULT,
) -> PoolLoad:
    """Read pool `pool`'s load; both queries run in one read-only snapshot so their figures agree."""
    if window_s <= 0:
        raise ValueError(f"window_s must be positive, not {window_s}")
    if conn.is_in_transaction():  # the caller's snapshot, whatever it is
        load, stats = await _read_pool_signals(conn, pool=pool, window_s=window_s)
    else:
        async with conn.transaction(isolation="repeatable_read", readonly=True):
            load, stats = await _read_pool_signals(conn, pool=pool, window_s=window_s)
    assert load is not None and stats is not None  # aggregates always return one row
    return PoolLoad(
        pool=pool,
        at=load["at"],
        eligible_backlog=load["backlog"],
        oldest_eligible_at=load["oldest_available_at"],
        oldest_eligible_age_s=load["oldest_age_s"],
        in_flight=load["in_flight"],
        cooldown_until=load["cooldown_until"],
        paused=load["paused"],
        paused_until=load["paused_until"],
        paused_reason=load["paused_reason"],
        recent_attempts=stats["attempts"],
        mean_latency_s=stats["mean_latency_s"],
        mean_tokens_per_attempt=stats["mean_tokens"],
    )


async def _read_pool_signals(
        conn: asyncpg.Connection,
        *,
        pool: PoolName,
        window_s: float,
) -> tuple[asyncpg.Record, asyncpg.Record]:
    load = await conn.fetchrow(queries.sql("pool_scaling_load"), pool)
    stats = await conn.fetchrow(queries.sql("pool_scaling_attempt_stats"), pool, float(window_s))
    return load, stats
