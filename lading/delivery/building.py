"""
The body of a delivery, built from the rows the claim returned (job, batch, result, review).

The body is a function of committed rows only, and its `timestamp` is the delivery's creation
time (the job's success), so every attempt of one delivery sends the same bytes: a receiver that
keeps a payload hash per `webhook-id` sees retries and redeliveries as exact duplicates. The
contract itself is `lading.webhooks.payload`.
"""

from __future__ import annotations

from typing import cast

import pydantic

from lading import errors
from lading.db import deliveries
from lading.webhooks import payload


class BodyUnavailable(errors.PermanentError):
    """The delivery's result cannot be expressed in the contract (missing result, invalid field)."""


def body(claimed: deliveries.ClaimedDelivery) -> bytes:
    """The JSON body of `claimed`, or BodyUnavailable naming what is missing."""
    if claimed.result is None:
        raise BodyUnavailable(f"job {claimed.job_id} has no stored result")
    outcome = claimed.validation_outcome
    if outcome not in ("passed", "approved", "corrected"):
        raise BodyUnavailable(f"unknown validation outcome {outcome!r}")
    try:
        event = payload.completed(
            job_id=claimed.job_id,
            tenant=claimed.tenant,
            batch_namespace=claimed.batch_namespace,
            batch_name=claimed.batch_name,
            document_key=claimed.document_key,
            schema=claimed.schema,
            result=claimed.result,
            policy=claimed.validation_policy,
            outcome=cast(payload.ValidationOutcome, outcome),
            timestamp=claimed.created_at,
            usage=(
                None if claimed.tokens_in is None and claimed.tokens_out is None
                else payload.Usage(tokens_in=claimed.tokens_in or 0, tokens_out=claimed.tokens_out or 0)
            ),
            cost=(
                None if claimed.cost is None or claimed.cost_currency is None
                else payload.Cost(amount=format(claimed.cost, "f"), currency=claimed.cost_currency)
            ),
        )
    except pydantic.ValidationError as exc:
        where = ", ".join(".".join(str(p) for p in e["loc"]) for e in exc.errors(include_url=False))
        raise BodyUnavailable(f"job {claimed.job_id}'s result does not fit the contract at {where}") from None
    return event.to_json()
