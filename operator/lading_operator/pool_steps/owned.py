"""
The objects an InferencePool owns: rendered (`rendering`: pure functions), written with server-side
apply (kube.py: field manager `lading-operator`, forced) and deleted when the pool no longer renders
them (pruning).

    provider vllm   Deployment + Service running the vLLM OpenAI server
    every pool      worker Deployment (`lading worker --pool NAMESPACE/NAME`)
    scaling: keda   ScaledObject + TriggerAuthentication; KEDA owns the worker replicas

Each step reads each object (Deployments and Services from what kopf's watch and our own writes
last said, `runtime.owned`, without a request; KEDA's kinds with a GET) and applies the whole
rendering only when needed
(`drift.up_to_date`): the object is missing, it was applied from another rendering (the hash
annotation `lading.dev/applied-sha256` differs: the spec or the operator changed), or someone changed
a field we render. The API server then removes what we applied before and no longer render (a removed
`nodeSelector`). A missing object is created with a plain create first (an apply would take over an
object of that name someone made since it was read; the create fails instead) and then applied, so
that its fields are the apply's from the start. A DriftCorrected event is posted only for an object
applied from the current rendering that someone changed, and only when the apply changed it back
(its resourceVersion moved). A pool at rest costs no request for its Deployments and Services, one GET per KEDA object
per step, and no write.

Ownership is the controller owner reference to this pool (its uid). An object with one of our names
that is not ours (made by hand, by another tool, or left by a deleted pool of the same name) is never
adopted nor changed: `NotOwned` stops the step and the pool reports Ready=False, reason ResourceExists.
Pruning deletes what carries our managed-by label and this pool's owner reference but is no longer
rendered (switching `provider` from vllm leaves no GPU Deployment running; switching `scaling` from keda
leaves no ScaledObject fighting the builtin scaler). It lists the owned kinds, so it runs once per spec
generation (and once when the loop starts), not on every tick.

The replicas of the Deployments are not in the rendering: the scaling step (or KEDA) owns them and
writes them with merge patches. The applied worker Deployment of a builtin-scaled pool carries the
live replica count (`minReplicas` when it is created), so the apply never changes it and never hands
it back to the API server's default; the vLLM Deployment's and a KEDA-scaled worker's are never applied.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import kopf

from lading.models import specs
from lading_operator import conditions, drift, events, kube, rendering, runtime

logger = logging.getLogger("lading.operator.pools")

OWNED_KINDS = (
    ("apps/v1", "deployments"),
    ("v1", "services"),
    ("keda.sh/v1alpha1", "scaledobjects"),
    ("keda.sh/v1alpha1", "triggerauthentications"),
)
"""What a pool may own (rendering.py), for pruning and for the clean-up of a refused pool."""
WATCHED = frozenset({"deployments", "services"})
"""Owned kinds kopf watches (handlers/pools.py): read from `runtime.owned` when kept there, else with a GET."""

ObjectId = tuple[str, str, str]
"""(apiVersion, plural, name) of an owned object in the pool's namespace."""


class NotOwned(Exception):
    """An object with the name of one the pool renders exists and is not the pool's: it is left alone."""

    def __init__(self, plural: str, name: str) -> None:
        super().__init__(f"{plural}/{name} exists and is not owned by this InferencePool; "
                         "Lading does not adopt it: delete or rename it")  # fmt: skip
        self.plural = plural
        self.name = name


@dataclasses.dataclass(frozen=True)
class Owned:
    """One object the pool owns: where it lives and what it should be."""

    api_version: str
    plural: str
    body: dict[str, Any]

    @property
    def path(self) -> str:
        meta = self.body["metadata"]
        return kube.path(self.api_version, self.plural, namespace=meta["namespace"], name=meta["name"])

    @property
    def collection(self) -> str:
        return kube.path(self.api_version, self.plural, namespace=self.body["metadata"]["namespace"])

    @property
    def cache_key(self) -> runtime.ObjectKey:
        meta = self.body["metadata"]
        return (self.plural, str(meta["namespace"]), str(meta["name"]))

    @property
    def id(self) -> ObjectId:
        return (self.api_version, self.plural, str(self.body["metadata"]["name"]))


@dataclasses.dataclass(frozen=True)
class Live:
    """The owned objects as the API server returned them after this step."""

    engine: dict[str, Any] | None
    """The vLLM Deployment (provider vllm only)."""
    worker: dict[str, Any] | None
    worker_path: str
    rendered: frozenset[ObjectId] = frozenset()
    """Every object the pool renders now: what pruning keeps."""


async def ensure_all(
    rt: runtime.Runtime, body: kopf.Body, pool: specs.InferencePool, *, config: rendering.OperatorConfig
) -> Live:
    """Every object the pool owns, rendered and brought to shape; returns the Deployments live."""
    uid = str(body.metadata.uid)
    keda = pool.spec.workers.scaling == "keda"
    rendered: list[ObjectId] = []
    live_engine: dict[str, Any] | None = None
    if pool.spec.provider == "vllm":
        engine = Owned("apps/v1", "deployments", rendering.vllm_deployment(pool, uid=uid, config=config))
        service = Owned("v1", "services", rendering.vllm_service(pool, uid=uid, config=config))
        rendered += [engine.id, service.id]
        live_engine = await ensure(rt, body, engine)
        await ensure(rt, body, service)
    worker = Owned(
        "apps/v1", "deployments", rendering.worker_deployment(pool, uid=uid, config=config, replicas=None)
    )
    rendered.append(worker.id)
    live_worker = await ensure(rt, body, worker, initial_replicas=None if keda else pool.spec.workers.min_replicas)
    if keda:
        for owned in (
            Owned("keda.sh/v1alpha1", "triggerauthentications",
                  rendering.keda_trigger_authentication(pool, uid=uid, config=config)),
            Owned("keda.sh/v1alpha1", "scaledobjects", rendering.keda_scaled_object(pool, uid=uid, config=config)),
        ):  # fmt: skip
            rendered.append(owned.id)
            await ensure(rt, body, owned)
    return Live(engine=live_engine, worker=live_worker, worker_path=worker.path, rendered=frozenset(rendered))


