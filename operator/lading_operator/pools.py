"""InferencePool reconciler (first slice: mirror into `pools`)."""

from __future__ import annotations

from typing import Any

import kopf

from lading import applying
from lading.models import specs
from lading_operator import runtime

KIND = "InferencePool"
PLURAL = "inferencepools"


def parse(body: kopf.Body) -> specs.InferencePool:
    return specs.InferencePool.model_validate(
        {
            "apiVersion": specs.API_VERSION,
            "kind": KIND,
            "metadata": {"name": body.metadata.name, "namespace": body.metadata.namespace, "uid": body.metadata.uid},
            "spec": dict(body.spec),
        }
    )


def register(registry_: kopf.OperatorRegistry, rt: runtime.Runtime) -> None:
    resource = (specs.GROUP, specs.VERSION, PLURAL)

    @kopf.on.resume(*resource, registry=registry_)
    @kopf.on.create(*resource, registry=registry_)
    @kopf.on.update(*resource, field="spec", registry=registry_)
    async def apply_pool(body: kopf.Body, **_: Any) -> None:
        async with rt.db.acquire() as conn:
            await applying.apply_inference_pool(conn, parse(body))
        rt.something_appeared()
