"""
The one retry policy: after a failed attempt, retry when, or give up why.

Both the executor (an attempt failed transiently) and the reaper (a lease expired, so the
attempt is presumed lost) ask `decide()`; neither decides retry vs. discard itself, so a
job is treated the same whichever way its attempt ended. This module is pure: it reads no
clock and no database. Callers pass `now`, and the transition that applies the decision
lives in `lading.jobs.transitions`.

The delay is exponential backoff with *full jitter* (AWS Architecture Blog, "Exponential
Backoff and Jitter"): a uniform draw from `[0, min(cap, base * 2 ** (attempt - 1)))`. Full
jitter spreads a burst of failures (a provider outage failing hundreds of attempts at once)
over the whole window instead of re-synchronising them into the next burst.

A provider's `Retry-After` is honoured: the next attempt never starts before it, even when
that is longer than the backoff cap. A retry is only scheduled when the whole next attempt
(`AttemptSettings.timeout_s`) still fits before the job's deadline; otherwise the job ends
now with DEADLINE_EXHAUSTED instead of being claimed again just to time out.

    decide(attempt, now, deadline_at)
      │
      ├── attempt >= max_attempts ──────────────────────────▶ ATTEMPTS_EXHAUSTED
      ├── at = now + max(backoff, Retry-After)
      ├── at + timeout_s > deadline_at ─────────────────────▶ DEADLINE_EXHAUSTED
      └── otherwise ────────────────────────────────────────▶ RETRY at `at`
"""

from __future__ import annotations

import dataclasses
import datetime
import email.utils
import math
import random
import re
from collections.abc import Callable
from typing import Final

from lading import settings as lading_settings

RETRY: Final = "RETRY"
"""Schedule another attempt at `RetryDecision.at`."""
ATTEMPTS_EXHAUSTED: Final = "ATTEMPTS_EXHAUSTED"
"""`AttemptSettings.max_attempts` attempts were made; the job fails terminally."""
DEADLINE_EXHAUSTED: Final = "DEADLINE_EXHAUSTED"
"""No further attempt can finish before the job's deadline; the job fails terminally."""

_DELAY_SECONDS = re.compile(r"[0-9]+", re.ASCII)


@dataclasses.dataclass(frozen=True)
class RetryDecision:
    retry: bool
    """Whether another attempt is scheduled."""
    at: datetime.datetime | None
    """When the next attempt may start (timezone-aware); None when not retrying."""
    reason: str
    """`RETRY`, `ATTEMPTS_EXHAUSTED` or `DEADLINE_EXHAUSTED`: stored as the job's error class."""


def parse_retry_after(value: str | None, *, now: datetime.datetime) -> float | None:
    """
    Seconds from `now` until the time a `Retry-After` header value (RFC 9110 §10.2.3) names.

    Accepts delay-seconds (a non-negative integer) and an HTTP-date: the IMF-fixdate and the
    obsolete RFC 850 and asctime forms. A date without a zone is read as GMT, as HTTP-dates
    always are. A date in the past gives 0.0. Malformed values (negative, fractional, garbage,
    empty) give None: the caller then falls back to plain backoff. Large values are returned
    as they are (a delay-seconds beyond float range as `math.inf`): the policy decides.
    """
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    if value is None:
        return None
    text = value.strip()
    if not text:
        return None
    if _DELAY_SECONDS.fullmatch(text):
        try:
            return float(int(text))
        except (OverflowError, ValueError):  # beyond float range, or beyond int's digit limit
            return math.inf
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (ValueError, TypeError, OverflowError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    return max(0.0, (when - now).total_seconds())


def backoff_s(
        *,
        attempt: int,
        base_s: float,
        cap_s: float,
        rand: Callable[[], float],
) -> float:
    """
    The full-jitter delay after attempt number `attempt` (>= 1) failed:
    `rand() * min(cap_s, base_s * 2 ** (attempt - 1))`, with `rand()` in [0, 1).
    """
    if attempt < 1:
        raise ValueError(f"attempt must be >= 1, got {attempt}")
    # 2.0 ** 1024 overflows; any exponent this large is far beyond every sane cap anyway.
    ceiling = min(cap_s, base_s * 2.0 ** min(attempt - 1, 1000))
    return rand() * ceiling


def decide(
        *,
        attempt: int,
        now: datetime.datetime,
        deadline_at: datetime.datetime,
        settings: lading_settings.AttemptSettings,
        retry_after_s: float | None = None,
        rand: Callable[[], float] = random.random,
) -> RetryDecision:
    """
    Whether and when to retry a job after its attempt number `attempt` (>= 1, attempts
    already made, the failed one included) failed.

    `retry_after_s` is the provider's minimum delay, if it gave one; a negative value counts
    as 0 and NaN as absent, so a confused provider cannot crash the executor or the reaper.
    """
    if attempt < 1:
        raise ValueError(f"attempt must be >= 1, got {attempt}")
    if now.tzinfo is None or deadline_at.tzinfo is None:
        raise ValueError("now and deadline_at must be timezone-aware")
    if attempt >= settings.max_attempts:
        return RetryDecision(retry=False, at=None, reason=ATTEMPTS_EXHAUSTED)

    delay_s = backoff_s(
        attempt=attempt, base_s=settings.backoff_base_s, cap_s=settings.backoff_cap_s, rand=rand,
    )
    if retry_after_s is not None and not math.isnan(retry_after_s):
        delay_s = max(delay_s, retry_after_s, 0.0)

    # Compare in float seconds first: an absurd delay (Retry-After of a year, or inf) must not
    # overflow datetime arithmetic. Then confirm on the datetimes actually stored, because
    # timedelta rounds to microseconds.
    room_s = (deadline_at - now).total_seconds() - settings.timeout_s
    if not delay_s <= room_s:
        return RetryDecision(retry=False, at=None, reason=DEADLINE_EXHAUSTED)
    at = now + datetime.timedelta(seconds=delay_s)
    if at + datetime.timedelta(seconds=settings.timeout_s) > deadline_at:
        return RetryDecision(retry=False, at=None, reason=DEADLINE_EXHAUSTED)
    return RetryDecision(retry=True, at=at, reason=RETRY)
