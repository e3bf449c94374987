"""kopf handlers of ExtractionBatch: one reconcile daemon per batch, its wake-ups, the finalizer."""

from __future__ import annotations

from typing import Any

import kopf

from lading.models import specs
from lading_operator import batches, runtime


def register(registry: kopf.OperatorRegistry, rt: runtime.Runtime) -> None:
    resource = (specs.GROUP, specs.VERSION, batches.PLURAL)

    @kopf.daemon(*resource, id="reconcile", registry=registry, cancellation_timeout=10.0)
    async def reconcile(body: kopf.Body, stopped: kopf.DaemonStopped, **_: Any) -> None:
        await batches.Reconciler(rt, body).run(stopped)

    @kopf.on.event(*resource, id="wake", registry=registry)
    async def wake(name: str, namespace: str | None, meta: kopf.Meta, type: str | None, **_: Any) -> None:
        if type == "DELETED":
            rt.tokens.pop(batches.key(namespace or "", name), None)
            return
        rt.wake_on_change(batches.key(namespace or "", name), (meta.get("generation"), meta.get("deletionTimestamp")))

    @kopf.on.delete(*resource, id="cancel-jobs", registry=registry)
    async def cancel_jobs(body: kopf.Body, status: kopf.Status, **_: Any) -> None:
        await batches.deleted(rt, body, live=dict(status or {}))
