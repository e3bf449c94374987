"""
The intake's request and response bodies as pydantic models: requests are validated with them
(every field error reported at once), and the OpenAPI document's schemas are generated from them
(`openapi.py`), so the document and the behaviour cannot drift apart.

A document's body is the core's own model of a single document (`lading.intake.DocumentRequest`,
the rules of an inline document or a manifest line, shared with the queue intake), and a batch's
spec is the ExtractionBatch spec (`lading.models.specs`): the intake adds no rule of its own.
"""

from __future__ import annotations

import hashlib
from typing import Any, Literal

import orjson
import pydantic
import pydantic.alias_generators

from lading.models import specs

CANONICAL_VERSION = "v1"
"""Version of the canonical request form hashed for Idempotency-Key (a change must not make old
requests look different within a key's retention)."""


class _Body(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(
        alias_generator=pydantic.alias_generators.to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        strict=True,
    )


class BatchSubmission(_Body):
    """An ExtractionBatch by name and spec, admitted exactly as the custom resource is."""

    name: specs.DnsSubdomain = pydantic.Field(description="Name of the batch, unique in the namespace.")
    spec: specs.ExtractionBatchSpec


class BatchRef(_Body):
    namespace: str
    name: str


class DocumentAccepted(_Body):
    """202 to a document: where its job's state is."""

    job_id: int = pydantic.Field(description="Id of the job the document became.")
    status_url: str = pydantic.Field(description="/v1/jobs/{id}, also in the Location header.")
    batch: BatchRef = pydantic.Field(description="The rolling batch the document was appended to.")


class BatchAccepted(_Body):
    """202 to a batch: where its status is."""

    batch_id: int
    namespace: str
    name: str
    jobs: int = pydantic.Field(description="Documents accepted in the batch.")
    status_url: str = pydantic.Field(description="/v1/namespaces/{ns}/batches/{name}, also in Location.")


JobStateName = Literal["READY", "RUNNING", "RETRY_SCHEDULED", "REVIEW_REQUIRED", "SUCCEEDED", "FAILED_TERMINAL",
                       "CANCELLED"]


class JobView(_Body):
    """A job's state (200 while it waits or runs; 303 to its result once terminal or in review)."""

    id: int
    key: str
    state: JobStateName
    batch: BatchRef
    attempt: int
    max_attempts: int
    created_at: str
    updated_at: str
    finished_at: str | None = None
    deadline_at: str
    last_error_class: str | None = None


class JobResultView(_Body):
    """A job's result and verdict (null while it has none, or after retention deleted it)."""

    id: int
    key: str
    state: JobStateName
    result: Any = pydantic.Field(default=None, description="The extracted invoice.v1 JSON.")
    verdict: Any = pydantic.Field(default=None, description="The validation policy's verdict on it.")
    result_deleted: bool = pydantic.Field(description="True when retention deleted the result.")


class ResultLine(_Body):
    """One line of `GET .../batches/{name}/results` (application/x-ndjson)."""

    job_id: int
    key: str
    state: JobStateName
    result: Any = None
    verdict: Any = None
    result_deleted: bool


class Condition(_Body):
    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str
    message: str = ""


class RecentFailure(_Body):
    document_key: str
    reason: str
    message: str
    at: str


class BatchStatusView(_Body):
    """A batch's status: the same fields as the ExtractionBatch custom resource's `.status`."""

    namespace: str
    name: str
    phase: Literal["Running", "Suspended", "Completed", "Failed"]
    batch_id: str
    tenant: str
    total: int
    ready: int
    running: int
    retry_scheduled: int
    review_required: int
    succeeded: int
    failed: int
    cancelled: int
    delivered: int | None = None
    oldest_eligible_age_seconds: int
    queue_position: int | None = pydantic.Field(
        default=None, description="Eligible jobs of the pool claimed before the batch's next one, while work is left."
    )
    eta_seconds: int | None = pydantic.Field(
        default=None, description="Seconds until the batch's last job is done at the pool's measured throughput."
    )
    admitted_at: str
    completed_at: str | None = None
    recent_failures: list[RecentFailure]
    conditions: list[Condition]


class ProblemError(pydantic.BaseModel):
    pointer: str = pydantic.Field(description="JSON pointer to the field in the request body.")
    detail: str


class Problem(pydantic.BaseModel):
    """RFC 9457 problem details."""

    model_config = pydantic.ConfigDict(extra="allow")

    type: str
    title: str
    status: int
    detail: str
    errors: list[ProblemError] | None = None


def request_digest(route: str, body: pydantic.BaseModel) -> str:
    """The canonical digest of a request: the route and the validated body with its defaults filled,
    keys sorted, so field order, whitespace and an omitted default do not make a request different."""
    canonical = body.model_dump(mode="json", by_alias=True)
    data = orjson.dumps([CANONICAL_VERSION, route, canonical], option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(data).hexdigest()
