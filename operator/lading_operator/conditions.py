"""
Building status and writing it only when it changed.

A condition keeps its `lastTransitionTime` while its status stays the same (Kubernetes'
convention: the time says when it last flipped, not when we last looked), so re-computing an
unchanged status yields an identical dict and `write_status` sends nothing. That is what bounds
the operator's API traffic at steady state: a refresh that finds nothing new costs no request.

Every condition type and reason the operator writes, and every Event reason it posts, is a
constant here, each with what it means (docs/operator.md has the same tables); the core's admission
reasons are `lading.reasons`, re-exported. Nothing else in the operator spells one out
(tests/unit/layout/test_condition_reasons_in_one_place.py).
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Mapping, Sequence
from typing import Any, Final

from lading import reasons
from lading_operator import kube, status

logger = logging.getLogger("lading.operator")


# --- Condition types -------------------------------------------------------------------------

READY: Final = "Ready"
"""InferencePool, TenantQuota, DeliveryEndpoint: the object is served as its spec asks. ExtractionBatch:
the batch reached what it was made for (completed, and delivered when it names an endpoint)."""
STALLED: Final = "Stalled"
"""ExtractionBatch: it cannot make progress without a change by a person (it failed, or its spec or
manifest is invalid); kstatus's abnormal-true condition."""
FAILED_CONDITION: Final = "Failed"
"""ExtractionBatch: every job settled and none succeeded. Separate from Complete, so `kubectl wait
--for=condition=Complete` never succeeds on a failed batch."""
DEGRADED: Final = "Degraded"
"""InferencePool: some of its vLLM replicas are unavailable."""
PAUSED: Final = "Paused"
"""InferencePool: no new jobs are claimed (spec.paused, or the provider refused the key or quota)."""
ADMITTED: Final = "Admitted"
"""ExtractionBatch: accepted by the core (True), or why not (False, one of `lading.reasons`)."""
PROGRESSING: Final = "Progressing"
"""ExtractionBatch: jobs remain and are claimed (not suspended)."""
COMPLETE: Final = "Complete"
"""ExtractionBatch: every job settled and at least one result succeeded or awaits review."""
DELIVERED: Final = "Delivered"
"""ExtractionBatch with a DeliveryEndpoint: every good result delivered."""
BUDGET_EXHAUSTED: Final = "BudgetExhausted"
"""ExtractionBatch, TenantQuota: the tenant spent a budget (dailyTokenBudget, or spec.budget's daily or monthly
amount); its jobs wait, never fail, until the reset time the message names."""
AUTH_FAILING: Final = "AuthFailing"
"""DeliveryEndpoint: the receiver refuses our signature (HTTP 401/403)."""
CIRCUIT_OPEN: Final = "CircuitOpen"
"""DeliveryEndpoint: the dispatcher's circuit breaker is not closed."""
RECONCILING: Final = "Reconciling"
"""ExtractionBatch, InferencePool: kstatus's abnormal-true condition. True while the operator is still
bringing the current generation about by itself (a batch waiting to be admitted for a reason that clears
by itself; a vLLM pool whose replicas are starting), with that reason; False (Reconciled) once it is in
place, and while Stalled or refused (then only a person can move it on)."""

# --- Condition reasons -----------------------------------------------------------------------
# Admission (ExtractionBatch Admitted=False; InvalidSpec also Ready=False of every other kind):
# the core's, defined in `lading.reasons` and re-exported here.

NO_TENANT_QUOTA: Final = reasons.NO_TENANT_QUOTA
PRIORITY_NOT_ALLOWED: Final = reasons.PRIORITY_NOT_ALLOWED
POOL_NOT_ALLOWED: Final = reasons.POOL_NOT_ALLOWED
POOL_NOT_FOUND: Final = reasons.POOL_NOT_FOUND
QUOTA_EXCEEDED: Final = reasons.QUOTA_EXCEEDED
INVALID_SPEC: Final = reasons.INVALID_SPEC
INVALID_MANIFEST: Final = reasons.INVALID_MANIFEST
MANIFEST_UNAVAILABLE: Final = reasons.MANIFEST_UNAVAILABLE
IDEMPOTENCY_CONFLICT: Final = reasons.IDEMPOTENCY_CONFLICT
CURRENCY_MISMATCH: Final = reasons.CURRENCY_MISMATCH

