"""
The job state machine: the one place that says which state changes are legal.

    READY ──claim──▶ RUNNING ──complete──▶ SUCCEEDED
      │                │  ├──doubtful────▶ REVIEW_REQUIRED ──approve──▶ SUCCEEDED
      │                │  ├──fail───────▶ FAILED_TERMINAL ◀──reject───┘
      │                │  └──retry/reap──▶ RETRY_SCHEDULED ──claim──▶ RUNNING
      │                │
      └── expire ──────┴──────────────────▶ FAILED_TERMINAL   (deadline passed while waiting)
    any non-terminal state ──cancel──▶ CANCELLED

Every SQL statement that changes `extraction_jobs.state` (lading/db/sql/jobs.sql) writes its
allowed source states into its guard by hand; they are not generated from this table. What
keeps the two in step is `tests/integration/test_job_transitions.py`: it tries every statement
from every source state and checks the legal ones against `LEGAL` (and `sources_of()`, which
states the same table as SQL text values).
"""

from __future__ import annotations

import enum


class JobState(enum.StrEnum):
    READY = "READY"                      #: accepted, waiting; the claimer moves it to RUNNING
    RUNNING = "RUNNING"                  #: owned by one worker under a lease and a fence;
                                         #: the executor finishes it, the reaper rescues it
    RETRY_SCHEDULED = "RETRY_SCHEDULED"  #: failed transiently; the claimer takes it once available_at is due
    REVIEW_REQUIRED = "REVIEW_REQUIRED"  #: extracted but doubtful; a reviewer approves or rejects it
    SUCCEEDED = "SUCCEEDED"              #: final; a validated result exists
    FAILED_TERMINAL = "FAILED_TERMINAL"  #: final; attempts or deadline exhausted, a permanent error, or
                                         #: an outcome the database refused to store (UNSTORABLE)
    CANCELLED = "CANCELLED"              #: final; its batch was deleted or cancelled


TERMINAL: frozenset[JobState] = frozenset({JobState.SUCCEEDED, JobState.FAILED_TERMINAL, JobState.CANCELLED})
"""No transition leaves these states."""

SETTLED: frozenset[JobState] = TERMINAL | {JobState.REVIEW_REQUIRED}
"""States where no machine will move the job again: a batch whose jobs are all settled is done."""

CLAIMABLE: frozenset[JobState] = frozenset({JobState.READY, JobState.RETRY_SCHEDULED})
"""States the claimer picks jobs from."""

LEGAL: frozenset[tuple[JobState, JobState]] = frozenset(
    {
        (JobState.READY, JobState.RUNNING),
        (JobState.RETRY_SCHEDULED, JobState.RUNNING),
        (JobState.RUNNING, JobState.SUCCEEDED),
        (JobState.RUNNING, JobState.REVIEW_REQUIRED),
        (JobState.RUNNING, JobState.RETRY_SCHEDULED),
        (JobState.RUNNING, JobState.FAILED_TERMINAL),
        (JobState.READY, JobState.FAILED_TERMINAL),
        (JobState.RETRY_SCHEDULED, JobState.FAILED_TERMINAL),
        (JobState.REVIEW_REQUIRED, JobState.SUCCEEDED),
        (JobState.REVIEW_REQUIRED, JobState.FAILED_TERMINAL),
    }
    | {(state, JobState.CANCELLED) for state in JobState if state not in TERMINAL}
)
"""Every legal (from, to) pair; anything else is an IllegalTransition."""


def is_legal(source: JobState, target: JobState) -> bool:
    return (source, target) in LEGAL


def sources_of(target: JobState) -> list[str]:
    """The states a job may be in for a move to `target`, as SQL text values."""
    return sorted(source.value for source, to in LEGAL if to is target)
