"""The one retry policy: Retry-After parsing, full-jitter backoff, and retry/give-up decisions."""

from __future__ import annotations

import collections.abc
import datetime
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lading import settings
from lading.jobs import retry

NOW = datetime.datetime(2025, 3, 1, 12, 0, 0, tzinfo=datetime.UTC)
SETTINGS = settings.AttemptSettings(timeout_s=120.0, max_attempts=5, backoff_base_s=2.0, backoff_cap_s=300.0)


def _rand(value: float) -> collections.abc.Callable[[], float]:
    return lambda: value


# ---------------------------------------------------------------------------------------------
# parse_retry_after
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param("0", 0.0, id="zero-seconds"),
        pytest.param("120", 120.0, id="seconds"),
        pytest.param("  30 ", 30.0, id="seconds-with-whitespace"),
        pytest.param("86400000", 86_400_000.0, id="absurd-seconds-returned-as-is"),
        pytest.param("Sat, 01 Mar 2025 12:02:00 GMT", 120.0, id="imf-fixdate-future"),
        pytest.param("Sat, 01 Mar 2025 11:00:00 GMT", 0.0, id="imf-fixdate-past"),
        pytest.param("Saturday, 01-Mar-25 12:00:30 GMT", 30.0, id="rfc850-future"),
        pytest.param("Sat Mar  1 12:01:00 2025", 60.0, id="asctime-future"),
        pytest.param("Sun, 06 Nov 1994 08:49:37 GMT", 0.0, id="long-past"),
        pytest.param("Sat, 01 Mar 2025 14:00:00 +0200", 0.0, id="numeric-zone"),
        pytest.param("garbage", None, id="garbage"),
        pytest.param("-5", None, id="negative"),
        pytest.param("1.5", None, id="fractional"),
        pytest.param("120s", None, id="seconds-with-unit"),
        pytest.param("", None, id="empty"),
        pytest.param("   ", None, id="blank"),
        pytest.param(None, None, id="absent"),
    ],
)
def test_retry_after_is_parsed_as_seconds_from_now(value: str | None, expected: float | None) -> None:
    assert retry.parse_retry_after(value, now=NOW) == expected


def test_retry_after_beyond_float_range_is_infinite() -> None:
    assert retry.parse_retry_after("9" * 400, now=NOW) == math.inf
    assert retry.parse_retry_after("9" * 5000, now=NOW) == math.inf


def test_retry_after_needs_an_aware_now() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        retry.parse_retry_after("5", now=NOW.replace(tzinfo=None))


@given(value=st.text())
def test_retry_after_never_raises_and_is_never_negative(value: str) -> None:
    seconds = retry.parse_retry_after(value, now=NOW)
    assert seconds is None or seconds >= 0.0


# ---------------------------------------------------------------------------------------------
# backoff_s
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("attempt", "rand", "expected"),
    [
        pytest.param(1, 0.0, 0.0, id="zero-draw"),
        pytest.param(1, 0.5, 1.0, id="first-retry-half-of-base"),
        pytest.param(2, 0.5, 2.0, id="doubles"),
        pytest.param(3, 0.5, 4.0, id="doubles-again"),
        pytest.param(9, 0.5, 150.0, id="capped"),
        pytest.param(10_000, 0.5, 150.0, id="huge-attempt-capped-without-overflow"),
    ],
)
def test_backoff_is_full_jitter_over_a_capped_exponential(attempt: int, rand: float, expected: float) -> None:
    assert retry.backoff_s(attempt=attempt, base_s=2.0, cap_s=300.0, rand=_rand(rand)) == expected


@given(
    attempt=st.integers(min_value=1, max_value=100_000),
    base_s=st.floats(min_value=0.0, max_value=1e6),
    cap_s=st.floats(min_value=0.0, max_value=1e6),
    rand=st.floats(min_value=0.0, max_value=1.0, exclude_max=True),
)
def test_backoff_stays_within_zero_and_cap(attempt: int, base_s: float, cap_s: float, rand: float) -> None:
    delay = retry.backoff_s(attempt=attempt, base_s=base_s, cap_s=cap_s, rand=_rand(rand))
    assert 0.0 <= delay <= cap_s
    assert delay <= base_s * 2.0 ** min(attempt - 1, 1000)


def test_backoff_rejects_attempt_zero() -> None:
    with pytest.raises(ValueError, match="attempt"):
        retry.backoff_s(attempt=0, base_s=2.0, cap_s=300.0, rand=_rand(0.5))