# ExtractionBatch.
ADMITTED_REASON: Final = "Admitted"
"""Admitted=True: accepted; the message names the batch id and tenant. Also the Normal Event."""
JOBS_REMAINING: Final = "JobsRemaining"
"""Progressing=True / Complete=False: jobs are not all settled."""
SUSPENDED: Final = "Suspended"
"""Progressing=False: spec.suspend; no new jobs of the batch are claimed. Also the Normal Event."""
SETTLED: Final = "Settled"
"""Progressing=False: every job settled."""
COMPLETED: Final = "Completed"
"""Complete=True, Failed=False, Ready=True (no endpoint): settled, at least one result succeeded or awaits
review. Also the Normal Event."""
FAILED: Final = "Failed"
"""Failed=True, Complete=False, Ready=False, Stalled=True: settled and none succeeded. Also the Warning Event."""
RECONCILED: Final = "Reconciled"
"""Reconciling=False: what the current generation asks is in place (or waits for a person: Stalled)."""
NOT_STALLED: Final = "NotStalled"
"""Stalled=False of a batch: admitted or waiting for something that will come by itself (room in the quota,
the pool, the endpoint)."""
ALL_DELIVERED: Final = "AllDelivered"
"""Delivered=True: every good result reached the DeliveryEndpoint."""
DELIVERIES_PENDING: Final = "DeliveriesPending"
"""Delivered=False: results still to deliver."""
ENDPOINT_NOT_FOUND: Final = "EndpointNotFound"
"""Delivered=False: the named DeliveryEndpoint does not exist; the results wait for it."""
DAILY_TOKEN_BUDGET_SPENT: Final = "DailyTokenBudgetSpent"
"""BudgetExhausted=True: the tenant's dailyTokenBudget is spent until the UTC day ends."""
MONTHLY_BUDGET_SPENT: Final = "MonthlyBudgetSpent"
"""BudgetExhausted=True: the tenant spent spec.budget.monthly this calendar month (UTC); jobs wait for the next."""
DAILY_BUDGET_SPENT: Final = "DailyBudgetSpent"
"""BudgetExhausted=True: the tenant spent spec.budget.daily this UTC day; jobs wait for the next."""
WITHIN_BUDGET: Final = "WithinBudget"
"""BudgetExhausted=False."""

# InferencePool.
APPLIED: Final = "Applied"
"""Ready=True of a builtin or external pool (workers and limits in place), and of a TenantQuota."""
ENGINE_READY: Final = "EngineReady"
"""Ready=True of a vLLM pool: at least one vLLM replica is ready."""
ENGINE_STARTING: Final = "EngineStarting"
"""Ready=False of a vLLM pool: replicas are wanted and none is ready yet."""
SCALED_TO_ZERO: Final = "ScaledToZero"
"""Ready=True of a vLLM pool: the engine is scaled to zero while idle, as asked (work wakes it)."""
RESOURCE_EXISTS: Final = "ResourceExists"
"""Ready=False of a pool: an object with the name of one it renders exists and is not its own (no owner
reference to this pool); it is never adopted nor changed. Also the Warning Event."""
POOL_NAMESPACE_NOT_ALLOWED: Final = "PoolNamespaceNotAllowed"
"""Ready=False of a pool outside the platform namespaces the operator was given. Also the Warning Event."""
HEALTHY: Final = "Healthy"
"""Degraded=False of a builtin or external pool."""
ALL_REPLICAS_READY: Final = "AllReplicasReady"
"""Degraded=False of a vLLM pool."""
REPLICAS_UNAVAILABLE: Final = "ReplicasUnavailable"
"""Degraded=True of a vLLM pool: fewer ready replicas than wanted."""
CLAIMING: Final = "Claiming"
"""Paused=False."""
PAUSED_BY_SPEC: Final = "PausedBySpec"
"""Paused=True: spec.paused."""
PROVIDER_REFUSED: Final = "ProviderRefused"
"""Paused=True: the provider refused the key or the quota; workers paused the pool until pausedUntil."""

# TenantQuota (Ready=True is APPLIED).
NAMESPACE_CONFLICT: Final = "NamespaceConflict"
"""Ready=False of a quota that lists a namespace another quota lists too. Also the Warning Event."""

# DeliveryEndpoint.
REGISTERED: Final = "Registered"
"""Ready=True: mirrored, and the signing Secret has its key."""
SECRET_MISSING: Final = "SecretMissing"
"""Ready=False: the signing Secret or its key is missing. Also the Warning Event."""
AUTH_REJECTED: Final = "AuthRejected"
"""AuthFailing=True: the endpoint answered 401/403."""
AUTH_ACCEPTED: Final = "AuthAccepted"
"""AuthFailing=False."""
CIRCUIT_CLOSED: Final = "CircuitClosed"
"""CircuitOpen=False."""
CIRCUIT_OPENED: Final = "CircuitOpen"
"""CircuitOpen=True: the breaker is open; deliveries wait."""
CIRCUIT_HALF_OPEN: Final = "CircuitHalfOpen"
"""CircuitOpen=True: the breaker lets a probe through."""

