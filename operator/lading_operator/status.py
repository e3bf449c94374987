"""
Status of Lading's custom resources: the one definition of what the operator writes under
`.status` and of what the CRDs' status schema accepts.

The CRD generator (`lading_operator.crds`) renders each kind's status schema from these models,
so a field the operator writes that is not declared here would be pruned by the API server. The
operator writes status as a merge patch of
`Model(...).model_dump(mode="json", by_alias=True, exclude_none=True)`.

Everything is bounded (strings, lists) so a status can never grow an object towards etcd's
limit, whatever happens to the batch. Timestamps are RFC 3339 strings (as Kubernetes writes
them), not datetimes: the operator formats them once (`rfc3339`) and the schema checks the shape.
"""

from __future__ import annotations

import datetime
from typing import Annotated, Literal

import pydantic
import pydantic.alias_generators

RFC3339_PATTERN = r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$"
CAMEL_CASE_REASON_PATTERN = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"
"""metav1.Condition's own rule for `reason`."""
CONDITION_TYPE_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"
)
HEADROOM_PATTERN = r"^(0\.\d{2}|1\.00)$"

CONDITIONS_MAX = 16
RECENT_FAILURES_MAX = 10

Timestamp = Annotated[str, pydantic.StringConstraints(min_length=20, max_length=40, pattern=RFC3339_PATTERN)]
Count = Annotated[int, pydantic.Field(ge=0, le=2**53)]
Generation = Annotated[int, pydantic.Field(ge=0, le=2**63 - 1)]

ConditionStatus = Literal["True", "False", "Unknown"]
BatchPhase = Literal["Pending", "Running", "Suspended", "Completed", "Failed", "Terminating"]
CircuitState = Literal["Closed", "Open", "HalfOpen"]


def rfc3339(moment: datetime.datetime) -> str:
    """`moment` as Kubernetes writes timestamps: UTC, whole seconds, 'Z'."""
    if moment.tzinfo is None:
        raise ValueError("a naive datetime has no defined instant; pass an aware one")
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class _Status(pydantic.BaseModel):
    """camelCase on the wire, snake_case in Python, unknown fields rejected."""

    model_config = pydantic.ConfigDict(
        alias_generator=pydantic.alias_generators.to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
    )


class Condition(_Status):
    """One condition, in the shape of Kubernetes' metav1.Condition."""

    type: str = pydantic.Field(
        min_length=1,
        max_length=64,
        pattern=CONDITION_TYPE_PATTERN,
        description="Condition type, e.g. Admitted, Ready.",
    )
    status: ConditionStatus = pydantic.Field(description="True, False or Unknown.")
    reason: str = pydantic.Field(
        min_length=1,
        max_length=64,
        pattern=CAMEL_CASE_REASON_PATTERN,
        description="Machine-readable reason in CamelCase, e.g. QuotaExhausted.",
    )
    message: str = pydantic.Field(
        default="",
        max_length=1024,
        description="Human-readable explanation.",
    )
    last_transition_time: Timestamp = pydantic.Field(
        description="When status last changed (RFC 3339).",
    )
    observed_generation: Generation | None = pydantic.Field(
        default=None,
        description="metadata.generation the condition was computed from.",
    )


Conditions = Annotated[list[Condition], pydantic.Field(max_length=CONDITIONS_MAX)]


class RecentFailure(_Status):
    """A recently failed document of the batch, so `kubectl describe` shows why without a database query."""

    document_key: str = pydantic.Field(min_length=1, max_length=256, description="Key of the document.")
    reason: str = pydantic.Field(
        min_length=1,
        max_length=64,
        pattern=CAMEL_CASE_REASON_PATTERN,
        description="Failure reason, e.g. InvalidOutput, DeadlineExceeded.",
    )
    message: str = pydantic.Field(default="", max_length=512, description="Short explanation, without secrets.")
    at: Timestamp = pydantic.Field(description="When the failure was recorded (RFC 3339).")


class Money(_Status):
    """An exact amount of money: a decimal string (never a float) and its ISO 4217 currency."""

    amount: str = pydantic.Field(
        min_length=1, max_length=64, pattern=r"^[0-9]+(\.[0-9]+)?$", description="Decimal amount, e.g. 0.0123."
    )
    currency: str = pydantic.Field(min_length=3, max_length=3, pattern=r"^[A-Z]{3}$", description="ISO 4217 code.")


