"""How an attempt's answer is classified, and what the retry budget makes of it (pure)."""

from __future__ import annotations

import datetime as dt
import uuid

import pytest
from lading_worker import dispatching

from lading.db import deliveries
from lading.delivery.states import DeliveryState
from lading.ids import BatchId, DeliveryId, Fence, JobId
from lading.settings import DeliverySettings

NOW = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)
SETTINGS = DeliverySettings(backoff_base_s=2.0, backoff_cap_s=60.0, total_timeout_s=20.0)
BUDGET = dispatching.Budget(max_attempts=3, max_age_s=3600)


def _claimed(*, budget_attempts: int = 1, ambiguous: int = 0, first: dt.datetime = NOW) -> deliveries.ClaimedDelivery:
    return deliveries.ClaimedDelivery(
        id=DeliveryId(uuid.uuid4()), job_id=JobId(1), endpoint="acme/erp", attempt=budget_attempts,
        budget_attempts=budget_attempts, ambiguous_attempts=ambiguous, fence=Fence(budget_attempts),
        first_attempt_at=first, created_at=first, claimed_at=NOW, tenant="acme", document_key="k", schema="invoice.v1",
        batch_id=BatchId(1), batch_namespace="acme", batch_name="b", result={}, validation_policy="p",
        validation_outcome="passed",
    )  # fmt: skip


@pytest.mark.parametrize(
    ("status", "kind"),
    [(200, "delivered"), (201, "delivered"), (204, "delivered"), (301, "refused"), (302, "refused"),
     (307, "refused"), (400, "refused"), (404, "refused"), (409, "refused"), (422, "refused"), (401, "auth"),
     (403, "auth"), (408, "retry"), (429, "retry"), (500, "retry"), (502, "retry"), (503, "retry"),
     (504, "retry"), (100, "refused")],
)  # fmt: skip
def test_statuses_are_classified(status: int, kind: str) -> None:
    assert dispatching.classify_status(status, retry_after=None, location=None, now=NOW).kind == kind


def test_retry_after_in_seconds_and_as_a_date_are_read() -> None:
    assert dispatching.classify_status(429, retry_after="30", location=None, now=NOW).retry_after_s == 30
    date = "Sun, 01 Mar 2026 12:01:00 GMT"
    assert dispatching.classify_status(503, retry_after=date, location=None, now=NOW).retry_after_s == 60


def test_a_redirect_names_only_the_host_it_pointed_to() -> None:
    outcome = dispatching.classify_status(302, retry_after=None, location="https://evil.example/x?t=1", now=NOW)
    assert outcome.error == "HTTP 302: redirect to evil.example not followed; register the final URL"


def _decide(outcome: dispatching.AttemptOutcome, claimed: deliveries.ClaimedDelivery) -> deliveries.Finish:
    return dispatching.decide(claimed, outcome, budget=BUDGET, settings=SETTINGS, now=NOW, rand=lambda: 0.5)


def test_a_2xx_delivers_and_a_4xx_fails_at_once_whatever_the_budget() -> None:
    ok = _decide(dispatching.AttemptOutcome("delivered", status=200), _claimed())
    assert (ok.to, ok.outcome) == (DeliveryState.DELIVERED, "delivered")
    refused = _decide(dispatching.AttemptOutcome("refused", status=422), _claimed(budget_attempts=1))
    assert (refused.to, refused.outcome) == (DeliveryState.FAILED_TERMINAL, "failed")


def test_a_retryable_answer_retries_with_backoff_or_retry_after_whichever_is_longer() -> None:
    backoff = _decide(dispatching.AttemptOutcome("retry", status=503), _claimed(budget_attempts=2))
    assert (backoff.to, backoff.retry_in_s) == (DeliveryState.RETRY_SCHEDULED, 2.0)  # 0.5 * 2 * 2^1
    later = _decide(dispatching.AttemptOutcome("retry", status=429, retry_after_s=90), _claimed())
    assert later.retry_in_s == 90


@pytest.mark.parametrize(
    ("kind", "earlier_ambiguous", "expected"),
    [("retry", 0, DeliveryState.FAILED_TERMINAL), ("auth", 0, DeliveryState.FAILED_TERMINAL),
     ("ambiguous", 0, DeliveryState.UNKNOWN_EXTERNAL), ("retry", 1, DeliveryState.UNKNOWN_EXTERNAL)],
)  # fmt: skip
def test_a_spent_budget_ends_unknown_only_when_some_attempt_may_have_been_applied(
        kind: str, earlier_ambiguous: int, expected: DeliveryState
) -> None:
    finish = _decide(dispatching.AttemptOutcome(kind), _claimed(budget_attempts=3, ambiguous=earlier_ambiguous))
    assert finish.to is expected
    assert finish.error is not None and "retry budget spent (ATTEMPTS_EXHAUSTED)" in finish.error


def test_the_age_budget_ends_retries_when_the_next_attempt_would_not_fit() -> None:
    old = _claimed(budget_attempts=1, first=NOW - dt.timedelta(seconds=3590))
    finish = _decide(dispatching.AttemptOutcome("retry", status=503), old)
    assert finish.to is DeliveryState.FAILED_TERMINAL
    assert finish.error is not None and "DEADLINE_EXHAUSTED" in finish.error


def test_a_budget_comes_from_the_endpoint_spec_with_the_documented_defaults() -> None:
    assert dispatching.Budget.of({"retryBudget": {"maxAttempts": 4, "maxAgeSeconds": 60}}) == dispatching.Budget(4, 60)
    assert dispatching.Budget.of({}) == dispatching.Budget(12, 86400)
    assert dispatching.Budget.of({"retryBudget": None}) == dispatching.Budget(12, 86400)