# --- Event reasons (besides the condition reasons noted above) -------------------------------

SCALED: Final = "Scaled"
"""Normal, InferencePool: the worker count changed (old and new count, and why)."""
DRIFT_CORRECTED: Final = "DriftCorrected"
"""Normal, InferencePool: an owned object was patched back to its rendering."""
PRUNED: Final = "Pruned"
"""Normal, InferencePool: an object the pool owned and no longer renders was deleted (e.g. the vLLM
Deployment after a switch to an external provider)."""
PRIORITY_CHANGED: Final = "PriorityChanged"
"""Normal, ExtractionBatch: spec.priority changed; the batch's waiting jobs now rank with it."""
RESUMED: Final = "Resumed"
"""Normal, ExtractionBatch: spec.suspend cleared; claiming resumed."""
DOCUMENTS_FAILED: Final = "DocumentsFailed"
"""Warning, ExtractionBatch: more documents failed (the count and the latest)."""
CANCELLED: Final = "Cancelled"
"""Normal, ExtractionBatch: deleted; its unfinished jobs were cancelled."""
METRICS_URL_IGNORED: Final = "MetricsUrlIgnored"
"""Warning, InferencePool: its vllm-metrics-url annotation was ignored (no override flag)."""
METRICS_URL_REFUSED: Final = "MetricsUrlRefused"
"""Warning, InferencePool: its vllm-metrics-url annotation was refused by the egress policy."""
RECONCILE_ERROR: Final = "ReconcileError"
"""Warning: a reconcile step failed on something other than the database or the API server (a
bug); the loop logs the traceback and retries with backoff."""

CONDITION_TYPES: Final = frozenset({
    READY, STALLED, FAILED_CONDITION, DEGRADED, PAUSED, ADMITTED, PROGRESSING, COMPLETE, DELIVERED, BUDGET_EXHAUSTED,
    AUTH_FAILING, CIRCUIT_OPEN, RECONCILING,
})  # fmt: skip
"""Every condition type the operator writes."""

CIRCUIT_REASONS: Final = {"Closed": CIRCUIT_CLOSED, "Open": CIRCUIT_OPENED, "HalfOpen": CIRCUIT_HALF_OPEN}
"""DeliveryEndpoint status.circuit -> the CircuitOpen condition's reason."""




def now() -> str:
    return status.rfc3339(datetime.datetime.now(tz=datetime.UTC))


def condition(
    previous: Sequence[Mapping[str, Any]] | None,
    *,
    type: str,
    value: bool | None,
    reason: str,
    message: str = "",
    generation: int | None = None,
) -> status.Condition:
    """A condition; its lastTransitionTime is carried over from `previous` when its status did not flip."""
    text = "Unknown" if value is None else ("True" if value else "False")
    moment = now()
    for old in previous or ():
        if old.get("type") == type and old.get("status") == text and old.get("lastTransitionTime"):
            moment = str(old["lastTransitionTime"])
    return status.Condition(
        type=type,
        status=text,  # type: ignore[arg-type]
        reason=reason,
        message=message[:1024],
        last_transition_time=moment,
        observed_generation=generation,
    )


def dump(model: Any) -> dict[str, Any]:
    return dict(model.model_dump(mode="json", by_alias=True, exclude_none=True))


def status_patch(live: Mapping[str, Any] | None, desired: Mapping[str, Any]) -> dict[str, Any] | None:
    """The JSON merge patch that turns `live` .status into `desired`, or None when they are equal.

    A field `desired` no longer has is removed (null): a status is the whole of what the operator
    reports now, so a `pausedUntil` that has passed, a `headroom` of a pool that has none or a queue
    position of a settled batch does not stay behind. Fields that did not change are not sent."""
    live = live or {}
    patch: dict[str, Any] = {key: value for key, value in desired.items() if live.get(key) != value}
    patch.update({key: None for key in live if key not in desired})
    return patch or None


def changed(live: Mapping[str, Any] | None, desired: Mapping[str, Any]) -> bool:
    """Whether writing `desired` would change `live` .status."""
    return status_patch(live, desired) is not None


async def write_status(
    api: kube.Client,
    *,
    api_version: str,
    plural: str,
    namespace: str | None,
    name: str,
    live: Mapping[str, Any] | None,
    desired: Mapping[str, Any],
) -> bool:
    """Merge-patch .status from `live` to `desired` (`status_patch`: changed fields, and null for fields
    that went away) when they differ; True when a request was sent."""
    patch = status_patch(live, desired)
    if patch is None:
        return False
    path = kube.path(api_version, plural, namespace=namespace, name=name, sub="status")
    await api.merge_patch_unread(path, {"status": patch})
    return True
