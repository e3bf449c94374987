"""
Repository of the cleaner (`lading_worker.cleaning`): one function per retention query, in the `sql/`
file of the table it deletes from.

Every `delete_*` removes at most `limit` rows whose retention of `older_than_s` seconds has
passed and that nothing needs any more, in one short statement (oldest first through an index,
`FOR UPDATE SKIP LOCKED`, so it never waits on the loops that own those rows), and returns how
many went. Every `oldest_*` returns the age in seconds of the oldest row of that kind still
kept (None when there is none): how far behind the cleaner is.
"""

from __future__ import annotations

import dataclasses

import asyncpg

from lading.db import queries
from lading.ids import TenantName


async def _deleted(conn: asyncpg.Connection, name: str, *, older_than_s: float, limit: int) -> int:
    return int(await conn.fetchval(queries.sql(name), float(older_than_s), limit))


async def _age(conn: asyncpg.Connection, name: str) -> float | None:
    age = await conn.fetchval(queries.sql(name))
    return None if age is None else max(float(age), 0.0)


async def delete_published_outbox(conn: asyncpg.Connection, *, older_than_s: float, limit: int) -> int:
    """Outbox events published more than `older_than_s` ago; an unpublished event never goes."""
    return await _deleted(conn, "outbox_delete_published", older_than_s=older_than_s, limit=limit)


async def oldest_published_outbox_age_s(conn: asyncpg.Connection) -> float | None:
    return await _age(conn, "outbox_oldest_published_age")


async def delete_expired_inbox(conn: asyncpg.Connection, *, older_than_s: float, limit: int) -> int:
    """Ingress inbox rows received more than `older_than_s` ago (past the dedup window)."""
    return await _deleted(conn, "inbox_delete_expired", older_than_s=older_than_s, limit=limit)


async def oldest_inbox_age_s(conn: asyncpg.Connection) -> float | None:
    return await _age(conn, "inbox_oldest_age")


async def delete_expired_quarantine(conn: asyncpg.Connection, *, older_than_s: float, limit: int) -> int:
    """Quarantined redeliveries received more than `older_than_s` ago."""
    return await _deleted(conn, "inbox_quarantine_delete_expired", older_than_s=older_than_s, limit=limit)


async def oldest_quarantine_age_s(conn: asyncpg.Connection) -> float | None:
    return await _age(conn, "inbox_quarantine_oldest_age")


async def delete_delivered(conn: asyncpg.Connection, *, older_than_s: float, limit: int) -> int:
    """Deliveries DELIVERED more than `older_than_s` ago, with their attempts; no other state goes."""
    return await _deleted(conn, "delivery_delete_delivered", older_than_s=older_than_s, limit=limit)


async def oldest_delivered_age_s(conn: asyncpg.Connection) -> float | None:
    return await _age(conn, "delivery_oldest_delivered_age")


async def delete_stale_completions(conn: asyncpg.Connection, *, older_than_s: float, limit: int) -> int:
    """Stale-completion records older than `older_than_s`."""
    return await _deleted(conn, "stale_completion_delete_expired", older_than_s=older_than_s, limit=limit)


async def oldest_stale_completion_age_s(conn: asyncpg.Connection) -> float | None:
    return await _age(conn, "stale_completion_oldest_age")


async def delete_expired_api_requests(conn: asyncpg.Connection, *, older_than_s: float, limit: int) -> int:
    """Idempotency-Key records of the HTTP intake answered more than `older_than_s` ago."""
    return await _deleted(conn, "api_request_delete_expired", older_than_s=older_than_s, limit=limit)


async def oldest_api_request_age_s(conn: asyncpg.Connection) -> float | None:
    return await _age(conn, "api_request_oldest_age")


async def delete_expired_submissions(conn: asyncpg.Connection, *, older_than_s: float, limit: int) -> int:
    """Idempotency records of single documents (`document_submissions`) made more than `older_than_s` ago."""
    return await _deleted(conn, "submission_delete_expired", older_than_s=older_than_s, limit=limit)


async def oldest_submission_age_s(conn: asyncpg.Connection) -> float | None:
    return await _age(conn, "submission_oldest_age")


async def delete_expired_permits(conn: asyncpg.Connection, *, older_than_s: float, limit: int) -> int:
    """Limiter permits acquired more than `older_than_s` ago that hold no slot any more."""
    return await _deleted(conn, "limiter_permit_delete_expired", older_than_s=older_than_s, limit=limit)


async def oldest_permit_age_s(conn: asyncpg.Connection) -> float | None:
    return await _age(conn, "limiter_permit_oldest_age")


async def delete_expired_limiter_seconds(conn: asyncpg.Connection, *, older_than_s: float, limit: int) -> int:
    """Per-second limiter sums older than `older_than_s`."""
    return await _deleted(conn, "limiter_second_delete_expired", older_than_s=older_than_s, limit=limit)


async def oldest_limiter_second_age_s(conn: asyncpg.Connection) -> float | None:
    return await _age(conn, "limiter_second_oldest_age")


async def delete_expired_gpu_intervals(conn: asyncpg.Connection, *, older_than_s: float, limit: int) -> int:
    """Closed GPU-time intervals of pools priced by the GPU hour that started more than `older_than_s`
    ago (the attempts they charged keep their costs)."""
    return await _deleted(conn, "pool_gpu_interval_delete_expired", older_than_s=older_than_s, limit=limit)


async def oldest_gpu_interval_age_s(conn: asyncpg.Connection) -> float | None:
    return await _age(conn, "pool_gpu_interval_oldest_age")


@dataclasses.dataclass(frozen=True)
class TenantRetention:
    """A tenant's TenantQuota spec.retention, as stored in `tenants.spec`: days kept (None: kept)."""

    tenant: TenantName
    documents_days: int | None
    results_days: int | None


async def tenant_retentions(conn: asyncpg.Connection) -> list[TenantRetention]:
    """Every tenant whose TenantQuota sets spec.retention, by name."""
    rows = await conn.fetch(queries.sql("tenant_list_retention"))
    return [TenantRetention(tenant=TenantName(r["name"]), documents_days=r["documents_days"],
                            results_days=r["results_days"]) for r in rows]


async def delete_documents(conn: asyncpg.Connection, *, tenant: TenantName, older_than_days: int, limit: int) -> int:
    """The documents of at most `limit` of the tenant's jobs that ended more than `older_than_days`
    ago; their job rows are marked (`document_deleted_at`) and keep everything else."""
    return int(await conn.fetchval(queries.sql("document_delete_expired"), tenant, older_than_days, limit))


async def delete_results(conn: asyncpg.Connection, *, tenant: TenantName, older_than_days: int, limit: int) -> int:
    """The extracted JSON of at most `limit` of the tenant's jobs that ended more than `older_than_days`
    ago, whose document already went and whose deliveries are settled; the verdict stays."""
    return int(await conn.fetchval(queries.sql("result_delete_expired"), tenant, older_than_days, limit))


async def oldest_document_age_s(conn: asyncpg.Connection, *, tenant: TenantName) -> float | None:
    """Seconds since the oldest of the tenant's ended jobs that still has its document ended."""
    age = await conn.fetchval(queries.sql("document_oldest_retained_age"), tenant)
    return None if age is None else max(float(age), 0.0)


async def oldest_result_age_s(conn: asyncpg.Connection, *, tenant: TenantName) -> float | None:
    """Seconds since the oldest of the tenant's ended jobs whose document went and whose result is
    still kept ended."""
    age = await conn.fetchval(queries.sql("result_oldest_retained_age"), tenant)
    return None if age is None else max(float(age), 0.0)
