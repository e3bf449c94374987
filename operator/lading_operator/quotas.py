"""
TenantQuota reconciler: validate, mirror into `tenants` (what admission and the claimer read),
report use in status, and wake batches waiting for this quota.

A TenantQuota is cluster-scoped and owned by the platform team. Creating or changing one can make
room for batches waiting in the quota queue, or give a home to batches whose namespace no quota
covered: both wake the waiting batches, which re-check admission at once. Deleting one leaves
the `tenants` row (accepted batches refer to it); new batches of its namespaces are not admitted
once no quota covers them.
"""

from __future__ import annotations

import logging
from typing import Any

import asyncpg
import kopf
import pydantic

from lading import applying
from lading.db import fairness, observed
from lading.ids import TenantName
from lading.models import specs
from lading_operator import conditions, events, kube, runtime, status

logger = logging.getLogger("lading.operator.quotas")

KIND = "TenantQuota"
PLURAL = "tenantquotas"


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
        ready = conditions.condition(previous, type="Ready", value=False, reason="InvalidSpec",
                                     message=_message(exc), generation=generation)  # fmt: skip
        await _write(rt, body, conditions.dump(status.TenantQuotaStatus(observed_generation=generation,
                                                                         conditions=[ready])))  # fmt: skip
        events.warning(body, reason="InvalidSpec", message=_message(exc))
        return
    async with rt.db.acquire() as conn:
        await applying.apply_tenant_quota(conn, quota)
    rt.room_in(TenantName(quota.metadata.name))
    rt.something_appeared()
    await refresh(rt, body)


async def refresh(rt: runtime.Runtime, body: kopf.Body) -> None:
    generation = body.metadata.get("generation")
    previous = (body.get("status") or {}).get("conditions")
    try:
        quota = parse(body)
    except pydantic.ValidationError:
        return
    async with rt.db.acquire() as conn:
        usage = await observed.tenant_usage(conn, tenant=TenantName(quota.metadata.name))
        budget = await fairness.tenant_budget(conn, tenant=TenantName(quota.metadata.name))
    ready = conditions.condition(previous, type="Ready", value=True, reason="Applied",
                                 message=f"namespaces: {', '.join(quota.spec.namespaces)}"[:1024],
                                 generation=generation)  # fmt: skip
    conds = [ready]
    if budget is not None and budget.budget is not None:
        conds.append(
            conditions.condition(
                previous, type="BudgetExhausted", value=budget.exhausted,
                reason="DailyTokenBudgetSpent" if budget.exhausted else "WithinBudget",
                message=f"{budget.used} of {budget.budget} tokens used today; resets at "
                f"{status.rfc3339(budget.resets_at)}",
                generation=generation,
            )
        )  # fmt: skip
    desired = conditions.dump(
        status.TenantQuotaStatus(
            observed_generation=generation,
            queued_jobs=usage.queued_jobs,
            queued_bytes=usage.queued_bytes,
            in_flight=usage.in_flight,
            tokens_today=budget.used if budget is not None else None,
            conditions=conds,
        )
    )
    await _write(rt, body, desired)


def register(registry_: kopf.OperatorRegistry, rt: runtime.Runtime) -> None:
    resource = (specs.GROUP, specs.VERSION, PLURAL)

    @kopf.on.resume(*resource, registry=registry_)
    @kopf.on.create(*resource, registry=registry_)
    @kopf.on.update(*resource, field="spec", registry=registry_)
    async def apply_quota(body: kopf.Body, **_: Any) -> None:
        await apply(rt, body)

    @kopf.timer(
        *resource,
        id="usage",
        interval=rt.settings.quota_interval_s,
        backoff=rt.settings.quota_interval_s,
        registry=registry_,
    )
    async def usage(body: kopf.Body, **_: Any) -> None:
        try:
            await refresh(rt, body)
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, kube.KubeError) as exc:
            # The next tick retries; kopf's own error backoff would pause the refresh for a minute.
            logger.warning("%s %s: status refresh failed: %s", KIND, body.metadata.name, type(exc).__name__)
