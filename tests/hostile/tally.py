"""
What the hostile-input suite tried, by kind, for the run's terminal summary (conftest.py):

    hostile inputs tried: model-output 61, manifest-line 40, batch-spec 52, ...
    wedged pipelines 0

`tried` is counted as inputs are sent; `wedged` when a liveness check fails (a loop stopped, a
job stayed RUNNING, a message was neither acked nor dead-lettered, a 5xx with the database up),
just before the test fails on it, so the summary says which pipeline stopped.
"""

from __future__ import annotations

import collections

TRIED: collections.Counter[str] = collections.Counter()
WEDGED: collections.Counter[str] = collections.Counter()
ENDED: collections.Counter[tuple[str, str]] = collections.Counter()
"""How inputs ended, by kind (admitted, refused with which reason, ...): shows the suite reaches
both sides of each invariant, not only the refusals."""


def tried(kind: str, count: int = 1) -> None:
    TRIED[kind] += count


def ended(kind: str, how: str) -> None:
    ENDED[(kind, how)] += 1


def wedged(pipeline: str) -> None:
    WEDGED[pipeline] += 1


def check(pipeline: str, ok: bool, message: str) -> None:
    """Assert a liveness invariant of `pipeline`, counting it as wedged when it fails."""
    if not ok:
        wedged(pipeline)
    assert ok, f"{pipeline}: {message}"


def summary() -> list[str]:
    tried_text = ", ".join(f"{kind} {count}" for kind, count in sorted(TRIED.items()))
    wedged_text = ", ".join(f"{kind} {count}" for kind, count in sorted(WEDGED.items()))
    endings = [
        f"  {kind}: " + ", ".join(f"{how} {n}" for (k, how), n in sorted(ENDED.items()) if k == kind)
        for kind in sorted({k for k, _ in ENDED})
    ]
    return [
        f"hostile inputs tried: {tried_text or 'none'}",
        *endings,
        f"wedged pipelines {sum(WEDGED.values())}" + (f" ({wedged_text})" if wedged_text else ""),
    ]
