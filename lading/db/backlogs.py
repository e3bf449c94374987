"""
What the repositories' reports share: a backlog (a queue's size and its oldest item's age) and
ages read from the database, never negative.
"""

from __future__ import annotations

import dataclasses
import datetime as dt


@dataclasses.dataclass(frozen=True)
class Backlog:
    """A queue that people or the relay drain: its size and how long its oldest item has waited."""

    size: int
    oldest_at: dt.datetime | None
    oldest_age_s: float | None


def age(seconds: float | None) -> float | None:
    """An age from the database, never negative: a row committed just after our snapshot began is "now"."""
    return None if seconds is None else max(seconds, 0.0)
