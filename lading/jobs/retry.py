"""
The one retry policy: after a failed attempt, retry when, or give up why.

`RetryPolicy` is neutral: a number of attempts, a capped doubling backoff (`lading.looping`)
with or without jitter, and how long one attempt may take. Jobs get theirs from
`AttemptSettings` (`RetryPolicy.for_attempts`); deliveries from their endpoint's retry budget
and the dispatcher's settings. The executor (an attempt failed transiently), the job reaper (a
lease expired, so the attempt is presumed lost), the delivery dispatcher and the delivery reaper
all ask `RetryPolicy.decide()`; none decides retry vs. give up by itself, so work is treated the
same whichever way its attempt ended. This module is pure: it reads no
clock and no database. Callers pass `now`, and the transition that applies the decision
lives in `lading.jobs.transitions`.

The delay is exponential backoff with *full jitter* (AWS Architecture Blog, "Exponential
Backoff and Jitter"): a uniform draw from `[0, min(cap, base * 2 ** (attempt - 1)))`. Full
jitter spreads a burst of failures (a provider outage failing hundreds of attempts at once)
over the whole window instead of re-synchronising them into the next burst.

A provider's `Retry-After` is honoured: the next attempt never starts before it, even when
that is longer than the backoff cap. A retry is only scheduled when the whole next attempt
(`RetryPolicy.attempt_timeout_s`) still fits before the job's deadline; otherwise the job ends
now with DEADLINE_EXHAUSTED instead of being claimed again just to time out.

Backoff protects the other side while it fails. A failure that says nothing about the other
side's health, a model's answer that failed validation (the provider answered; the answer was
unusable), is retried without it (`back_off=False`): waiting would not change the next answer,
and would only leave the pool's capacity unused. The attempt budget and the deadline bound it
as any retry.

    RetryPolicy.decide(attempt, now, deadline_at)
      │
      ├── attempt >= max_attempts ──────────────────────────▶ ATTEMPTS_EXHAUSTED
      ├── at = now + max(backoff, Retry-After)    (backoff 0 when `back_off` is False)
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

from lading import looping
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
    return looping.full_jitter(attempt, base_s=base_s, cap_s=cap_s, rand=rand)


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """How often, and how far apart, a unit of work (a job, a delivery) is tried."""

    max_attempts: int
    """Attempts in all, the first included: after this many, give up (ATTEMPTS_EXHAUSTED)."""
    base_s: float
    """The backoff after the first failure is at most this; doubled per failed attempt."""
    cap_s: float
    """No backoff is longer than this (a Retry-After may be)."""
    attempt_timeout_s: float
    """How long one attempt may take: a retry is scheduled only when it can finish before the deadline."""
    jitter: looping.Jitter = "full"
    """`full`: a uniform draw below the backoff (a burst of failures is spread out); `none`: the backoff itself."""

    @classmethod
    def for_attempts(cls, settings: lading_settings.AttemptSettings) -> RetryPolicy:
        """A job's policy, from its attempt settings."""
        return cls(
            max_attempts=settings.max_attempts,
            base_s=settings.backoff_base_s,
            cap_s=settings.backoff_cap_s,
            attempt_timeout_s=settings.timeout_s,
        )

    def backoff_s(self, *, attempt: int, rand: Callable[[], float] = random.random) -> float:
        """The delay after attempt number `attempt` (>= 1) failed, before any Retry-After."""
        if attempt < 1:
            raise ValueError(f"attempt must be >= 1, got {attempt}")
        if self.jitter == "none":
            return looping.backoff_ceiling_s(attempt, base_s=self.base_s, cap_s=self.cap_s)
        return looping.full_jitter(attempt, base_s=self.base_s, cap_s=self.cap_s, rand=rand)

    def decide(
            self,
            *,
            attempt: int,
            now: datetime.datetime,
            deadline_at: datetime.datetime,
            retry_after_s: float | None = None,
            back_off: bool = True,
            rand: Callable[[], float] = random.random,
    ) -> RetryDecision:
        """
        Whether and when to try again after attempt number `attempt` (>= 1, attempts already
        made, the failed one included) failed.

        `retry_after_s` is the other side's minimum delay, if it gave one; a negative value counts
        as 0 and NaN as absent, so a confused provider or receiver cannot crash the caller.
        `back_off` False: the failure was not the other side's (see the module's docstring), so
        the retry is due now, unless a Retry-After asks for later.
        """
        if attempt < 1:
            raise ValueError(f"attempt must be >= 1, got {attempt}")
        if now.tzinfo is None or deadline_at.tzinfo is None:
            raise ValueError("now and deadline_at must be timezone-aware")
        if attempt >= self.max_attempts:
            return RetryDecision(retry=False, at=None, reason=ATTEMPTS_EXHAUSTED)

        delay_s = self.backoff_s(attempt=attempt, rand=rand) if back_off else 0.0
        if retry_after_s is not None and not math.isnan(retry_after_s):
            delay_s = max(delay_s, retry_after_s, 0.0)

        # Compare in float seconds first: an absurd delay (Retry-After of a year, or inf) must not
        # overflow datetime arithmetic. Then confirm on the datetimes actually stored, because
        # timedelta rounds to microseconds.
        room_s = (deadline_at - now).total_seconds() - self.attempt_timeout_s
        if not delay_s <= room_s:
            return RetryDecision(retry=False, at=None, reason=DEADLINE_EXHAUSTED)
        at = now + datetime.timedelta(seconds=delay_s)
        if at + datetime.timedelta(seconds=self.attempt_timeout_s) > deadline_at:
            return RetryDecision(retry=False, at=None, reason=DEADLINE_EXHAUSTED)
        return RetryDecision(retry=True, at=at, reason=RETRY)


def decide(
        *,
        attempt: int,
        now: datetime.datetime,
        deadline_at: datetime.datetime,
        settings: lading_settings.AttemptSettings,
        retry_after_s: float | None = None,
        back_off: bool = True,
        rand: Callable[[], float] = random.random,
) -> RetryDecision:
    """
    Whether and when to retry a job after its attempt number `attempt` failed: the job's
    `RetryPolicy` (from `settings`) decides (`RetryPolicy.decide`).
    """
    return RetryPolicy.for_attempts(settings).decide(
        attempt=attempt, now=now, deadline_at=deadline_at, retry_after_s=retry_after_s, back_off=back_off, rand=rand,
    )
