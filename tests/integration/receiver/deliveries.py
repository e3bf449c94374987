"""Signed deliveries for receiver tests: an invoice.v1 result, its completed-event body, its headers."""

from __future__ import annotations

import base64
import datetime as dt
import secrets
import time
from typing import Any

from lading.webhooks import payload, signing


def new_secret() -> str:
    return "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()


def invoice(
        *,
        number: str = "INV-1001",
        supplier: str = "Kuzey Tekstil A.Ş.",
        vat_id: str | None = "TR1234567890",
        total: str = "118.00",
) -> dict[str, Any]:
    return {
        "invoice_number": number,
        "issue_date": "2026-11-02",
        "due_date": "2026-12-02",
        "currency": "EUR",
        "supplier": {"name": supplier, "vat_id": vat_id, "iban": None},
        "buyer": {"name": "Acme GmbH", "vat_id": "DE123456789"},
        "lines": [
            {"description": "Cotton fabric", "quantity": "1", "unit_price": "100.00", "amount": "100.00",
             "tax_rate": "18"},
        ],
        "subtotal": "100.00",
        "tax_total": "18.00",
        "total": total,
        "evidence": {"total": total},
    }  # fmt: skip


def event_body(*, job_id: int = 1, tenant: str = "acme", result: dict[str, Any] | None = None) -> bytes:
    return payload.completed(
        job_id=job_id,
        tenant=tenant,
        batch_namespace=tenant,
        batch_name="november",
        document_key=f"doc-{job_id}.txt",
        schema="invoice.v1",
        result=result if result is not None else invoice(),
        policy="invoice-strict-v1",
        outcome="passed",
        timestamp=dt.datetime(2026, 12, 3, 8, 0, tzinfo=dt.UTC),
    ).to_json()


def signed(body: bytes, *, secret: str, delivery_id: str, timestamp: int | None = None) -> dict[str, str]:
    headers = signing.sign(
        signing.parse_keys([secret]), delivery_id, int(time.time()) if timestamp is None else timestamp, body
    )
    return {**headers, "Content-Type": "application/json"}
