"""
InferencePool reconciler: mirror into `pools`, keep the owned objects in shape, scale the workers,
report status.

One reconcile loop per pool (a kopf daemon), woken by the pool's own watch events, by any change
of an object it owns (a Deployment or Service edited or deleted by hand: drift), or every
`pool_interval_s` (the scaler's period, like an HPA's):

    1. the spec is mirrored into `pools` (what admission and the workers read) when it changed;
    2. owned objects are rendered (`rendering`: pure functions) and brought to shape: created when
       missing, merge-patched with `rendering.drift` when a field we render differs;
         provider vllm   Deployment + Service running the vLLM OpenAI server
         every pool      worker Deployment (`lading worker --pool NAMESPACE/NAME`)
         scaling: keda   ScaledObject + TriggerAuthentication; KEDA owns the worker replicas
    3. scaling (builtin): signals from PostgreSQL (`lading.db.scaling.pool_signals`) and the provider's
       headroom (vLLM `/metrics` of the pool's Service, or the pause/429 state of an external
       provider) go through `scaling.decide`; its replicas are written to the worker Deployment
       (and the engine replicas to the vLLM Deployment), its reason to status.scalingReason;
    4. status: endpoint, ready vLLM replicas, workers, desired workers and why, headroom, and the
       conditions Ready, Degraded and Paused (spec.paused, or pools.paused_until set by workers when
       the provider refused the key or the quota).

Pools live only in platform namespaces (`OperatorSettings.pool_namespaces`, `lading operator
--pool-namespaces`): a pool's workers hold the signing secret of every DeliveryEndpoint (mirroring.py),
so a pool in a namespace a tenant controls would hand that tenant everyone's secrets. A pool anywhere
else is refused: status Ready=False, reason PoolNamespaceNotAllowed; nothing is rendered, no secret is
mirrored, and it is not written into `pools` (no batch can be admitted to it). Its loop still runs, to
report that and to clean up once what an earlier operator left there: the mirrors in its namespace,
the objects it owned, its `pools` row unless a batch refers to it.

Where the vLLM metrics are scraped: the Service (`http://<pool>-vllm.<ns>.svc:8000/metrics`); the
pool's annotation `lading.dev/vllm-metrics-url` only with `--allow-vllm-metrics-override` and through
the egress policy (`headroom.pool_vllm_load`).
The scaler's memory (its stabilisation window) is kept in the loop; after a restart it starts
afresh, which can only delay a scale-down, never cause one.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

import aiohttp
import kopf
import pydantic

from lading import applying
from lading.db import registry
from lading.db import scaling as db_scaling
from lading.ids import PoolName
from lading.models import specs
from lading_operator import (
    conditions,
    events,
    headroom,
    kube,
    mirroring,
    reconciling,
    rendering,
    runtime,
    scaling,
    status,
)

logger = logging.getLogger("lading.operator.pools")

KIND = "InferencePool"
PLURAL = "inferencepools"
METRICS_URL_ANNOTATION = headroom.METRICS_URL_ANNOTATION
POOL_NAMESPACE_NOT_ALLOWED = "PoolNamespaceNotAllowed"
"""Ready=False reason of a pool outside the platform namespaces the operator was given."""
OWNED_KINDS = (
    ("apps/v1", "deployments"),
    ("v1", "services"),
    ("keda.sh/v1alpha1", "scaledobjects"),
    ("keda.sh/v1alpha1", "triggerauthentications"),
)
"""What a pool may own (rendering.py), for the clean-up of a refused pool."""


def key(namespace: str, name: str) -> runtime.ObjectKey:
    return (KIND, namespace, name)


def parse(body: Mapping[str, Any]) -> specs.InferencePool:
    meta = body.get("metadata", {})
    return specs.InferencePool.model_validate(
        {
            "apiVersion": specs.API_VERSION,
            "kind": KIND,
            "metadata": {"name": meta.get("name"), "namespace": meta.get("namespace"), "uid": meta.get("uid")},
            "spec": dict(body.get("spec") or {}),
        }
    )


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


class Reconciler:
    def __init__(self, rt: runtime.Runtime, body: kopf.Body) -> None:
        self.rt = rt
        self.body = body
        self.namespace = str(body.metadata.namespace)
        self.name = str(body.metadata.name)
        self.key = key(self.namespace, self.name)
        self.mirrored: int | None = None
        self.swept = False
        self.cleaned = False
        self.state = scaling.ScaleState()
        self.last_written: dict[str, Any] = dict(body.get("status") or {})

    async def run(self, stopped: Any) -> None:
        async with aiohttp.ClientSession() as session:

            async def step() -> float:
                await self.reconcile(session)
                return self.rt.settings.pool_interval_s

            try:
                await reconciling.reconcile_forever(
                    step, rt=self.rt, key=self.key, body=self.body,
                    name=f"pool {self.namespace}/{self.name}", stopped=stopped,
                )
            finally:
                self.rt.wakeups.pop(self.key, None)
                self.rt.tokens.pop(self.key, None)

    async def reconcile(self, session: aiohttp.ClientSession) -> None:
        generation = self.body.metadata.get("generation")
        previous = self.last_written.get("conditions")
        if not mirroring.allowed(self.rt, self.namespace):
            await self._refuse(generation, previous)
            return
        try:
            pool = parse(self.body)
        except pydantic.ValidationError as exc:
            first = exc.errors()[0]
            message = f"spec.{'.'.join(str(p) for p in first['loc'])}: {first['msg']}"
            ready = conditions.condition(
                previous, type="Ready", value=False, reason="InvalidSpec", message=message, generation=generation
            )
            await self._write(
                conditions.dump(status.InferencePoolStatus(observed_generation=generation, conditions=[ready]))
            )
            return
        uid = str(self.body.metadata.uid)
        name = applying.pool_key(self.namespace, self.name)
        if self.mirrored != generation:
            async with self.rt.db.acquire() as conn:
                await applying.apply_inference_pool(conn, pool)
            self.mirrored = generation
            self.rt.something_appeared()
        if not self.swept:  # once per loop: mirrors of endpoints deleted while the operator was down
            await mirroring.sweep(self.rt, self.namespace)
            self.swept = True
        # Every endpoint's signing secret: its own namespace's by reference, the others' mirrored here first.
        config = dataclasses.replace(
            self.rt.settings.render, endpoint_secrets=await mirroring.for_namespace(self.rt, self.namespace)
        )
        keda = pool.spec.workers.scaling == "keda"
        vllm = pool.spec.provider == "vllm"

        # Owned objects other than the scaled replicas: rendered, created or corrected.
        live_engine: dict[str, Any] | None = None
        if vllm:
            live_engine = await self._ensure(
                Owned("apps/v1", "deployments", rendering.vllm_deployment(pool, uid=uid, config=config))
            )
            await self._ensure(Owned("v1", "services", rendering.vllm_service(pool, uid=uid, config=config)))
        worker = Owned(
            "apps/v1", "deployments", rendering.worker_deployment(pool, uid=uid, config=config, replicas=None)
        )
        live_worker = await self._ensure(worker, initial_replicas=None if keda else pool.spec.workers.min_replicas)
        if keda:
            await self._ensure(
                Owned("keda.sh/v1alpha1", "triggerauthentications",
                      rendering.keda_trigger_authentication(pool, uid=uid, config=config))
            )  # fmt: skip
            await self._ensure(
                Owned("keda.sh/v1alpha1", "scaledobjects", rendering.keda_scaled_object(pool, uid=uid, config=config))
            )

        # Scaling.
        ready_replicas = int(((live_engine or {}).get("status") or {}).get("readyReplicas") or 0)
        engine_desired = int(((live_engine or {}).get("spec") or {}).get("replicas") or 0)
        current = int(((live_worker or {}).get("spec") or {}).get("replicas") or 0)
        async with self.rt.db.acquire() as conn:
            load = await db_scaling.pool_signals(conn, pool=PoolName(name))
        pausing = load.paused_until is not None and load.paused_until > load.at
        room = await self._headroom(session, pool, load, ready=ready_replicas, desired=engine_desired)
        signals = scaling.Signals(
            now=load.at,
            current_replicas=current,
            eligible_backlog=load.eligible_backlog,
            oldest_eligible_age_s=load.oldest_eligible_age_s,
            in_flight=load.in_flight,
            mean_latency_s=load.mean_latency_s,
            mean_tokens_per_attempt=load.mean_tokens_per_attempt,
            headroom=room,
            cooldown_until=max(
                (t for t in (load.cooldown_until, load.paused_until if pausing else None) if t is not None),
                default=None,
            ),
        )
        decision, self.state = scaling.decide(pool.spec, signals, self.state)
        workers_now = current
        if not keda and decision.replicas != current:
            await self.rt.api.merge_patch(worker.path, {"spec": {"replicas": decision.replicas}})
            workers_now = decision.replicas
            events.normal(
                self.body, reason="Scaled", message=f"workers {current} -> {decision.replicas}: {decision.reason}"
            )
        if vllm and not keda and decision.engine_replicas is not None and decision.engine_replicas != engine_desired:
            engine_path = kube.path(
                "apps/v1", "deployments", namespace=self.namespace, name=rendering.object_name(pool, "vllm")
            )
            await self.rt.api.merge_patch(engine_path, {"spec": {"replicas": decision.engine_replicas}})

        # Status.
        endpoint = None
        if vllm:
            endpoint = rendering.vllm_endpoint_url(pool)
        elif pool.spec.endpoint is not None:
            endpoint = pool.spec.endpoint.url
        if pool.spec.paused:
            paused = conditions.condition(
                previous, type="Paused", value=True, reason="PausedBySpec",
                message="spec.paused is true: no new jobs are claimed", generation=generation,
            )  # fmt: skip
        elif pausing:
            refused = (load.paused_reason or "the provider refused the key or quota")[:1024]
            paused = conditions.condition(
                previous, type="Paused", value=True, reason="ProviderRefused", message=refused, generation=generation
            )
        else:
            paused = conditions.condition(
                previous, type="Paused", value=False, reason="Claiming", generation=generation
            )
        if vllm:
            engine_ready = ready_replicas > 0 or engine_desired == 0
            not_ready = "ScaledToZero" if engine_desired == 0 else "EngineStarting"
            ready = conditions.condition(
                previous, type="Ready", value=ready_replicas > 0,
                reason="EngineReady" if ready_replicas > 0 else not_ready,
                message=f"{ready_replicas}/{engine_desired} vLLM replicas ready", generation=generation,
            )  # fmt: skip
            degraded = conditions.condition(
                previous, type="Degraded", value=not engine_ready or ready_replicas < engine_desired,
                reason="ReplicasUnavailable" if ready_replicas < engine_desired else "AllReplicasReady",
                generation=generation,
            )  # fmt: skip
        else:
            ready = conditions.condition(previous, type="Ready", value=True, reason="Applied",
                                         message="workers and limits in place", generation=generation)  # fmt: skip
            degraded = conditions.condition(previous, type="Degraded", value=False, reason="Healthy",
                                            generation=generation)  # fmt: skip
        last_scale = self.state.last_scale_at
        desired = conditions.dump(
            status.InferencePoolStatus(
                observed_generation=generation,
                endpoint=endpoint,
                ready_replicas=ready_replicas,
                workers=workers_now,
                desired_workers=decision.replicas,
                scaling_reason=decision.reason[:256],
                headroom=room.render(),
                last_scale_time=status.rfc3339(last_scale) if last_scale is not None else None,
                paused_until=status.rfc3339(load.paused_until) if pausing and load.paused_until is not None else None,
                conditions=[ready, degraded, paused],
            )
        )
        await self._write(desired)

    async def _refuse(self, generation: int | None, previous: Any) -> None:
        """The pool is outside the platform namespaces: report it; once, remove what an earlier
        operator made for it (mirrors in its namespace, its owned objects, its `pools` row)."""
        allowed = ", ".join(self.rt.settings.pool_namespaces)
        message = (f"InferencePools live only in the platform namespaces ({allowed}); nothing runs for a pool "
                   f"in {self.namespace} and no batch can use it")  # fmt: skip
        if not self.cleaned:
            await mirroring.sweep(self.rt, self.namespace)
            await self._remove_owned()
            async with self.rt.db.acquire() as conn:
                gone = await registry.delete_pool_if_unused(conn, name=applying.pool_key(self.namespace, self.name))
            if not gone:
                logger.warning("pool %s/%s: refused, but batches refer to its registration, which stays",
                               self.namespace, self.name)  # fmt: skip
            self.cleaned = True
        ready = conditions.condition(previous, type="Ready", value=False, reason=POOL_NAMESPACE_NOT_ALLOWED,
                                     message=message, generation=generation)  # fmt: skip
        desired = conditions.dump(status.InferencePoolStatus(observed_generation=generation, conditions=[ready]))
        if not any(c.get("reason") == POOL_NAMESPACE_NOT_ALLOWED for c in previous or ()):
            events.warning(self.body, reason=POOL_NAMESPACE_NOT_ALLOWED, message=message)
        await self._write(desired)

    async def _remove_owned(self) -> None:
        """Delete the Lading-managed objects in the pool's namespace that this pool owns."""
        uid = str(self.body.metadata.uid)
        for api_version, plural in OWNED_KINDS:
            collection = kube.path(api_version, plural, namespace=self.namespace)
            try:
                listed = await self.rt.api.get(f"{collection}?labelSelector={rendering.LABEL_MANAGED_BY}%3Dlading")
            except kube.KubeError as exc:  # a kind this cluster lacks (KEDA) or may not be listed
                logger.debug("pool %s/%s: %s not listed: %s", self.namespace, self.name, plural, exc)
                continue
            for item in (listed or {}).get("items") or []:
                meta = item.get("metadata") or {}
                if not any(ref.get("uid") == uid for ref in meta.get("ownerReferences") or ()):
                    continue
                if await self.rt.api.delete(kube.path(api_version, plural, namespace=self.namespace,
                                                      name=str(meta.get("name")))):  # fmt: skip
                    logger.info("pool %s/%s: refused; deleted %s %s", self.namespace, self.name, plural,
                                meta.get("name"))  # fmt: skip

    async def _headroom(
        self,
        session: aiohttp.ClientSession,
        pool: specs.InferencePool,
        load: db_scaling.PoolLoad,
        *,
        ready: int,
        desired: int,
    ) -> scaling.Headroom:
        if pool.spec.provider == "vllm":
            if ready == 0 and desired > 0:
                return headroom.engine_not_ready(ready=ready, desired=desired)
            scraped = await headroom.pool_vllm_load(
                session, body=self.body, service_url=rendering.vllm_endpoint_url(pool).removesuffix("/v1") + "/metrics",
                override=self.rt.settings.vllm_metrics_override, egress_allow=self.rt.settings.egress_allow,
            )  # fmt: skip
            engine = pool.spec.vllm.engine_args.max_num_seqs if pool.spec.vllm is not None else None
            return headroom.vllm_headroom(scraped, max_num_seqs=engine, replicas=max(ready, 1))
        if pool.spec.provider == "openai-compatible":
            return headroom.external_headroom(
                now=load.at,
                paused_until=load.paused_until,
                paused_reason=load.paused_reason,
                cooldown_until=load.cooldown_until,
            )
        return scaling.Headroom.unknown("builtin provider")

    async def _ensure(self, owned: Owned, *, initial_replicas: int | None = None) -> dict[str, Any] | None:
        """Create the object if missing, patch it back to its rendering if it drifted; returns it live."""
        live = await self.rt.api.get(owned.path)
        if live is None:
            body = dict(owned.body)
            if initial_replicas is not None and owned.plural == "deployments":
                body = {**body, "spec": {**body["spec"], "replicas": initial_replicas}}
            created = await self.rt.api.create(owned.collection, body)
            logger.info("pool %s/%s: created %s %s", self.namespace, self.name, owned.plural, body["metadata"]["name"])
            return created
        patch = rendering.drift(owned.body, live, replicas_owned=owned.replicas_owned)
        if patch is None:
            return live
        logger.info("pool %s/%s: correcting drift of %s %s", self.namespace, self.name, owned.plural,
                    owned.body["metadata"]["name"])  # fmt: skip
        events.normal(self.body, reason="DriftCorrected", message=f"{owned.plural}/{owned.body['metadata']['name']}")
        return await self.rt.api.merge_patch(owned.path, patch)

    async def _write(self, desired: dict[str, Any]) -> None:
        written = await conditions.write_status(
            self.rt.api, api_version=specs.API_VERSION, plural=PLURAL, namespace=self.namespace, name=self.name,
            live=self.last_written, desired=desired,
        )  # fmt: skip
        if written:
            self.last_written = {**self.last_written, **desired}


def owner_pool(body: Mapping[str, Any]) -> runtime.ObjectKey | None:
    """The pool owning `body` (a Deployment or Service Lading rendered), if any."""
    meta = body.get("metadata") or {}
    for ref in meta.get("ownerReferences") or ():
        if ref.get("kind") == KIND and str(ref.get("apiVersion", "")).startswith(specs.GROUP + "/"):
            return key(str(meta.get("namespace") or ""), str(ref.get("name")))
    return None
