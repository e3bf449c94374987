"""
The `ledger` adapter: a reference ERP that books supplier invoices (`invoice.v1` results)
into the receiver's own table `ledger_invoices`, so a demo or a test can count ERP records.

Business intent: an invoice is the same invoice when (tenant, supplier identity, invoice
number) is the same, whichever delivery, job or batch carried it. The supplier identity is
the supplier's VAT id when the invoice has one (normalised: upper case, no spaces, dots or
dashes), else its name (normalised: Unicode NFKC, case-folded, whitespace collapsed). The
unique key on those three columns decides races; a duplicate intent books nothing and is
answered with the existing invoice's reference.

Each booked invoice gets a unique reference `LDG-0000000042` from the table's identity
(references may have gaps: a duplicate intent consumes a number it then does not use).
"""

from __future__ import annotations

import dataclasses
import decimal
import re
import unicodedata
from collections.abc import Sequence
from typing import Any

import asyncpg
import pydantic

from lading.models import invoice
from lading.webhooks import payload
from lading_webhook_receiver import adapters, queries

NAME = "ledger"

_VAT_NOISE = re.compile(r"[\s.\-]+")
_SPACES = re.compile(r"\s+")


def supplier_identity(supplier: invoice.Supplier) -> str:
    """`vat:<VAT id>` when the invoice names one, else `name:<normalised name>`."""
    if supplier.vat_id and (vat := _VAT_NOISE.sub("", supplier.vat_id).upper()):
        return f"vat:{vat}"
    name = _SPACES.sub(" ", unicodedata.normalize("NFKC", supplier.name).casefold()).strip()
    return f"name:{name}"


@dataclasses.dataclass(frozen=True)
class Booking:
    tenant: str
    supplier_identity: str
    invoice_number: str
    invoice: invoice.Invoice
    lading_job_id: str


class LedgerAdapter:
    name = NAME

    def prepare(self, event: payload.CompletedEvent) -> Booking:
        data = event.data
        if data.extraction_schema != invoice.SCHEMA_NAME:
            raise adapters.PayloadRejected(
                "unsupported-schema",
                f"data.schema: the ledger books {invoice.SCHEMA_NAME} results, not {data.extraction_schema!r}",
            )
        try:
            document = invoice.Invoice.model_validate(data.result)
        except pydantic.ValidationError as exc:
            raise adapters.PayloadRejected("bad-schema", adapters.describe(exc, prefix="data.result")) from None
        number = document.invoice_number.strip()
        if not number:
            raise adapters.PayloadRejected("bad-schema", "data.result.invoice_number: must not be blank")
        return Booking(
            tenant=data.tenant,
            supplier_identity=supplier_identity(document.supplier),
            invoice_number=number,
            invoice=document,
            lading_job_id=data.job_id,
        )

    async def apply(self, conn: asyncpg.Connection, *, operation: Booking, delivery_id: str) -> adapters.Effect:
        document = operation.invoice
        key = (operation.tenant, operation.supplier_identity, operation.invoice_number)
        reference = await conn.fetchval(
            queries.LEDGER_INVOICES_BOOK,
            *key,
            document.supplier.name,
            document.supplier.vat_id,
            document.currency,
            decimal.Decimal(document.total),
            document.issue_date,
            document.to_json(),
            operation.lading_job_id,
            delivery_id,
        )
        if reference is not None:
            return adapters.Effect(reference=reference, created=True)
        # A new statement: under READ COMMITTED it sees the row whose commit the INSERT waited for.
        existing = await conn.fetchval(queries.LEDGER_INVOICES_GET_REFERENCE, *key)
        if existing is None:  # the conflicting row vanished between the two statements
            raise asyncpg.exceptions.SerializationError("ledger invoice changed concurrently; retry")
        return adapters.Effect(reference=existing, created=False)

    async def apply_many(
            self, conn: asyncpg.Connection, *, operations: Sequence[tuple[Booking, str]]
    ) -> list[adapters.Effect]:
        """A group's bookings in two statements: book every new intent (in intent key order), then
        read the reference of each intent that was booked before (or earlier in this group)."""
        if not operations:
            return []
        columns: list[list[Any]] = [[] for _ in range(11)]
        for booking, delivery_id in operations:
            document = booking.invoice
            row = (
                booking.tenant, booking.supplier_identity, booking.invoice_number, document.supplier.name,
                document.supplier.vat_id, document.currency, decimal.Decimal(document.total), document.issue_date,
                document.to_json(), booking.lading_job_id, delivery_id,
            )  # fmt: skip
            for column, value in zip(columns, row, strict=True):
                column.append(value)
        rows = await conn.fetch(queries.LEDGER_INVOICES_BOOK_MANY, *columns)
        booked = {r["delivery_id"]: r["reference"] for r in rows}
        wanted = [(b.tenant, b.supplier_identity, b.invoice_number) for b, d in operations if d not in booked]
        existing: dict[tuple[str, str, str], str] = {}
        if wanted:
            found_rows = await conn.fetch(
                queries.LEDGER_INVOICES_GET_REFERENCES,
                [k[0] for k in wanted], [k[1] for k in wanted], [k[2] for k in wanted],
            )  # fmt: skip
            existing = {(r["tenant"], r["supplier_identity"], r["invoice_number"]): r["reference"] for r in found_rows}
        effects: list[adapters.Effect] = []
        for booking, delivery_id in operations:
            if (reference := booked.get(delivery_id)) is not None:
                effects.append(adapters.Effect(reference=reference, created=True))
                continue
            found = existing.get((booking.tenant, booking.supplier_identity, booking.invoice_number))
            if found is None:  # the conflicting row vanished between the two statements
                raise asyncpg.exceptions.SerializationError("ledger invoice changed concurrently; retry")
            effects.append(adapters.Effect(reference=found, created=False))
        return effects


async def count(conn: asyncpg.Connection) -> int:
    """How many invoices the ledger holds (every ERP record, for demos and tests)."""
    return int(await conn.fetchval(queries.LEDGER_INVOICES_COUNT))