# ---------------------------------------------------------------------------------------------
# decide
# ---------------------------------------------------------------------------------------------

def test_failed_attempt_is_retried_after_the_jittered_backoff() -> None:
    decision = retry.decide(
        attempt=3,
        now=NOW,
        deadline_at=NOW + datetime.timedelta(hours=1),
        settings=SETTINGS,
        rand=_rand(0.25),
    )
    at = NOW + datetime.timedelta(seconds=2.0)
    assert decision == retry.RetryDecision(retry=True, at=at, reason="RETRY")


def test_a_retry_without_backoff_is_due_now_yet_still_bounded() -> None:
    now_due = retry.decide(attempt=3, now=NOW, deadline_at=NOW + datetime.timedelta(hours=1), settings=SETTINGS,
                           back_off=False, rand=_rand(0.99))
    assert now_due == retry.RetryDecision(retry=True, at=NOW, reason="RETRY")
    later = retry.decide(attempt=3, now=NOW, deadline_at=NOW + datetime.timedelta(hours=1), settings=SETTINGS,
                         back_off=False, retry_after_s=7)
    assert later.at == NOW + datetime.timedelta(seconds=7)
    spent = retry.decide(attempt=5, now=NOW, deadline_at=NOW + datetime.timedelta(hours=1), settings=SETTINGS,
                         back_off=False)
    assert spent.reason == "ATTEMPTS_EXHAUSTED"
    late = retry.decide(attempt=1, now=NOW, deadline_at=NOW + datetime.timedelta(seconds=60), settings=SETTINGS,
                        back_off=False)
    assert late.reason == "DEADLINE_EXHAUSTED"


@pytest.mark.parametrize("attempt", [5, 6, 100])
def test_attempts_exhausted_when_max_attempts_were_made(attempt: int) -> None:
    decision = retry.decide(
        attempt=attempt, now=NOW, deadline_at=NOW + datetime.timedelta(days=1), settings=SETTINGS,
    )
    assert decision == retry.RetryDecision(retry=False, at=None, reason="ATTEMPTS_EXHAUSTED")


def test_last_attempt_still_allowed_below_max_attempts() -> None:
    decision = retry.decide(
        attempt=4, now=NOW, deadline_at=NOW + datetime.timedelta(days=1), settings=SETTINGS, rand=_rand(0.0),
    )
    assert decision.retry
    assert decision.reason == "RETRY"


def test_attempts_exhausted_wins_over_deadline_exhausted() -> None:
    decision = retry.decide(attempt=5, now=NOW, deadline_at=NOW, settings=SETTINGS)
    assert decision.reason == "ATTEMPTS_EXHAUSTED"


@pytest.mark.parametrize(
    ("deadline_in_s", "rand", "expected_reason"),
    [
        pytest.param(-1.0, 0.0, "DEADLINE_EXHAUSTED", id="deadline-passed"),
        pytest.param(119.0, 0.0, "DEADLINE_EXHAUSTED", id="no-room-for-a-whole-attempt"),
        pytest.param(120.0, 0.0, "RETRY", id="exactly-one-attempt-fits"),
        pytest.param(121.0, 0.5, "DEADLINE_EXHAUSTED", id="backoff-pushes-attempt-past-deadline"),
        pytest.param(122.0, 0.5, "RETRY", id="backoff-and-attempt-fit-exactly"),
    ],
)
def test_deadline_exhausted_when_the_next_attempt_cannot_finish_in_time(
        deadline_in_s: float, rand: float, expected_reason: str,
) -> None:
    # attempt 2: backoff ceiling is 4 s, so rand=0.5 waits 2 s.
    decision = retry.decide(
        attempt=2,
        now=NOW,
        deadline_at=NOW + datetime.timedelta(seconds=deadline_in_s),
        settings=SETTINGS,
        rand=_rand(rand),
    )
    assert decision.reason == expected_reason
    assert decision.retry is (expected_reason == "RETRY")
    assert (decision.at is None) is (expected_reason != "RETRY")


def test_retry_after_is_respected_even_beyond_the_backoff_cap() -> None:
    decision = retry.decide(
        attempt=1,
        now=NOW,
        deadline_at=NOW + datetime.timedelta(hours=2),
        settings=SETTINGS,
        retry_after_s=900.0,
        rand=_rand(0.99),
    )
    at = NOW + datetime.timedelta(seconds=900)
    assert decision == retry.RetryDecision(retry=True, at=at, reason="RETRY")


