"""The executor passes its pool's default currency to the validation policy."""

from __future__ import annotations

import datetime as dt

from lading_worker import executing

from lading.db import jobs
from lading.ids import BatchId, Fence, JobId, PoolName
from lading.jobs.states import JobState
from lading.providers import base
from lading.settings import AttemptSettings
from tests.support import invoices, providers

NOW = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)
DOCUMENT = invoices.NO_CURRENCY_DOCUMENT
RESULT = invoices.NO_CURRENCY_ANSWER


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
