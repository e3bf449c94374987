"""
DeliveryEndpoint reconciler: validate, check the signing Secret, mirror into `endpoints`, and
mirror the dispatcher's view (circuit breaker, auth failures, delivery counts) into status.

The worker Deployment projects each endpoint's signing secret into
`/etc/lading/endpoint-secrets/<namespace>.<name>` and the dispatcher reads it there. The operator
checks that the referenced Secret exists and holds the key (Ready=False, reason SecretMissing
otherwise) and copies the value into every pool namespace (`mirroring`: pods mount only their own
namespace's Secrets), on every reconcile, so a rotation reaches the mirrors within
`quota_interval_s`. A value is never logged or written anywhere but the mirrors. Only endpoints
with a Ready secret are handed to pools for projection.
"""

from __future__ import annotations

import logging
from typing import Any

import asyncpg
import kopf
import pydantic

from lading import applying
from lading.db import deliveries
from lading.models import specs
from lading_operator import conditions, events, kube, mirroring, rendering, runtime, status

logger = logging.getLogger("lading.operator.endpoints")

KIND = "DeliveryEndpoint"
PLURAL = "deliveryendpoints"
CIRCUIT = {"closed": "Closed", "open": "Open", "half_open": "HalfOpen"}


def parse(body: kopf.Body) -> specs.DeliveryEndpoint:
    return specs.DeliveryEndpoint.model_validate(
        {
            "apiVersion": specs.API_VERSION,
            "kind": KIND,
            "metadata": {"name": body.metadata.name, "namespace": body.metadata.namespace, "uid": body.metadata.uid},
            "spec": dict(body.spec),
        }
    )


async def reconcile(rt: runtime.Runtime, body: kopf.Body, *, mirror: bool) -> None:
    namespace, name = str(body.metadata.namespace), str(body.metadata.name)
    generation = body.metadata.get("generation")
    live = dict(body.get("status") or {})
    previous = live.get("conditions")
    full = f"{namespace}/{name}"
    try:
        endpoint = parse(body)
    except pydantic.ValidationError as exc:
        first = exc.errors()[0]
        message = f"spec.{'.'.join(str(p) for p in first['loc'])}: {first['msg']}"
        ready = conditions.condition(previous, type=conditions.READY, value=False, reason=conditions.INVALID_SPEC,
                                     message=message, generation=generation)  # fmt: skip
        await _write(rt, namespace, name, live, conditions.dump(
            status.DeliveryEndpointStatus(observed_generation=generation, conditions=[ready])))  # fmt: skip
        projected = rt.endpoint_secrets.pop(full, None) is not None
        if await mirroring.sync_endpoint(rt, full, None) or projected:
            rt.wake_kind("InferencePool")
        return
    if mirror:
        async with rt.db.acquire() as conn:
            await applying.apply_delivery_endpoint(conn, endpoint)
    source = await mirroring.read_source(rt, full, endpoint.spec.secret_ref)
    problem = source if isinstance(source, str) else None
    before = rt.endpoint_secrets.get(full)
    if problem is None:
        rt.endpoint_secrets[full] = rendering.EndpointSecret(
            endpoint=full, secret_name=endpoint.spec.secret_ref.name, key=endpoint.spec.secret_ref.key
        )
    else:
        rt.endpoint_secrets.pop(full, None)
    moved = await mirroring.sync_endpoint(rt, full, None if isinstance(source, str) else source)
    if moved or rt.endpoint_secrets.get(full) != before:
        rt.wake_kind("InferencePool")  # every pool's workers project the signing secrets (mirrored)
    health = None
    if rt.has_deliveries:
        async with rt.db.acquire() as conn:
            health = await deliveries.endpoint_health(conn, endpoint=full)
    conds = [
        conditions.condition(previous, type=conditions.READY, value=problem is None,
                             reason=conditions.SECRET_MISSING if problem else conditions.REGISTERED,
                             message=problem or "registered; the signing Secret has its key", generation=generation),
    ]  # fmt: skip
    fields: dict[str, Any] = {}
    if health is not None:
        circuit = CIRCUIT.get(health.breaker_state, "Closed")
        conds.append(conditions.condition(
            previous, type=conditions.AUTH_FAILING, value=health.auth_failing,
            reason=conditions.AUTH_REJECTED if health.auth_failing else conditions.AUTH_ACCEPTED,
            message=f"the endpoint answered HTTP {health.last_auth_status}" if health.auth_failing else "",
            generation=generation,
        ))  # fmt: skip
        conds.append(conditions.condition(
            previous, type=conditions.CIRCUIT_OPEN, value=circuit != "Closed",
            reason=conditions.CIRCUIT_REASONS[circuit], generation=generation,
        ))  # fmt: skip
        fields = {"delivered": health.delivered, "pending": health.pending,
                  "unknown_external": health.unknown, "failed": health.failed, "circuit": circuit}  # fmt: skip
    desired = conditions.dump(status.DeliveryEndpointStatus(observed_generation=generation, conditions=conds, **fields))
    if conditions.changed(live, desired) and problem is not None:
        events.warning(body, reason=conditions.SECRET_MISSING, message=problem)
    await _write(rt, namespace, name, live, desired)


async def _write(rt: runtime.Runtime, namespace: str, name: str, live: dict[str, Any], desired: dict[str, Any]) -> None:
    await conditions.write_status(
        rt.api, api_version=specs.API_VERSION, plural=PLURAL, namespace=namespace, name=name,
        live=live, desired=desired,
    )  # fmt: skip


async def refresh_tick(rt: runtime.Runtime, body: kopf.Body) -> None:
    """`reconcile` on the timer, mirroring first (whatever status says, the row exists); a database
    or API failure is a warning: the next tick retries (kopf's own error backoff would pause the
    refresh for a minute)."""
    try:
        await reconcile(rt, body, mirror=True)
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, kube.KubeError) as exc:
        logger.warning("%s %s: status refresh failed: %s", KIND, body.metadata.name, type(exc).__name__)


async def forget(rt: runtime.Runtime, full: str) -> None:
    """The endpoint `namespace/name` is gone: forget its secret and delete its mirrors."""
    rt.endpoint_secrets.pop(full, None)
    try:
        await mirroring.forget_endpoint(rt, full)
    except kube.KubeError as exc:  # a pool's loop deletes mirrors of vanished endpoints when it starts
        logger.warning("%s %s: deleting its signing secret's mirrors failed: %s", KIND, full, exc)
