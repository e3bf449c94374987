"""
What a validation policy says about one extracted result: passed, or which checks failed.

A verdict only reports; it never changes the result (a failed check does not null a field)
and it never decides the job's state. The executor maps `passed` to SUCCEEDED and a failed
verdict to REVIEW_REQUIRED, and stores `to_json()` next to the result so a reviewer sees why.
The checks themselves live in `lading.validation.checks`, the policies in `.policies`.
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class FailedCheck:
    check: str
    """Stable id of the rule, e.g. `line_amount`, `iban_checksum`, `evidence_not_in_source`.
    Dashboards and reviewers' filters key on it: never rename one, add a new id instead."""
    field: str | None
    """Path of the offending field (`lines[2].amount`, `supplier.iban`); None if no one field is at fault."""
    message: str
    """Human-readable detail. Never quotes long source text: the document may be confidential."""

    def to_json(self) -> dict[str, Any]:
        return {"check": self.check, "field": self.field, "message": self.message}


@dataclasses.dataclass(frozen=True)
class Verdict:
    policy: str
    """The policy that produced this verdict, e.g. `invoice-strict-v1`."""
    passed: bool
    """True only if no check failed."""
    failed: tuple[FailedCheck, ...]
    """Every failed check, in the order the policy ran them; empty when `passed`."""

    @classmethod
    def of(cls, *, policy: str, failed: tuple[FailedCheck, ...]) -> Verdict:
        """The verdict for `failed` checks: passed exactly when there are none."""
        return cls(policy=policy, passed=not failed, failed=failed)

    def to_json(self) -> dict[str, Any]:
        """The JSON document stored with the job's result and shown to reviewers."""
        return {
            "policy": self.policy,
            "passed": self.passed,
            "failed_checks": [failure.to_json() for failure in self.failed],
        }
