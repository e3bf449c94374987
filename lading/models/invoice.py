"""
Extraction schema `invoice.v1`: the shape the ERP receives. Keep the names.

Money is a decimal string (`"1234.50"`), never a float: a float cannot hold 0.10 and
the ERP books exact amounts. `evidence` maps a field path (`total`, `supplier.iban`,
`lines[0].amount`) to the exact substring of the source text that supports it, so a
validator can check that every value was read, not invented.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Annotated, Any

import pydantic

SCHEMA_NAME = "invoice.v1"

DecimalString = Annotated[
    str,
    pydantic.StringConstraints(pattern=r"^-?\d{1,15}(\.\d{1,6})?$", max_length=24),
    pydantic.Field(description="A decimal number as a string, '.' as the decimal separator, no grouping"),
]
CurrencyCode = Annotated[str, pydantic.StringConstraints(pattern=r"^[A-Z]{3}$")]


class _Strict(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)


class Party(_Strict):
    name: Annotated[str, pydantic.StringConstraints(min_length=1, max_length=300)]
    vat_id: Annotated[str, pydantic.StringConstraints(max_length=32)] | None = None


class Supplier(Party):
    iban: Annotated[str, pydantic.StringConstraints(max_length=42)] | None = None


class Line(_Strict):
    description: Annotated[str, pydantic.StringConstraints(min_length=1, max_length=1000)]
    quantity: DecimalString
    unit_price: DecimalString
    amount: DecimalString
    tax_rate: DecimalString


class Invoice(_Strict):
    """An extracted supplier invoice (schema `invoice.v1`)."""

    invoice_number: Annotated[str, pydantic.StringConstraints(min_length=1, max_length=64)]
    issue_date: dt.date
    due_date: dt.date | None = None
    currency: CurrencyCode
    supplier: Supplier
    buyer: Party
    lines: Annotated[list[Line], pydantic.Field(min_length=1, max_length=500)]
    subtotal: DecimalString
    tax_total: DecimalString
    total: DecimalString
    evidence: Annotated[dict[str, str], pydantic.Field(max_length=2000)] = pydantic.Field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The JSON document stored as the result and delivered to the ERP."""
        return self.model_dump(mode="json")


def money(value: str) -> Decimal:
    """Parse a DecimalString for arithmetic."""
    return Decimal(value)


def json_schema() -> dict[str, Any]:
    """JSON Schema for structured-output decoding (providers pass it as `response_format`)."""
    return Invoice.model_json_schema()
