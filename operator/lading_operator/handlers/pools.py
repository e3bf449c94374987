"""kopf handlers of InferencePool: one reconcile daemon per pool, woken by its own changes and by
any change of a Deployment or Service it owns (drift), whose latest body is kept (`runtime.owned`)
so that a pool's steps read it without a GET.

The owned-object watches ask the API server for Lading's objects only (`OWNED_SELECTOR` in kopf's
`settings.watching.label_selectors`, see `select_owned`): the operator neither receives nor keeps the
cluster's other Deployments and Services. The `labels=` filters on the handlers say the same for a
reader of this module and keep them correct should a watch ever be unfiltered."""

from __future__ import annotations

from typing import Any

import kopf

from lading.models import specs
from lading_operator import pools, rendering, runtime

OWNED_LABELS = {rendering.LABEL_MANAGED_BY: "lading"}
OWNED_SELECTOR = ",".join(f"{key}={value}" for key, value in OWNED_LABELS.items())
OWNED_RESOURCES = (("apps", "v1", "deployments"), ("", "v1", "services"))
"""The kinds a pool owns that kopf watches; every rendered one carries OWNED_LABELS (rendering.labels)."""


def select_owned(settings: kopf.OperatorSettings) -> None:
    """Watch only the Deployments and Services Lading manages (server-side label selector)."""
    for resource in OWNED_RESOURCES:
        settings.watching.label_selectors[resource] = OWNED_SELECTOR


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

    @kopf.on.event("apps", "v1", "deployments", id="owned-deployment", labels=OWNED_LABELS, registry=registry)
    async def owned_deployment(body: kopf.Body, type: str | None, **_: Any) -> None:
        _cache(rt, "deployments", body, type)
        pool = pools.owner_pool(body)
        if pool is not None:
            rt.wake(pool)

    @kopf.on.event("", "v1", "services", id="owned-service", labels=OWNED_LABELS, registry=registry)
    async def owned_service(body: kopf.Body, type: str | None, **_: Any) -> None:
        _cache(rt, "services", body, type)
        pool = pools.owner_pool(body)
        if pool is not None:
            rt.wake(pool)


def _cache(rt: runtime.Runtime, plural: str, body: kopf.Body, event: str | None) -> None:
    """Keep what the watch says of an owned object (runtime.owned): pool steps read it instead of a GET."""
    if event == "DELETED":  # deleted, or no longer labelled as Lading's: read it from the API server again
        rt.forget(plural, str(body.metadata.namespace or ""), str(body.metadata.name or ""))
    else:
        rt.remember(plural, body)
