"""
InferencePool reconciler: mirror into `pools`, keep the owned objects in shape, scale the workers,
report status.

One reconcile loop per pool (a kopf daemon), woken by the pool's own watch events, by any change
of an object it owns (a Deployment or Service edited or deleted by hand: drift), or every
`pool_interval_s` (the scaler's period, like an HPA's):

    1. mirror    the spec into `pools` when its generation changed   (pool_steps/mirror.py)
    2. owned     vLLM Deployment + Service, worker Deployment, KEDA objects: rendered, created
                 or corrected; what is no longer rendered deleted (once per generation); an object
                 of our name that is not ours stops here: Ready=False, ResourceExists
                                                                       (pool_steps/owned.py)
    3. scaling   PostgreSQL signals and the provider's headroom through `scaling.decide`; the
                 replicas written to the Deployments                   (pool_steps/scaling.py)
    4. status    endpoint, replicas, workers and why, headroom; Ready, Degraded, Paused
                                                                       (pool_steps/status.py)
                 written when it changed; a change of the numbers in `scalingReason` alone
                 (the oldest job's age, the idle seconds, the backlog) at most once per
                 CLOCK_REFRESH_S, so a pool at rest costs no status write every 15 s

Pools live only in platform namespaces (`OperatorSettings.pool_namespaces`, `lading operator
--pool-namespaces`): a pool's workers hold the signing secret of every DeliveryEndpoint (mirroring.py),
so a pool in a namespace a tenant controls would hand that tenant everyone's secrets. A pool anywhere
else is refused: status Ready=False, reason PoolNamespaceNotAllowed; nothing is rendered, no secret is
mirrored, and it is not written into `pools` (no batch can be admitted to it). Its loop still runs, to
report that and to clean up once what an earlier operator left there: the mirrors in its namespace,
the objects it owned, its `pools` row unless a batch refers to it.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Mapping
from typing import Any

import aiohttp
import kopf
import pydantic

from lading import applying
from lading.db import registry
from lading.models import specs
from lading_operator import conditions, events, headroom, mirroring, reconciling, runtime
from lading_operator.pool_steps import mirror, owned
from lading_operator.pool_steps import scaling as pool_scaling
from lading_operator.pool_steps import status as pool_status

logger = logging.getLogger("lading.operator.pools")

KIND = "InferencePool"
PLURAL = "inferencepools"
METRICS_URL_ANNOTATION = headroom.METRICS_URL_ANNOTATION
POOL_NAMESPACE_NOT_ALLOWED = conditions.POOL_NAMESPACE_NOT_ALLOWED


CLOCK_REFRESH_S = 300.0
"""How stale the numbers in `scalingReason` may get while nothing else in the status changes (as a batch's
clock-driven fields, batches.CLOCK_REFRESH_S): its situation and action are written at once."""
_NUMBERS = re.compile(r"\d+")


def key(namespace: str, name: str) -> runtime.ObjectKey:
    return (KIND, namespace, name)


def numbers_only(live: Mapping[str, Any], desired: Mapping[str, Any]) -> bool:
    """Whether `desired` differs from `live` in the numbers of `scalingReason` alone: the same words
    ("backlog 40, oldest 31s ≤ target 120s: ..." and "backlog 40, oldest 46s ≤ target 120s: ...")."""
    changed = conditions.status_patch(live, desired) or {}
    if set(changed) != {"scalingReason"}:
        return False
    before, after = live.get("scalingReason"), desired.get("scalingReason")
    return isinstance(before, str) and isinstance(after, str) and _NUMBERS.sub("0", before) == _NUMBERS.sub("0", after)


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


class Reconciler:
    """One pool's loop: runs the steps (`pool_steps`) in order and writes status when it changed."""

    def __init__(self, rt: runtime.Runtime, body: kopf.Body) -> None:
        self.rt = rt
        self.body = body
        self.namespace = str(body.metadata.namespace)
        self.name = str(body.metadata.name)
        self.key = key(self.namespace, self.name)
        self.mirror = mirror.Mirror(rt, self.namespace)
        self.scaler = pool_scaling.Scaler(rt, body)
        self.cleaned = False
        self.pruned_generation: int | None = None
        """The spec generation whose objects were last pruned (None: not yet in this loop)."""
        self.last_written: dict[str, Any] = dict(body.get("status") or {})
        self.last_write_at = -float("inf")

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
            await self._write(
                pool_status.ready_only(
                    previous=previous, generation=generation, reason=conditions.INVALID_SPEC, message=message
                )
            )
            return
        try:
            config = await self.mirror.step(pool, generation=generation)
        except applying.PricingCurrencyChanged as exc:  # the mirror keeps the old pricing
            await self._write(
                pool_status.ready_only(
                    previous=previous, generation=generation, reason=conditions.INVALID_SPEC, message=str(exc)
                )
            )
            return
        try:
            live = await owned.ensure_all(self.rt, self.body, pool, config=config)
        except owned.NotOwned as exc:
            if not any(c.get("reason") == conditions.RESOURCE_EXISTS for c in previous or ()):
                events.warning(self.body, reason=conditions.RESOURCE_EXISTS, message=str(exc))
            await self._write(
                pool_status.ready_only(
                    previous=previous, generation=generation, reason=conditions.RESOURCE_EXISTS, message=str(exc)
                )
            )
            return
        if self.pruned_generation is None or self.pruned_generation != generation:
            await owned.prune(self.rt, self.body, keep=live.rendered)
            self.pruned_generation = generation
        scaled = await self.scaler.step(session, pool, live)
        await self._write(
            pool_status.running(
                pool, scaled, previous=previous, generation=generation, last_scale=self.scaler.state.last_scale_at
            )
        )

    async def _refuse(self, generation: int | None, previous: Any) -> None:
        """The pool is outside the platform namespaces: report it; once, remove what an earlier
        operator made for it (mirrors in its namespace, its owned objects, its `pools` row)."""
        allowed = ", ".join(self.rt.settings.pool_namespaces)
        message = (f"InferencePools live only in the platform namespaces ({allowed}); nothing runs for a pool "
                   f"in {self.namespace} and no batch can use it")  # fmt: skip
        if not self.cleaned:
            await mirroring.sweep(self.rt, self.namespace)
            await owned.remove_all(self.rt, self.body)
            async with self.rt.db.acquire() as conn:
                gone = await registry.delete_pool_if_unused(conn, name=applying.pool_key(self.namespace, self.name))
            if not gone:
                logger.warning("pool %s/%s: refused, but batches refer to its registration, which stays",
                               self.namespace, self.name)  # fmt: skip
            self.cleaned = True
        desired = pool_status.ready_only(
            previous=previous, generation=generation, reason=POOL_NAMESPACE_NOT_ALLOWED, message=message
        )
        if not any(c.get("reason") == POOL_NAMESPACE_NOT_ALLOWED for c in previous or ()):
            events.warning(self.body, reason=POOL_NAMESPACE_NOT_ALLOWED, message=message)
        await self._write(desired)

    async def _write(self, desired: dict[str, Any]) -> None:
        now = time.monotonic()
        if numbers_only(self.last_written, desired) and now - self.last_write_at < CLOCK_REFRESH_S:
            return
        written = await conditions.write_status(
            self.rt.api, api_version=specs.API_VERSION, plural=PLURAL, namespace=self.namespace, name=self.name,
            live=self.last_written, desired=desired,
        )  # fmt: skip
        if written:
            self.last_written = dict(desired)
            self.last_write_at = now


def owner_pool(body: Mapping[str, Any]) -> runtime.ObjectKey | None:
    """The pool owning `body` (a Deployment or Service Lading rendered), if any."""
    meta = body.get("metadata") or {}
    for ref in meta.get("ownerReferences") or ():
        if ref.get("kind") == KIND and str(ref.get("apiVersion", "")).startswith(specs.GROUP + "/"):
            return key(str(meta.get("namespace") or ""), str(ref.get("name")))
    return None
