"""
The seam between the receiver and an ERP: an `ErpAdapter` turns a verified, schema-valid
delivery into one ERP operation and applies it.

    prepare(event)                   pure: validate what this ERP needs, build the operation;
                                     raise PayloadRejected (answered 400, nothing written)
    apply(conn, operation, ...)      inside the receiver's transaction, after the inbox row is
                                     claimed and before it commits; returns the ERP reference

The receiver's guarantee (one effect per delivery id, the same answer to every redelivery)
holds exactly when `apply` writes through `conn`: the inbox row and the effect commit or roll
back together. An adapter for a remote ERP cannot share that transaction: it must make the
remote call idempotent itself (the ERP's own idempotency key or a unique external reference,
e.g. the intent key), or a crash between the remote success and our commit books twice.

`apply` must deduplicate the business intent with a unique key and `ON CONFLICT`, never
"select, then insert": two deliveries of the same intent can run at the same moment.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol, TypeVar

import asyncpg
import pydantic

from lading import errors
from lading.webhooks import payload

OperationT = TypeVar("OperationT")


class PayloadRejected(errors.PermanentError):
    """The body is valid JSON of a known event, but not something this ERP can book.

    `reason` is a bounded metric label (see metrics.REASONS); the message names the field.
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclasses.dataclass(frozen=True)
class Effect:
    reference: str
    """The ERP's reference of the record (new or existing); given to the sender in the answer."""
    created: bool
    """False when the business intent was booked before (a duplicate intent): nothing was written."""


class ErpAdapter(Protocol[OperationT]):
    name: str

    def prepare(self, event: payload.CompletedEvent) -> OperationT: ...

    async def apply(self, conn: asyncpg.Connection, *, operation: OperationT, delivery_id: str) -> Effect: ...


def by_name(name: str) -> ErpAdapter[Any]:
    """The adapter shipped under `name` (`--adapter`)."""
    from lading_webhook_receiver import ledger

    known: dict[str, ErpAdapter[Any]] = {ledger.NAME: ledger.LedgerAdapter()}
    try:
        return known[name]
    except KeyError:
        raise ValueError(f"unknown adapter {name!r}; known: {', '.join(sorted(known))}") from None


def describe(exc: pydantic.ValidationError, *, prefix: str = "", limit: int = 5) -> str:
    """The first few problems as `path: message`, never the offending values (they are document data)."""
    problems: list[str] = []
    for error in exc.errors(include_input=False, include_url=False)[:limit]:
        where = ".".join(str(part) for part in (prefix, *error["loc"]) if part != "") or "(body)"
        problems.append(f"{where}: {error['msg']}")
    more = exc.error_count() - len(problems)
    return "; ".join(problems) + (f"; and {more} more" if more > 0 else "")


NAMES = ("ledger",)
"""Adapter names `by_name` knows (the CLI's choices)."""