class ExtractionBatchStatus(_Status):
    """Progress of an ExtractionBatch, summarised from PostgreSQL by the operator."""

    phase: BatchPhase | None = pydantic.Field(
        default=None,
        description="Pending: not admitted yet. Running: admitted, work left. Suspended: spec.suspend is true. "
        "Completed: every job is terminal or awaiting review, and some succeeded or await review. "
        "Failed: every job is terminal and none succeeded. Terminating: being deleted.",
    )
    observed_generation: Generation | None = pydantic.Field(
        default=None, description="metadata.generation this status reflects."
    )
    batch_id: str | None = pydantic.Field(
        default=None, max_length=64, description="Id of the batch in Lading's database."
    )
    tenant: str | None = pydantic.Field(
        default=None, max_length=253, description="TenantQuota the batch is admitted and billed under."
    )
    total: Count | None = pydantic.Field(default=None, description="Documents in the batch.")
    ready: Count | None = pydantic.Field(default=None, description="Jobs waiting to be claimed.")
    running: Count | None = pydantic.Field(default=None, description="Jobs being extracted now.")
    retry_scheduled: Count | None = pydantic.Field(default=None, description="Jobs waiting for a retry.")
    review_required: Count | None = pydantic.Field(
        default=None, description="Jobs whose result awaits a human review."
    )
    succeeded: Count | None = pydantic.Field(default=None, description="Jobs with an accepted result.")
    failed: Count | None = pydantic.Field(default=None, description="Jobs that failed for good.")
    cancelled: Count | None = pydantic.Field(default=None, description="Jobs cancelled.")
    delivered: Count | None = pydantic.Field(
        default=None, description="Results delivered to the DeliveryEndpoint."
    )
    reused: Count | None = pydantic.Field(
        default=None,
        description="Succeeded jobs that took an earlier accepted result of the tenant instead of calling the "
        "model (result reuse).",
    )
    cost: Money | None = pydantic.Field(
        default=None,
        description="What the batch's model calls cost at its pool's spec.pricing, every attempt included "
        "(a timed-out one at its reservation). Absent for an unpriced pool.",
    )
    oldest_eligible_age_seconds: Count | None = pydantic.Field(
        default=None, description="Seconds the oldest job eligible to run has waited."
    )
    queue_position: Count | None = pydantic.Field(
        default=None,
        description="While Pending or Running: eligible jobs of the pool claimed before this batch's next one "
        "under fair share (0: it is next). Absent when no job of it is eligible now.",
    )
    eta_seconds: Count | None = pydantic.Field(
        default=None,
        description="While Pending or Running: seconds until its last job is done at the pool's throughput of "
        "the last 10 minutes. Absent when the pool finished no call in that time.",
    )
    admitted_at: Timestamp | None = pydantic.Field(default=None, description="When the batch was admitted.")
    completed_at: Timestamp | None = pydantic.Field(default=None, description="When the batch completed.")
    recent_failures: list[RecentFailure] | None = pydantic.Field(
        default=None,
        max_length=RECENT_FAILURES_MAX,
        description="The most recent failed documents, newest first (at most 10).",
    )
    conditions: Conditions | None = pydantic.Field(
        default=None,
        description="Ready, Stalled, Admitted, Progressing, Complete, Failed, Delivered, BudgetExhausted.",
    )


class InferencePoolStatus(_Status):
    """State of an InferencePool: its endpoint, replicas and scaling decision."""

    observed_generation: Generation | None = pydantic.Field(
        default=None, description="metadata.generation this status reflects."
    )
    endpoint: str | None = pydantic.Field(
        default=None, min_length=1, max_length=2048, description="Base URL the workers call."
    )
    ready_replicas: Count | None = pydantic.Field(
        default=None, description="Ready vLLM replicas; 0 for external and builtin pools."
    )
    workers: Count | None = pydantic.Field(default=None, description="Current worker replicas.")
    desired_workers: Count | None = pydantic.Field(default=None, description="Worker replicas the scaler wants.")
    scaling_reason: str | None = pydantic.Field(
        default=None, max_length=256, description="Why the scaler wants desiredWorkers."
    )
    headroom: str | None = pydantic.Field(
        default=None,
        pattern=HEADROOM_PATTERN,
        max_length=4,
        description="Unused share of the pool's limits, 0.00 to 1.00.",
    )
    last_scale_time: Timestamp | None = pydantic.Field(default=None, description="When workers were last scaled.")
    paused_until: Timestamp | None = pydantic.Field(
        default=None, description="Claiming is paused until then (e.g. after the model rejected auth)."
    )
    conditions: Conditions | None = pydantic.Field(default=None, description="Ready, Degraded, Paused.")


class TenantQuotaStatus(_Status):
    """Current use of a tenant's quota."""

    observed_generation: Generation | None = pydantic.Field(
        default=None, description="metadata.generation this status reflects."
    )
    queued_jobs: Count | None = pydantic.Field(default=None, description="Jobs waiting or running.")
    queued_bytes: Count | None = pydantic.Field(default=None, description="Bytes of document text queued.")
    in_flight: Count | None = pydantic.Field(default=None, description="Model calls running now.")
    tokens_today: Count | None = pydantic.Field(default=None, description="Model tokens used this UTC day.")
    spent_today: Money | None = pydantic.Field(
        default=None, description="With spec.budget: what the tenant spent this UTC day, in the budget's currency."
    )
    spent_this_month: Money | None = pydantic.Field(
        default=None,
        description="With spec.budget: what the tenant spent this calendar month (UTC), in the budget's currency.",
    )
    conditions: Conditions | None = pydantic.Field(default=None, description="Ready, BudgetExhausted.")


class DeliveryEndpointStatus(_Status):
    """Delivery counts and circuit state of a DeliveryEndpoint."""

    observed_generation: Generation | None = pydantic.Field(
        default=None, description="metadata.generation this status reflects."
    )
    delivered: Count | None = pydantic.Field(default=None, description="Results delivered (2xx).")
    pending: Count | None = pydantic.Field(default=None, description="Deliveries waiting or being retried.")
    unknown_external: Count | None = pydantic.Field(
        default=None,
        description="Deliveries whose outcome is unknown (the connection broke after sending); they need a human.",
    )
    failed: Count | None = pydantic.Field(default=None, description="Deliveries that failed for good.")
    circuit: CircuitState | None = pydantic.Field(
        default=None, description="Closed: delivering. Open: paused after failures. HalfOpen: probing."
    )
    conditions: Conditions | None = pydantic.Field(default=None, description="Ready, AuthFailing, CircuitOpen.")


STATUS_MODELS: dict[str, type[_Status]] = {
    "ExtractionBatch": ExtractionBatchStatus,
    "InferencePool": InferencePoolStatus,
    "TenantQuota": TenantQuotaStatus,
    "DeliveryEndpoint": DeliveryEndpointStatus,
}
"""Status model by kind; the CRD generator renders `.status` of each CRD from it."""