async def ensure(
    rt: runtime.Runtime, body: kopf.Body, owned: Owned, *, initial_replicas: int | None = None
) -> dict[str, Any] | None:
    """Apply the object when it is missing or not as rendered; returns it live. `initial_replicas`:
    the replicas of a Deployment whose count the builtin scaler writes (kept as they are live).
    Raises NotOwned for an object of that name that is not this pool's."""
    namespace, name = body.metadata.namespace, body.metadata.name
    live = rt.owned.get(owned.cache_key) if owned.plural in WATCHED else None
    if live is None:
        live = await rt.api.get(owned.path)
    if live is not None and not _owned_by(live, uid=str(body.metadata.uid)):
        raise NotOwned(owned.plural, str(owned.body["metadata"]["name"]))
    if live is not None and drift.up_to_date(owned.body, live):
        return live
    same_rendering = live is not None and drift.applied_hash(owned.body) == (
        (live.get("metadata") or {}).get("annotations") or {}
    ).get(drift.APPLIED_HASH_ANNOTATION)
    desired = drift.stamped(owned.body)
    if initial_replicas is not None and owned.plural == "deployments":
        replicas = ((live or {}).get("spec") or {}).get("replicas", initial_replicas)
        desired = {**desired, "spec": {**desired["spec"], "replicas": replicas}}
    if live is None:
        await _create(rt, body, owned, desired)
    applied = await rt.api.apply(owned.path, desired)
    if owned.plural in WATCHED:
        rt.remember(owned.plural, applied)
    what = f"{owned.plural}/{owned.body['metadata']['name']}"
    if live is None:
        logger.info("pool %s/%s: created %s", namespace, name, what)
    elif not same_rendering:
        logger.info("pool %s/%s: applied the new rendering of %s", namespace, name, what)
    elif _version(applied) != _version(live):
        logger.info("pool %s/%s: corrected drift of %s", namespace, name, what)
        events.normal(body, reason=conditions.DRIFT_CORRECTED, message=what)
    return applied


async def _create(rt: runtime.Runtime, body: kopf.Body, owned: Owned, desired: dict[str, Any]) -> None:
    """Create a missing object with a plain create, which fails (409) for an object someone made since
    it was read: an apply would take that one over. The apply that follows makes its fields ours."""
    try:
        await rt.api.create(owned.collection, desired)
    except kube.KubeError as exc:
        if exc.status != 409:
            raise
        live = await rt.api.get(owned.path)
        if live is not None and not _owned_by(live, uid=str(body.metadata.uid)):
            raise NotOwned(owned.plural, str(owned.body["metadata"]["name"])) from None


def _version(obj: dict[str, Any]) -> Any:
    return (obj.get("metadata") or {}).get("resourceVersion")


def _owned_by(live: dict[str, Any], *, uid: str) -> bool:
    return any(ref.get("uid") == uid for ref in (live.get("metadata") or {}).get("ownerReferences") or ())


async def remove_all(rt: runtime.Runtime, body: kopf.Body) -> None:
    """Delete the Lading-managed objects in the pool's namespace that this pool owns."""
    for api_version, plural, name in await _owned_objects(rt, body):
        rt.forget(plural, str(body.metadata.namespace), name)
        if await rt.api.delete(kube.path(api_version, plural, namespace=str(body.metadata.namespace), name=name)):
            logger.info("pool %s/%s: refused; deleted %s %s", body.metadata.namespace, body.metadata.name,
                        plural, name)  # fmt: skip


async def prune(rt: runtime.Runtime, body: kopf.Body, *, keep: frozenset[ObjectId]) -> list[ObjectId]:
    """Delete the objects this pool owns and no longer renders (not in `keep`); returns them."""
    namespace = str(body.metadata.namespace)
    pruned: list[ObjectId] = []
    for api_version, plural, name in await _owned_objects(rt, body):
        if (api_version, plural, name) in keep:
            continue
        rt.forget(plural, namespace, name)
        if await rt.api.delete(kube.path(api_version, plural, namespace=namespace, name=name)):
            logger.info("pool %s/%s: no longer rendered; deleted %s %s", namespace, body.metadata.name, plural, name)
            events.normal(body, reason=conditions.PRUNED, message=f"{plural}/{name} is no longer rendered: deleted")
            pruned.append((api_version, plural, name))
    return pruned


async def _owned_objects(rt: runtime.Runtime, body: kopf.Body) -> list[ObjectId]:
    """The Lading-managed objects of the pool's namespace whose owner reference is this pool."""
    namespace, uid = str(body.metadata.namespace), str(body.metadata.uid)
    found: list[ObjectId] = []
    for api_version, plural in OWNED_KINDS:
        collection = kube.path(api_version, plural, namespace=namespace)
        try:
            listed = await rt.api.get(f"{collection}?labelSelector={rendering.LABEL_MANAGED_BY}%3Dlading")
        except kube.KubeError as exc:  # a kind this cluster lacks (KEDA) or may not be listed
            logger.debug("pool %s/%s: %s not listed: %s", namespace, body.metadata.name, plural, exc)
            continue
        for item in (listed or {}).get("items") or []:
            if _owned_by(item, uid=uid):
                found.append((api_version, plural, str((item.get("metadata") or {}).get("name"))))
    return found
