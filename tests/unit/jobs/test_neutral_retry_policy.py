"""One neutral RetryPolicy decides for jobs and for deliveries: a job's comes from its attempt
settings, a delivery's from its endpoint's budget and the dispatcher's backoff, and both make the
same decision for the same numbers."""

from __future__ import annotations

import datetime as dt

import pytest
from lading_worker import dispatching

from lading.jobs import retry
from lading.settings import AttemptSettings, DeliverySettings

NOW = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)


def test_a_jobs_policy_is_its_attempt_settings() -> None:
    policy = retry.RetryPolicy.for_attempts(
        AttemptSettings(timeout_s=30.0, max_attempts=4, backoff_base_s=1.5, backoff_cap_s=90.0)
    )
    assert policy == retry.RetryPolicy(max_attempts=4, base_s=1.5, cap_s=90.0, attempt_timeout_s=30.0)


def test_a_deliverys_policy_is_its_budget_and_the_dispatchers_backoff() -> None:
    budget = dispatching.Budget(max_attempts=7, max_age_s=3600.0)
    policy = budget.policy(DeliverySettings(backoff_base_s=2.0, backoff_cap_s=600.0, total_timeout_s=20.0))
    assert policy == retry.RetryPolicy(max_attempts=7, base_s=2.0, cap_s=600.0, attempt_timeout_s=20.0)
    assert budget.deadline(NOW) == NOW + dt.timedelta(hours=1)


@pytest.mark.parametrize("attempt", [1, 2, 3, 4, 5])
def test_jobs_and_deliveries_decide_alike_for_the_same_numbers(attempt: int) -> None:
    settings = AttemptSettings(timeout_s=20.0, max_attempts=5, backoff_base_s=2.0, backoff_cap_s=60.0)
    deadline = NOW + dt.timedelta(hours=1)
    job = retry.decide(attempt=attempt, now=NOW, deadline_at=deadline, settings=settings, rand=lambda: 0.5)
    budget = dispatching.Budget(max_attempts=5, max_age_s=3600.0)
    delivery = budget.policy(DeliverySettings(backoff_base_s=2.0, backoff_cap_s=60.0, total_timeout_s=20.0)).decide(
        attempt=attempt, now=NOW, deadline_at=budget.deadline(NOW), rand=lambda: 0.5,
    )
    assert job == delivery


@pytest.mark.parametrize(("attempt", "expected"), [(1, 1.0), (2, 2.0), (3, 4.0), (4, 5.0)])
def test_a_policy_without_jitter_waits_the_whole_backoff(attempt: int, expected: float) -> None:
    policy = retry.RetryPolicy(max_attempts=10, base_s=1.0, cap_s=5.0, attempt_timeout_s=1.0, jitter="none")
    assert policy.backoff_s(attempt=attempt, rand=lambda: 0.0) == expected
    decision = policy.decide(attempt=attempt, now=NOW, deadline_at=NOW + dt.timedelta(hours=1))
    assert decision.at == NOW + dt.timedelta(seconds=expected)
