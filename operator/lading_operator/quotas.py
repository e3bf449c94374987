"""
TenantQuota reconciler: validate, mirror into `tenants` (what admission and the claimer read),
report use in status, and wake batches waiting for this quota.

A TenantQuota is cluster-scoped and owned by the platform team. Creating or changing one can make
room for batches waiting in the quota queue, or give a home to batches whose namespace no quota
covered: both wake the waiting batches, which re-check admission at once.

Deleting one revokes it before the object goes (the finalizer `lading.dev/finalizer`): its
`tenants` row loses its namespaces (`registry.revoke_tenant`), so a new batch there is
`NoTenantQuota`; the row itself stays, so jobs already queued keep their tenant, fair share and
limits, and finish. Should the revocation fail (database down), the object stays until it succeeds.

A namespace listed by two quotas belongs to neither (`registry.tenant_for_namespace`, in the core:
`lading run` obeys it too): both quotas report Ready=False, reason NamespaceConflict, naming the
namespace and the other quota, until one of them drops it. Each quota's status refresh
(`quota_interval_s`) notices a conflict that another quota created.
"""

from __future__ import annotations

import logging
from typing import Any

import asyncpg
import kopf
import pydantic

from lading import applying
from lading.db import fairness, registry
from lading.ids import TenantName
from lading.models import specs
from lading_operator import budgets, conditions, events, kube, runtime, status

logger = logging.getLogger("lading.operator.quotas")

KIND = "TenantQuota"
PLURAL = "tenantquotas"
NAMESPACE_CONFLICT = conditions.NAMESPACE_CONFLICT


def parse(body: kopf.Body) -> specs.TenantQuota:
    return specs.TenantQuota.model_validate(
        {
            "apiVersion": specs.API_VERSION,
            "kind": KIND,
            "metadata": {"name": body.metadata.name, "uid": body.metadata.uid},
            "spec": dict(body.spec),
        }
    )


def _message(exc: pydantic.ValidationError) -> str:
    first = exc.errors()[0]
    return f"spec.{'.'.join(str(p) for p in first['loc'])}: {first['msg']}"


async def _write(rt: runtime.Runtime, body: kopf.Body, desired: dict[str, Any]) -> None:
    await conditions.write_status(
        rt.api, api_version=specs.API_VERSION, plural=PLURAL, namespace=None, name=str(body.metadata.name),
        live=dict(body.get("status") or {}), desired=desired,
    )  # fmt: skip


async def apply(rt: runtime.Runtime, body: kopf.Body) -> None:
    generation = body.metadata.get("generation")
    previous = (body.get("status") or {}).get("conditions")
    try:
        quota = parse(body)
    except pydantic.ValidationError as exc:
        ready = conditions.condition(previous, type=conditions.READY, value=False, reason=conditions.INVALID_SPEC,
                                     message=_message(exc), generation=generation)  # fmt: skip
        await _write(rt, body, conditions.dump(status.TenantQuotaStatus(observed_generation=generation,
                                                                         conditions=[ready])))  # fmt: skip
        events.warning(body, reason=conditions.INVALID_SPEC, message=_message(exc))
        return
    async with rt.db.acquire() as conn:
        await applying.apply_tenant_quota(conn, quota)
    rt.room_in(TenantName(quota.metadata.name))
    rt.something_appeared()
    await refresh(rt, body)


async def revoke(rt: runtime.Runtime, body: kopf.Body) -> None:
    """The quota is being deleted: its namespaces stop belonging to its tenant; queued jobs stay."""
    name = TenantName(str(body.metadata.name))
    async with rt.db.acquire() as conn:
        revoked = await registry.revoke_tenant(conn, name=name)
    if revoked:
        logger.info("%s %s deleted: namespaces %s revoked; its queued jobs stay and finish", KIND, name,
                    ", ".join(revoked))  # fmt: skip
    rt.something_appeared()  # a namespace it shared with another quota may belong to that one now


async def refresh(rt: runtime.Runtime, body: kopf.Body) -> None:
    generation = body.metadata.get("generation")
    previous = (body.get("status") or {}).get("conditions")
    try:
        quota = parse(body)
    except pydantic.ValidationError:
        return
    tenant = TenantName(quota.metadata.name)
    async with rt.db.acquire() as conn:
        usage = await registry.tenant_usage(conn, tenant=tenant)
        budget = await fairness.tenant_budget(conn, tenant=tenant)
        conflicts = await registry.tenant_namespace_conflicts(conn, tenant=tenant)
    if conflicts:
        message = "; ".join(f"namespace {c.namespace} is also listed by TenantQuota {c.other}" for c in conflicts)
        ready = conditions.condition(
            previous, type=conditions.READY, value=False, reason=NAMESPACE_CONFLICT, generation=generation,
            message=f"{message}: a namespace listed by two quotas is admitted by neither",
        )  # fmt: skip
        if not any(c.get("reason") == NAMESPACE_CONFLICT for c in previous or ()):
            events.warning(body, reason=NAMESPACE_CONFLICT, message=ready.message)
    else:
        ready = conditions.condition(previous, type=conditions.READY, value=True, reason=conditions.APPLIED,
                                     message=f"namespaces: {', '.join(quota.spec.namespaces)}"[:1024],
                                     generation=generation)  # fmt: skip
    conds = [ready]
    spent = None if budget is None else budgets.state(budget, tenant=str(tenant))
    if spent is not None:
        conds.append(
            conditions.condition(
                previous, type=conditions.BUDGET_EXHAUSTED, value=spent.exhausted, reason=spent.reason,
                message=spent.message, generation=generation,
            )
        )  # fmt: skip
    money = None if budget is None else budget.money
    desired = conditions.dump(
        status.TenantQuotaStatus(
            observed_generation=generation,
            queued_jobs=usage.queued_jobs,
            queued_bytes=usage.queued_bytes,
            in_flight=usage.in_flight,
            tokens_today=budget.used if budget is not None else None,
            spent_today=None if money is None else budgets.money(money.spent_today, money.currency),
            spent_this_month=None if money is None else budgets.money(money.spent_this_month, money.currency),
            conditions=conds,
        )
    )
    await _write(rt, body, desired)


async def refresh_tick(rt: runtime.Runtime, body: kopf.Body) -> None:
    """`refresh`, where a database or API failure is a warning: the next tick retries (kopf's own
    error backoff would pause the refresh for a minute)."""
    try:
        await refresh(rt, body)
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, kube.KubeError) as exc:
        logger.warning("%s %s: status refresh failed: %s", KIND, body.metadata.name, type(exc).__name__)
