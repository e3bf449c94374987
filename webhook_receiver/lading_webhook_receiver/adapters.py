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

The receiver commits deliveries in groups (`inbox.GroupCommitter`): one transaction holds many
deliveries' inbox rows and effects. An adapter may also offer `apply_many` (`GroupApplying`),
the effects of a whole group in a few statements; otherwise `apply` is called once per
delivery, in the group's transaction. Either way the effects must lock shared rows (intent
keys) in one canonical order, so two concurrent groups never wait on each other in a cycle.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Protocol, TypeVar, runtime_checkable

import asyncpg
import pydantic

from lading import errors
from lading.webhooks import payload

OperationT = TypeVar("OperationT")
OperationContraT = TypeVar("OperationContraT", contravariant=True)


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


@runtime_checkable
class GroupApplying(Protocol[OperationContraT]):
    """An adapter that applies a whole group's effects at once (inside the group's transaction)."""

    async def apply_many(
            self, conn: asyncpg.Connection, *, operations: Sequence[tuple[OperationContraT, str]]
    ) -> list[Effect]:
        """The effect of each (operation, delivery id), in the order given; the delivery ids are distinct."""
        ...


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
