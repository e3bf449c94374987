"""The JSON body of a delivery: a public, versioned contract (Standard Webhooks shape).

```json
{"type": "extraction.completed.v1", "timestamp": "<RFC 3339>",
 "data": {"job_id": "...", "tenant": "...", "batch": {"namespace": "...", "name": "..."},
          "document_key": "...", "schema": "invoice.v1", "result": {...invoice.v1...},
          "validation": {"policy": "...", "outcome": "passed" | "approved" | "corrected"},
          "usage": {"tokens_in": 1234, "tokens_out": 210},
          "cost": {"amount": "0.000311", "currency": "USD"}}}
```

`usage` (the tokens every attempt of the job reported) and `cost` (what its attempts cost at the
pool's `spec.pricing`, an exact decimal string, docs/cost.md) are optional: absent when unknown
(no attempt reported tokens; an unpriced pool).

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


class Usage(_Contract):
    tokens_in: int = pydantic.Field(ge=0, le=2**63 - 1)
    tokens_out: int = pydantic.Field(ge=0, le=2**63 - 1)


class Cost(_Contract):
    amount: str = pydantic.Field(min_length=1, max_length=64, pattern=r"^[0-9]+(\.[0-9]+)?$")
    currency: str = pydantic.Field(min_length=3, max_length=3, pattern=r"^[A-Z]{3}$")


class CompletedData(_Contract):
    job_id: str = pydantic.Field(min_length=1, max_length=32, pattern=r"^[0-9]+$")
    tenant: str = pydantic.Field(min_length=1, max_length=253)
    batch: BatchRef
    document_key: str = pydantic.Field(min_length=1, max_length=256)
    extraction_schema: str = pydantic.Field(alias="schema", min_length=1, max_length=63)
    result: dict[str, Any]
    validation: ValidationInfo
    usage: Usage | None = None
    cost: Cost | None = None


class CompletedEvent(_Contract):
    type: Literal["extraction.completed.v1"] = COMPLETED_V1
    timestamp: datetime.datetime
    data: CompletedData

    def to_json(self) -> bytes:
        """The body as sent: compact JSON, RFC 3339 timestamp, `schema` under its contract name; the
        optional `usage` and `cost` only when known."""
        absent = {name for name in ("usage", "cost") if getattr(self.data, name) is None}
        return self.model_dump_json(by_alias=True, exclude={"data": absent} if absent else None).encode()


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
        usage: Usage | None = None,
        cost: Cost | None = None,
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
            usage=usage,
            cost=cost,
        ),
    )
