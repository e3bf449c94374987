"""
The objects an InferencePool owns: rendered (`rendering`: pure functions), created when missing,
merge-patched back with `rendering.drift` when a field we render differs.

    provider vllm   Deployment + Service running the vLLM OpenAI server
    every pool      worker Deployment (`lading worker --pool NAMESPACE/NAME`)
    scaling: keda   ScaledObject + TriggerAuthentication; KEDA owns the worker replicas

The replicas of the Deployments are not ours here: the worker Deployment is created with
`minReplicas` and scaled by the scaling step (or KEDA), the engine's by the scaling step.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import kopf

from lading.models import specs
from lading_operator import conditions, events, kube, rendering, runtime

logger = logging.getLogger("lading.operator.pools")

OWNED_KINDS = (
    ("apps/v1", "deployments"),
    ("v1", "services"),
    ("keda.sh/v1alpha1", "scaledobjects"),
    ("keda.sh/v1alpha1", "triggerauthentications"),
)
"""What a pool may own (rendering.py), for the clean-up of a refused pool."""


@dataclasses.dataclass(frozen=True)
class Owned:
    """One object the pool owns: where it lives and what it should be."""

    api_version: str
    plural: str
    body: dict[str, Any]
    replicas_owned: bool = False

    @property
    def path(self) -> str:
        meta = self.body["metadata"]
        return kube.path(self.api_version, self.plural, namespace=meta["namespace"], name=meta["name"])

    @property
    def collection(self) -> str:
        return kube.path(self.api_version, self.plural, namespace=self.body["metadata"]["namespace"])


@dataclasses.dataclass(frozen=True)
class Live:
    """The owned objects as the API server returned them after this step."""

    engine: dict[str, Any] | None
    """The vLLM Deployment (provider vllm only)."""
    worker: dict[str, Any] | None
    worker_path: str


async def ensure_all(
    rt: runtime.Runtime, body: kopf.Body, pool: specs.InferencePool, *, config: rendering.OperatorConfig
) -> Live:
    """Every object the pool owns, rendered and brought to shape; returns the Deployments live."""
    uid = str(body.metadata.uid)
    keda = pool.spec.workers.scaling == "keda"
    live_engine: dict[str, Any] | None = None
    if pool.spec.provider == "vllm":
        live_engine = await ensure(
            rt, body, Owned("apps/v1", "deployments", rendering.vllm_deployment(pool, uid=uid, config=config))
        )
        await ensure(rt, body, Owned("v1", "services", rendering.vllm_service(pool, uid=uid, config=config)))
    worker = Owned(
        "apps/v1", "deployments", rendering.worker_deployment(pool, uid=uid, config=config, replicas=None)
    )
    live_worker = await ensure(rt, body, worker, initial_replicas=None if keda else pool.spec.workers.min_replicas)
    if keda:
        await ensure(
            rt, body,
            Owned("keda.sh/v1alpha1", "triggerauthentications",
                  rendering.keda_trigger_authentication(pool, uid=uid, config=config)),
        )  # fmt: skip
        await ensure(
            rt, body,
            Owned("keda.sh/v1alpha1", "scaledobjects", rendering.keda_scaled_object(pool, uid=uid, config=config)),
        )  # fmt: skip
    return Live(engine=live_engine, worker=live_worker, worker_path=worker.path)


async def ensure(
    rt: runtime.Runtime, body: kopf.Body, owned: Owned, *, initial_replicas: int | None = None
) -> dict[str, Any] | None:
    """Create the object if missing, patch it back to its rendering if it drifted; returns it live."""
    namespace, name = body.metadata.namespace, body.metadata.name
    live = await rt.api.get(owned.path)
    if live is None:
        desired = dict(owned.body)
        if initial_replicas is not None and owned.plural == "deployments":
            desired = {**desired, "spec": {**desired["spec"], "replicas": initial_replicas}}
        created = await rt.api.create(owned.collection, desired)
        logger.info("pool %s/%s: created %s %s", namespace, name, owned.plural, desired["metadata"]["name"])
        return created
    patch = rendering.drift(owned.body, live, replicas_owned=owned.replicas_owned)
    if patch is None:
        return live
    logger.info("pool %s/%s: correcting drift of %s %s", namespace, name, owned.plural,
                owned.body["metadata"]["name"])  # fmt: skip
    events.normal(body, reason=conditions.DRIFT_CORRECTED, message=f"{owned.plural}/{owned.body['metadata']['name']}")
    return await rt.api.merge_patch(owned.path, patch)


async def remove_all(rt: runtime.Runtime, body: kopf.Body) -> None:
    """Delete the Lading-managed objects in the pool's namespace that this pool owns."""
    namespace, name = str(body.metadata.namespace), body.metadata.name
    uid = str(body.metadata.uid)
    for api_version, plural in OWNED_KINDS:
        collection = kube.path(api_version, plural, namespace=namespace)
        try:
            listed = await rt.api.get(f"{collection}?labelSelector={rendering.LABEL_MANAGED_BY}%3Dlading")
        except kube.KubeError as exc:  # a kind this cluster lacks (KEDA) or may not be listed
            logger.debug("pool %s/%s: %s not listed: %s", namespace, name, plural, exc)
            continue
        for item in (listed or {}).get("items") or []:
            meta = item.get("metadata") or {}
            if not any(ref.get("uid") == uid for ref in meta.get("ownerReferences") or ()):
                continue
            if await rt.api.delete(kube.path(api_version, plural, namespace=namespace, name=str(meta.get("name")))):
                logger.info("pool %s/%s: refused; deleted %s %s", namespace, name, plural, meta.get("name"))
