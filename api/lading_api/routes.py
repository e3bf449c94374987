"""
The intake's route table: every route with its request body model and the answers it may give.
`app.make_app` serves it and `openapi.document` describes it, both from this one table.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import pydantic

from lading import intake
from lading_api import models

NDJSON = "application/x-ndjson"


@dataclasses.dataclass(frozen=True)
class Answer:
    description: str
    model: type[pydantic.BaseModel] | None = None
    content_type: str = "application/json"
    headers: tuple[str, ...] = ()
    links: Mapping[str, tuple[str, Mapping[str, str]]] = dataclasses.field(default_factory=dict)
    """OpenAPI links: name -> (operationId, parameters as runtime expressions), for clients and
    stateful testing (a POST's answer names what to GET next)."""


@dataclasses.dataclass(frozen=True)
class Route:
    method: str
    path: str
    handler: str
    """Name of the `app.Intake` method that serves it."""
    operation_id: str
    summary: str
    request: type[pydantic.BaseModel] | None = None
    answers: Mapping[int, Answer] = dataclasses.field(default_factory=dict)
    query: tuple[tuple[str, Mapping[str, object], str], ...] = ()
    """Query parameters: (name, JSON schema, description)."""
    public: bool = False
    """Served without a token (health and the document itself)."""
    examples: Mapping[str, tuple[str, Mapping[str, Any]]] = dataclasses.field(default_factory=dict)
    """Request body examples: name -> (summary, body). They name the pool `lading-system/qwen`
    (docs/api.md's), which `hack/api_fuzz.py` seeds, so generated requests that use them are
    accepted and the answers' links lead somewhere."""


_INVOICE = "ACME GmbH\nInvoice 2026-0042\nDate 2026-03-01\nTotal 119.00 EUR"
_DOCUMENT_EXAMPLES: Mapping[str, tuple[str, Mapping[str, Any]]] = {
    "inline": ("A document with its text, for a pool of another namespace.",
               {"key": "inv-2026-0042", "text": _INVOICE, "inferencePoolRef": "lading-system/qwen"}),
    "urgent": ("High priority, due within an hour.",
               {"key": "inv-2026-0043", "text": _INVOICE.replace("0042", "0043"),
                "inferencePoolRef": "lading-system/qwen", "priority": "high", "deadlineSeconds": 3600}),
}  # fmt: skip
_BATCH_EXAMPLES: Mapping[str, tuple[str, Mapping[str, Any]]] = {
    "inline": ("A batch of two documents listed inline.", {"name": "march-invoices", "spec": {
        "schema": "invoice.v1", "inferencePoolRef": {"name": "qwen", "namespace": "lading-system"},
        "documents": [{"key": "inv-2026-0042", "text": _INVOICE},
                      {"key": "inv-2026-0043", "text": _INVOICE.replace("0042", "0043")}],
    }}),
}  # fmt: skip
_PROBLEM = models.Problem
_COMMON: Mapping[int, Answer] = {
    401: Answer("No valid bearer token.", _PROBLEM, "application/problem+json"),
    404: Answer("No such object in a namespace this token may act in.", _PROBLEM, "application/problem+json"),
    503: Answer("The database is unreachable or acceptance is saturated.", _PROBLEM, "application/problem+json",
                ("Retry-After",)),
}  # fmt: skip
_POST: Mapping[int, Answer] = {
    400: Answer("No Idempotency-Key, or the body is not JSON.", _PROBLEM, "application/problem+json"),
    409: Answer("A request with this Idempotency-Key is still being processed, or (batches) a batch of this name "
                "exists with another spec.", _PROBLEM, "application/problem+json"),
    413: Answer("The body is larger than the limit.", _PROBLEM, "application/problem+json"),
    415: Answer("The body is not application/json.", _PROBLEM, "application/problem+json"),
    422: Answer("Invalid, or not admitted (unknown or not allowed pool, priority, endpoint), or the "
                "Idempotency-Key was used for another request: every field error listed.",
                _PROBLEM, "application/problem+json"),
    429: Answer("The tenant's queue (maxQueuedJobs / maxQueuedBytes) is full.", _PROBLEM,
                "application/problem+json", ("Retry-After",)),
}  # fmt: skip

ROUTES: tuple[Route, ...] = (
    Route("POST", "/v1/namespaces/{namespace}/documents", "post_document", "submitDocument",
          "Submit one document; it is appended to a rolling batch of its namespace.",
          request=intake.DocumentRequest, examples=_DOCUMENT_EXAMPLES,
          answers={202: Answer("Accepted (or the replay of the first answer to this Idempotency-Key).",
                               models.DocumentAccepted, headers=("Location", "Idempotency-Replayed"),
                               links={"GetJob": ("getJob", {"id": "$response.body#/jobId"}),
                                      "GetJobResult": ("getJobResult", {"id": "$response.body#/jobId"})}),
                   **_POST, **_COMMON}),
    Route("POST", "/v1/namespaces/{namespace}/batches", "post_batch", "submitBatch",
          "Submit an ExtractionBatch spec under a name; admitted as the custom resource is.",
          request=models.BatchSubmission, examples=_BATCH_EXAMPLES,
          answers={202: Answer("Accepted (or the replay of the first answer to this Idempotency-Key).",
                               models.BatchAccepted, headers=("Location", "Idempotency-Replayed"),
                               links={name: (operation, {"namespace": "$request.path.namespace",
                                                         "name": "$response.body#/name"})
                                      for name, operation in (("GetBatch", "getBatch"),
                                                              ("GetBatchResults", "getBatchResults"),
                                                              ("CancelBatch", "cancelBatch"))}),
                   **_POST, **_COMMON}),
    Route("GET", "/v1/namespaces/{namespace}/batches/{name}", "get_batch", "getBatch",
          "A batch's status: the custom resource's status fields.",
          answers={200: Answer("The batch's status.", models.BatchStatusView), **_COMMON}),
    Route("DELETE", "/v1/namespaces/{namespace}/batches/{name}", "delete_batch", "cancelBatch",
          "Cancel a batch as deleting its custom resource does: unfinished jobs are cancelled, results kept.",
          answers={200: Answer("Cancelled; the batch's status after it.", models.BatchStatusView), **_COMMON}),
    Route("GET", "/v1/namespaces/{namespace}/batches/{name}/results", "get_batch_results", "getBatchResults",
          "A batch's jobs with their results, one JSON object a line, in key order, keyset-paged.",
          answers={200: Answer("One ResultLine a line; a `Link: <...>; rel=\"next\"` header when more follow.",
                               models.ResultLine, NDJSON, ("Link",)),
                   400: Answer("A limit outside 1 to 1000, or an `after` that cannot be a document key.", _PROBLEM,
                               "application/problem+json"), **_COMMON},
          query=(("after", {"type": "string"},
                  "Start after this document key (from the previous page's Link)."),
                 ("limit", {"type": "integer", "minimum": 1, "maximum": 1000},
                  "Lines per page, 1 to 1000 (default 100)."))),
    Route("GET", "/v1/jobs/{id}", "get_job", "getJob",
          "A job's state: 200 with Retry-After while it waits or runs, 303 to its result once terminal or in review.",
          answers={200: Answer("Waiting or running.", models.JobView, headers=("Retry-After",)),
                   303: Answer("Terminal or in review: see Location.", models.JobView, headers=("Location",),
                               links={"GetJobResult": ("getJobResult", {"id": "$response.body#/id"})}),
                   **_COMMON}),
    Route("GET", "/v1/jobs/{id}/result", "get_job_result", "getJobResult",
          "A job's result and verdict.",
          answers={200: Answer("The result (null until there is one).", models.JobResultView), **_COMMON}),
    Route("GET", "/openapi.json", "get_openapi", "getOpenApi", "This document.", public=True,
          answers={200: Answer("The OpenAPI document.")}),
    Route("GET", "/healthz", "healthz", "healthz", "Liveness: 200 while the process answers.", public=True,
          answers={200: Answer("Alive.", content_type="text/plain")}),
    Route("GET", "/readyz", "readyz", "readyz",
          "Readiness: 200 when the database answers and no migration is pending, else 503 with the reason.",
          public=True, answers={200: Answer("Ready.", content_type="text/plain"),
                                503: Answer("Not ready.", content_type="text/plain")}),
    Route("GET", "/metrics", "metrics", "metrics", "Prometheus metrics.", public=True,
          answers={200: Answer("Prometheus text format.", content_type="text/plain")}),
)  # fmt: skip
