"""kopf handlers of TenantQuota: apply on create/update/resume, revoke on delete, refresh the
usage in status every `quota_interval_s`."""

from __future__ import annotations

from typing import Any

import kopf

from lading.models import specs
from lading_operator import quotas, runtime


def register(registry: kopf.OperatorRegistry, rt: runtime.Runtime) -> None:
    resource = (specs.GROUP, specs.VERSION, quotas.PLURAL)

    @kopf.on.resume(*resource, registry=registry)
    @kopf.on.create(*resource, registry=registry)
    @kopf.on.update(*resource, field="spec", registry=registry)
    async def apply_quota(body: kopf.Body, **_: Any) -> None:
        await quotas.apply(rt, body)

    @kopf.on.delete(*resource, registry=registry)
    async def revoke_quota(body: kopf.Body, **_: Any) -> None:
        await quotas.revoke(rt, body)

    @kopf.timer(
        *resource,
        id="usage",
        interval=rt.settings.quota_interval_s,
        backoff=rt.settings.quota_interval_s,
        registry=registry,
    )
    async def usage(body: kopf.Body, **_: Any) -> None:
        await quotas.refresh_tick(rt, body)
