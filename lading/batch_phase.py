"""
A batch's phase from its job counts: the one rule the ExtractionBatch custom resource's status
(the operator) and the HTTP intake's batch status both apply.

    Completed   every job settled, some succeeded or await review (or the batch has none)
    Failed      every job settled, none succeeded
    Suspended   suspended, with work left
    Running     work left

With it, the reasons of the conditions that follow from the phase (Progressing, Complete, Failed),
and the CamelCase reason a job's error class becomes in a batch's recent failures.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from lading.jobs.states import SETTLED, JobState


@dataclasses.dataclass(frozen=True)
class BatchPhase:
    phase: str
    """Completed, Failed, Suspended or Running."""
    settled: bool
    """Every job is in a settled state (terminal, or awaiting review)."""
    good: int
    """Jobs that succeeded or await review: the results a batch delivers."""
    progressing_reason: str
    """Settled, Suspended or JobsRemaining."""
    complete_reason: str
    """Completed or Failed once settled, JobsRemaining before."""

    @property
    def failed(self) -> bool:
        return self.phase == "Failed"


def phase_of(counts: Mapping[JobState, int], *, total: int, suspended: bool) -> BatchPhase:
    """The phase of a batch of `total` jobs with `counts` jobs per state (missing states: none)."""
    settled = sum(n for state, n in counts.items() if state in SETTLED) >= total
    good = counts.get(JobState.SUCCEEDED, 0) + counts.get(JobState.REVIEW_REQUIRED, 0)
    if settled:
        phase = "Completed" if good > 0 or total == 0 else "Failed"
    elif suspended:
        phase = "Suspended"
    else:
        phase = "Running"
    progressing = "Settled" if settled else ("Suspended" if suspended else "JobsRemaining")
    complete = ("Failed" if phase == "Failed" else "Completed") if settled else "JobsRemaining"
    return BatchPhase(phase=phase, settled=settled, good=good, progressing_reason=progressing,
                      complete_reason=complete)


def failure_reason(error_class: str) -> str:
    """An error class (DEADLINE_EXCEEDED, InvalidOutput) as a CamelCase condition reason."""
    parts = [p for p in error_class.replace("-", "_").split("_") if p]
    text = "".join(p if not p.isupper() else p.capitalize() for p in parts) or "Failed"
    cleaned = "".join(ch for ch in text if ch.isalnum())[:64]
    return cleaned if cleaned and cleaned[0].isalpha() else "Failed"
