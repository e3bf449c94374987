"""The JSON body of a delivery: a public, versioned contract (Standard Webhooks shape).

```json
{"type": "extraction.completed.v1", "timestamp": "<RFC 3339>",
 "data": {"job_id": "...", "tenant": "...", "batch": {"namespace": "...", "name": "..."},
          "document_key": "...", "schema": "invoice.v1", "result": {...invoice.v1...},
          "validation": {"policy": "...", "outcome": "passed" | "approved" | "corrected"}}}
```

Fields may be added (receivers must ignore unknown ones, so the model allows extras); these
may never be removed or change meaning. A breaking change is a new `type` (`...v2`).
`job_id` is a string so that receivers in any language keep all 64 bits.
"""

from __future__ import annotations

import datetime
from typing import Any, Literal

import pydantic

COMPLETED_V1: Literal["extraction.completed.v1"] = "extraction.completed.v1"

ValidationOutcome = Literal["passed", "approved", "corrected"]


class _Contract(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="allow", frozen=True)


class BatchRef(_Contract):
    namespace: str = pydantic.Field(min_length=1, max_length=63)
    name: str = pydantic.Field(min_length=1, max_length=253)


class ValidationInfo(_Contract):
    policy: str = pydantic.Field(min_length=1, max_length=63)
    outcome: ValidationOutcome


class CompletedData(_Contract):
    job_id: str = pydantic.Field(min_length=1, max_length=32, pattern=r"^[0-9]+$")
    tenant: str = pydantic.Field(min_length=1, max_length=253)
    batch: BatchRef
    document_key: str = pydantic.Field(min_length=1, max_length=256)
    extraction_schema: str = pydantic.Field(alias="schema", min_length=1, max_length=63)
    result: dict[str, Any]
    validation: ValidationInfo


class CompletedEvent(_Contract):
    type: Literal["extraction.completed.v1"] = COMPLETED_V1
    timestamp: datetime.datetime
    data: CompletedData

    def to_json(self) -> bytes:
        """The body as sent: compact JSON, RFC 3339 timestamp, `schema` under its contract name."""
        return self.model_dump_json(by_alias=True).encode()


def completed(
        *,
        job_id: int,
        tenant: str,
        batch_namespace: str,
        batch_name: str,
        document_key: str,
        schema: str,
        result: dict[str, Any],
        policy: str,
        outcome: ValidationOutcome,
        timestamp: datetime.datetime,
) -> CompletedEvent:
    return CompletedEvent(
        timestamp=timestamp,
        data=CompletedData(
            job_id=str(job_id),
            tenant=tenant,
            batch=BatchRef(namespace=batch_namespace, name=batch_name),
            document_key=document_key,
            schema=schema,
            result=result,
            validation=ValidationInfo(policy=policy, outcome=outcome),
        ),
    )
