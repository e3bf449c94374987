"""
The InferencePool's status, computed from what the other steps saw (pure; writing it is the
reconciler's): endpoint, ready vLLM replicas, workers, desired workers and why, headroom, and the
conditions Ready, Degraded and Paused (spec.paused, or pools.paused_until set by workers when the
provider refused the key or the quota), and kstatus's Reconciling (True while vLLM replicas are
starting). A pool whose spec is invalid or that is refused gets Ready=False and Reconciling=False.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from lading.models import specs
from lading_operator import conditions, rendering, status
from lading_operator.pool_steps import scaling

Previous = Any
"""The conditions last written (a sequence of mappings, or None)."""


def running(
    pool: specs.InferencePool,
    scaled: scaling.Scaled,
    *,
    previous: Previous,
    generation: int | None,
    last_scale: dt.datetime | None,
) -> dict[str, Any]:
    """The status of a pool that is served: every field and the three conditions."""
    vllm = pool.spec.provider == "vllm"
    load, ready_replicas, engine_desired = scaled.load, scaled.ready_replicas, scaled.engine_desired
    endpoint = None
    if vllm:
        endpoint = rendering.vllm_endpoint_url(pool)
    elif pool.spec.endpoint is not None:
        endpoint = pool.spec.endpoint.url
    if pool.spec.paused:
        paused = conditions.condition(
            previous, type=conditions.PAUSED, value=True, reason=conditions.PAUSED_BY_SPEC,
            message="spec.paused is true: no new jobs are claimed", generation=generation,
        )  # fmt: skip
    elif scaled.pausing:
        refused = (load.paused_reason or "the provider refused the key or quota")[:1024]
        paused = conditions.condition(
            previous, type=conditions.PAUSED, value=True, reason=conditions.PROVIDER_REFUSED, message=refused,
            generation=generation,
        )
    else:
        paused = conditions.condition(
            previous, type=conditions.PAUSED, value=False, reason=conditions.CLAIMING, generation=generation
        )
    if vllm:
        # Scaled to zero while idle is the state asked for (kstatus: Current), not an outage: Ready=True.
        engine_ready = ready_replicas > 0 or engine_desired == 0
        if ready_replicas > 0:
            ready_reason = conditions.ENGINE_READY
        else:
            ready_reason = conditions.SCALED_TO_ZERO if engine_desired == 0 else conditions.ENGINE_STARTING
        ready = conditions.condition(
            previous, type=conditions.READY, value=engine_ready, reason=ready_reason,
            message=f"{ready_replicas}/{engine_desired} vLLM replicas ready", generation=generation,
        )  # fmt: skip
        degraded = conditions.condition(
            previous, type=conditions.DEGRADED, value=not engine_ready or ready_replicas < engine_desired,
            reason=(conditions.REPLICAS_UNAVAILABLE if ready_replicas < engine_desired
                    else conditions.ALL_REPLICAS_READY),
            generation=generation,
        )  # fmt: skip
    else:
        ready = conditions.condition(previous, type=conditions.READY, value=True, reason=conditions.APPLIED,
                                     message="workers and limits in place", generation=generation)  # fmt: skip
        degraded = conditions.condition(previous, type=conditions.DEGRADED, value=False, reason=conditions.HEALTHY,
                                        generation=generation)  # fmt: skip
    starting = ready.reason == conditions.ENGINE_STARTING
    reconciling = conditions.condition(
        previous, type=conditions.RECONCILING, value=starting,
        reason=conditions.ENGINE_STARTING if starting else conditions.RECONCILED,
        message=ready.message if starting else "", generation=generation,
    )  # fmt: skip
    decision = scaled.decision
    return conditions.dump(
        status.InferencePoolStatus(
            observed_generation=generation,
            endpoint=endpoint,
            ready_replicas=ready_replicas,
            workers=scaled.workers_now,
            desired_workers=decision.replicas,
            scaling_reason=decision.reason[:256],
            headroom=scaled.room.render(),
            last_scale_time=status.rfc3339(last_scale) if last_scale is not None else None,
            paused_until=(
                status.rfc3339(load.paused_until) if scaled.pausing and load.paused_until is not None else None
            ),
            conditions=[ready, degraded, paused, reconciling],
        )
    )


def ready_only(*, previous: Previous, generation: int | None, reason: str, message: str) -> dict[str, Any]:
    """The status of a pool that is not served (invalid spec, refused namespace, an object of its name
    not its own): Ready=False, and Reconciling=False (only a person can move it on)."""
    ready = conditions.condition(
        previous, type=conditions.READY, value=False, reason=reason, message=message, generation=generation
    )
    reconciling = conditions.condition(
        previous, type=conditions.RECONCILING, value=False, reason=conditions.RECONCILED, generation=generation
    )
    return conditions.dump(
        status.InferencePoolStatus(observed_generation=generation, conditions=[ready, reconciling])
    )
