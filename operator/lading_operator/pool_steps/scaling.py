"""
Scaling a pool (`workers.scaling: builtin`): signals from PostgreSQL (`lading.db.registry.
pool_signals`) and the provider's headroom (vLLM `/metrics` of the pool's Service, or the pause/429
state of an external provider) go through `lading_operator.scaling.decide`; its replicas are written
to the worker Deployment (and the engine replicas to the vLLM Deployment). Under KEDA the decision
is still computed, for status, but KEDA owns the replicas.

Where the vLLM metrics are scraped: the Service (`http://<pool>-vllm.<ns>.svc:8000/metrics`); the
pool's annotation `lading.dev/vllm-metrics-url` only with `--allow-vllm-metrics-override` and through
the egress policy (`headroom.pool_vllm_load`).
The scaler's memory (its stabilisation window) is kept in the loop; after a restart it starts
afresh, which can only delay a scale-down, never cause one.
"""

from __future__ import annotations

import dataclasses

import aiohttp
import kopf

from lading import applying
from lading.db import gpu_time, registry
from lading.models import specs
from lading_operator import conditions, events, headroom, kube, rendering, runtime, scaling
from lading_operator.pool_steps import owned


@dataclasses.dataclass(frozen=True)
class Scaled:
    """What the scaling step saw and decided, for the status step."""

    load: registry.PoolLoad
    pausing: bool
    """The workers paused the pool (the provider refused the key or quota) until a time still ahead."""
    room: scaling.Headroom
    decision: scaling.Decision
    ready_replicas: int
    """Ready vLLM replicas (0 for other providers)."""
    engine_desired: int
    workers_now: int
    """Worker replicas after this step."""


class Scaler:
    """One pool's scaler: owns the stabilisation window (`scaling.ScaleState`) between steps."""

    def __init__(self, rt: runtime.Runtime, body: kopf.Body) -> None:
        self.rt = rt
        self.body = body
        self.state = scaling.ScaleState()

    async def step(self, session: aiohttp.ClientSession, pool: specs.InferencePool, live: owned.Live) -> Scaled:
        keda = pool.spec.workers.scaling == "keda"
        vllm = pool.spec.provider == "vllm"
        ready_replicas = int(((live.engine or {}).get("status") or {}).get("readyReplicas") or 0)
        engine_desired = int(((live.engine or {}).get("spec") or {}).get("replicas") or 0)
        current = int(((live.worker or {}).get("spec") or {}).get("replicas") or 0)
        async with self.rt.db.acquire() as conn:
            name = applying.pool_key(str(self.body.metadata.namespace), str(self.body.metadata.name))
            load = await registry.pool_signals(conn, pool=name)
            await gpu_time.record_gpu_replicas(conn, pool=name, spec=pool.spec, ready_replicas=ready_replicas)
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
            scaled = await self.rt.api.merge_patch(live.worker_path, {"spec": {"replicas": decision.replicas}})
            if scaled is not None:
                self.rt.remember("deployments", scaled)
            workers_now = decision.replicas
            events.normal(
                self.body, reason=conditions.SCALED,
                message=f"workers {current} -> {decision.replicas}: {decision.reason}",
            )
        if vllm and not keda and decision.engine_replicas is not None and decision.engine_replicas != engine_desired:
            engine_path = kube.path(
                "apps/v1", "deployments", namespace=str(self.body.metadata.namespace),
                name=rendering.object_name(pool, "vllm"),
            )  # fmt: skip
            scaled = await self.rt.api.merge_patch(engine_path, {"spec": {"replicas": decision.engine_replicas}})
            if scaled is not None:
                self.rt.remember("deployments", scaled)
        return Scaled(
            load=load, pausing=pausing, room=room, decision=decision,
            ready_replicas=ready_replicas, engine_desired=engine_desired, workers_now=workers_now,
        )  # fmt: skip

    async def _headroom(
        self,
        session: aiohttp.ClientSession,
        pool: specs.InferencePool,
        load: registry.PoolLoad,
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