def test_backoff_longer_than_retry_after_wins() -> None:
    decision = retry.decide(
        attempt=9,
        now=NOW,
        deadline_at=NOW + datetime.timedelta(hours=2),
        settings=settings.AttemptSettings(max_attempts=10),
        retry_after_s=1.0,
        rand=_rand(0.5),
    )
    assert decision.at == NOW + datetime.timedelta(seconds=150)


@pytest.mark.parametrize("retry_after_s", [3600.0 - 120.0 + 0.001, 86_400.0, 1e300, math.inf])
def test_retry_after_beyond_the_deadline_exhausts_the_deadline(retry_after_s: float) -> None:
    decision = retry.decide(
        attempt=1,
        now=NOW,
        deadline_at=NOW + datetime.timedelta(hours=1),
        settings=SETTINGS,
        retry_after_s=retry_after_s,
        rand=_rand(0.0),
    )
    assert decision == retry.RetryDecision(retry=False, at=None, reason="DEADLINE_EXHAUSTED")


@pytest.mark.parametrize("retry_after_s", [-5.0, math.nan])
def test_nonsense_retry_after_falls_back_to_backoff(retry_after_s: float) -> None:
    decision = retry.decide(
        attempt=1,
        now=NOW,
        deadline_at=NOW + datetime.timedelta(hours=1),
        settings=SETTINGS,
        retry_after_s=retry_after_s,
        rand=_rand(0.5),
    )
    assert decision.at == NOW + datetime.timedelta(seconds=1)


def test_decide_rejects_naive_datetimes_and_attempt_zero() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        retry.decide(attempt=1, now=NOW.replace(tzinfo=None), deadline_at=NOW, settings=SETTINGS)
    with pytest.raises(ValueError, match="attempt"):
        retry.decide(attempt=0, now=NOW, deadline_at=NOW, settings=SETTINGS)


# ---------------------------------------------------------------------------------------------
# properties
# ---------------------------------------------------------------------------------------------

_aware_datetimes = st.datetimes(
    min_value=datetime.datetime(2000, 1, 1),
    max_value=datetime.datetime(2100, 1, 1),
    timezones=st.sampled_from([datetime.UTC, datetime.timezone(datetime.timedelta(hours=3))]),
)
_attempt_settings = st.builds(
    settings.AttemptSettings,
    timeout_s=st.floats(min_value=0.0, max_value=86_400.0),
    max_attempts=st.integers(min_value=1, max_value=50),
    backoff_base_s=st.floats(min_value=0.0, max_value=3_600.0),
    backoff_cap_s=st.floats(min_value=0.0, max_value=86_400.0),
)


@given(
    attempt=st.integers(min_value=1, max_value=60),
    now=_aware_datetimes,
    deadline_in_s=st.floats(min_value=-86_400.0, max_value=30 * 86_400.0),
    attempt_settings=_attempt_settings,
    retry_after_s=st.none() | st.floats(min_value=0.0, max_value=1e12) | st.just(math.inf),
    rand=st.floats(min_value=0.0, max_value=1.0, exclude_max=True),
)
def test_a_retry_is_never_early_and_never_past_the_deadline(
        attempt: int,
        now: datetime.datetime,
        deadline_in_s: float,
        attempt_settings: settings.AttemptSettings,
        retry_after_s: float | None,
        rand: float,
) -> None:
    deadline_at = now + datetime.timedelta(seconds=deadline_in_s)
    decision = retry.decide(
        attempt=attempt,
        now=now,
        deadline_at=deadline_at,
        settings=attempt_settings,
        retry_after_s=retry_after_s,
        rand=_rand(rand),
    )
    assert decision.reason in {"RETRY", "ATTEMPTS_EXHAUSTED", "DEADLINE_EXHAUSTED"}
    assert decision.retry is (decision.reason == "RETRY")
    if attempt >= attempt_settings.max_attempts:
        assert decision.reason == "ATTEMPTS_EXHAUSTED"
    if not decision.retry:
        assert decision.at is None
        return
    assert decision.at is not None
    assert decision.at.tzinfo is not None
    assert decision.at >= now
    assert decision.at + datetime.timedelta(seconds=attempt_settings.timeout_s) <= deadline_at
    if retry_after_s is not None:
        assert decision.at >= now + datetime.timedelta(seconds=retry_after_s)
    else:
        assert decision.at - now <= datetime.timedelta(seconds=attempt_settings.backoff_cap_s)
