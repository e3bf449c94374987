"""kopf handlers of DeliveryEndpoint: reconcile on create/update/resume and every
`quota_interval_s` (status and the secret's mirrors), forget its mirrors on delete."""

from __future__ import annotations

from typing import Any

import kopf

from lading.models import specs
from lading_operator import endpoints, runtime


def register(registry: kopf.OperatorRegistry, rt: runtime.Runtime) -> None:
    resource = (specs.GROUP, specs.VERSION, endpoints.PLURAL)

    @kopf.on.resume(*resource, registry=registry)
    @kopf.on.create(*resource, registry=registry)
    @kopf.on.update(*resource, field="spec", registry=registry)
    async def apply_endpoint(body: kopf.Body, **_: Any) -> None:
        await endpoints.reconcile(rt, body, mirror=True)

    @kopf.timer(
        *resource, interval=rt.settings.quota_interval_s, backoff=rt.settings.quota_interval_s, registry=registry
    )
    async def endpoint_health(body: kopf.Body, **_: Any) -> None:
        await endpoints.refresh_tick(rt, body)

    @kopf.on.delete(*resource, optional=True, registry=registry)
    async def forget_endpoint(name: str, namespace: str | None, **_: Any) -> None:
        await endpoints.forget(rt, f"{namespace}/{name}")
