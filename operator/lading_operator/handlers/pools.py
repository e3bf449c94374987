"""kopf handlers of InferencePool: one reconcile daemon per pool, woken by its own changes and by
any change of a Deployment or Service it owns (drift)."""

from __future__ import annotations

from typing import Any

import kopf

from lading.models import specs
from lading_operator import pools, rendering, runtime


def register(registry: kopf.OperatorRegistry, rt: runtime.Runtime) -> None:
    resource = (specs.GROUP, specs.VERSION, pools.PLURAL)

    @kopf.daemon(*resource, id="reconcile", registry=registry, cancellation_timeout=10.0)
    async def reconcile(body: kopf.Body, stopped: kopf.DaemonStopped, **_: Any) -> None:
        await pools.Reconciler(rt, body).run(stopped)

    @kopf.on.event(*resource, id="wake", registry=registry)
    async def wake(name: str, namespace: str | None, meta: kopf.Meta, type: str | None, **_: Any) -> None:
        if type == "DELETED":
            rt.tokens.pop(pools.key(namespace or "", name), None)
            return
        token = (meta.get("generation"), meta.get("deletionTimestamp"),
                 meta.annotations.get(pools.METRICS_URL_ANNOTATION))  # fmt: skip
        rt.wake_on_change(pools.key(namespace or "", name), token)

    owned_by_lading = {rendering.LABEL_MANAGED_BY: "lading"}

    @kopf.on.event("apps", "v1", "deployments", id="owned-deployment", labels=owned_by_lading, registry=registry)
    async def owned_deployment(body: kopf.Body, **_: Any) -> None:
        pool = pools.owner_pool(body)
        if pool is not None:
            rt.wake(pool)

    @kopf.on.event("", "v1", "services", id="owned-service", labels=owned_by_lading, registry=registry)
    async def owned_service(body: kopf.Body, **_: Any) -> None:
        pool = pools.owner_pool(body)
        if pool is not None:
            rt.wake(pool)
