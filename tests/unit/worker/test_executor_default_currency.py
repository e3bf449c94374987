"""The executor passes its pool's default currency to the validation policy."""

from __future__ import annotations

import datetime as dt
from typing import Any

from lading_worker import executing

from lading.db import jobs
from lading.ids import BatchId, Fence, JobId, PoolName
from lading.jobs.states import JobState
from lading.providers import base
from lading.settings import AttemptSettings
from tests.support import providers

NOW = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)
DOCUMENT = """\
Nordlicht Software GmbH
Hauptstraße 5 · 20457 Hamburg
USt-IdNr.: DE123456789

Rechnung an:
Anadolu Lojistik A.Ş.
USt-IdNr.: DE811907980

Rechnungsnummer: RE-2025-0042
Rechnungsdatum: 04.03.2025

Beratung   2   617,25   19%   1.234,50

Zwischensumme:   1.234,50
MwSt. 19%:   234,56
Gesamtbetrag:   1.469,06

IBAN: DE89 3704 0044 0532 0130 00
"""
RESULT: dict[str, Any] = {
    "invoice_number": "RE-2025-0042", "issue_date": "2025-03-04", "currency": "EUR",
    "supplier": {"name": "Nordlicht Software GmbH", "vat_id": "DE123456789", "iban": "DE89370400440532013000"},
    "buyer": {"name": "Anadolu Lojistik A.Ş.", "vat_id": "DE811907980"},
    "lines": [{"description": "Beratung", "quantity": "2", "unit_price": "617.25", "amount": "1234.50",
               "tax_rate": "19"}],
    "subtotal": "1234.50", "tax_total": "234.56", "total": "1469.06",
    "evidence": {"invoice_number": "RE-2025-0042", "supplier.iban": "DE89 3704 0044 0532 0130 00",
                 "lines[0].amount": "1.234,50", "subtotal": "Zwischensumme:   1.234,50",
                 "tax_total": "MwSt. 19%:   234,56", "total": "Gesamtbetrag:   1.469,06"},
}


def _job() -> jobs.ClaimedJob:
    return jobs.ClaimedJob(
        id=JobId(1), tenant="acme", batch_id=BatchId(1), document_key="k", attempt=1, max_attempts=5,
        fence=Fence(1), lease_until=NOW, deadline_at=NOW + dt.timedelta(hours=1), schema="invoice.v1",
        validation_policy="invoice-strict-v2", pool=PoolName("p"), text=DOCUMENT, claimed_at=NOW,
    )  # fmt: skip


def _executor(*, default_currency: str | None) -> executing.Executor:
    return executing.Executor(
        provider=providers.ScriptedProvider(providers.always(base.Outcome.ok({}))),
        settings=AttemptSettings(timeout_s=10, backoff_base_s=2, backoff_cap_s=60),
        default_currency=default_currency,
    )


def test_a_document_showing_no_currency_goes_to_review_without_a_default() -> None:
    finish = _executor(default_currency=None).decide(_job(), base.Outcome.ok(RESULT), now=NOW, latency_ms=1)
    assert finish.to is JobState.REVIEW_REQUIRED
    assert finish.validation is not None
    assert [c["check"] for c in finish.validation["failed_checks"]] == ["currency_not_shown"]


def test_the_default_currency_grounds_it_and_only_that_currency() -> None:
    finish = _executor(default_currency="EUR").decide(_job(), base.Outcome.ok(RESULT), now=NOW, latency_ms=1)
    assert finish.to is JobState.SUCCEEDED
    finish = _executor(default_currency="TRY").decide(_job(), base.Outcome.ok(RESULT), now=NOW, latency_ms=1)
    assert finish.to is JobState.REVIEW_REQUIRED
