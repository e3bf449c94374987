"""
The figures table: one row per scenario, must-be-zero figures first, then what the faults cost.

Printed by hack/reliability.py and pasted into docs/reliability.md by `--write-docs`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hack.reliability import checker

SHORT_NAMES = {
    "lost": "lost", "duplicate_jobs": "dup jobs", "unexpected": "unexp", "undelivered": "undeliv",
    "lost_effects": "lost eff", "duplicate_effects": "dup eff", "stale_overwrites_applied": "stale applied",
    "retry_after_violations": "RA viol", "attempts_after_deadline": "after deadline",
    "limiter_overshoot_requests": "over req", "limiter_overshoot_tokens": "over tok",
    "limiter_overshoot_concurrency": "over conc", "limiter_refusals": "model 429s own",
    "model_log_missed": "log missed",
    "events_unpublished": "ev unpub", "events_never_delivered": "ev undeliv",
    "status_regressions": "regress", "recovery_over_bound": "recov > bound", "outcome_violations": "outcome",
}  # fmt: skip
REPORTED_COLUMNS = ("documents", "succeeded", "cancelled", "deadlines_passed", "info", "delivery_retries",
                    "stale_rejections", "reclaims", "kills", "faults", "recovery_max_s", "recovery_bound_s",
                    "reclaim_max_s", "throughput_jobs_s", "duration_s")  # fmt: skip


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:g}" if isinstance(value, float) else str(value)


def table(rows: Sequence[Mapping[str, Any]]) -> str:
    """Markdown: scenario, seed, then every must-be-zero figure, then the reported ones."""
    head = ["scenario", "seed", *(SHORT_NAMES[n] for n in checker.MUST_BE_ZERO), *REPORTED_COLUMNS]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        figures = row["figures"]
        cells = [row["scenario"], str(row["seed"]), *(_cell(figures.get(n)) for n in checker.MUST_BE_ZERO),
                 *(_cell(figures.get(n)) for n in REPORTED_COLUMNS)]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summary(rows: Sequence[Mapping[str, Any]]) -> str:
    failed = [r for r in rows if checker.violations(r["figures"])]
    lines = [f"{len(rows) - len(failed)} passed, {len(failed)} failed"]
    for row in failed:
        lines.append(f"  {row['scenario']} (seed {row['seed']}): {checker.violations(row['figures'])}")
    return "\n".join(lines)
