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
    quote: str | None = None
    """The quote the judged value was read from (the model's evidence, or where the policy found
    the value), cut to QUOTE_MAX characters; None where there is none. Set by `invoice-strict-v2`."""
    line: int | None = None
    """1-based line of the source text the quote is on; None when it is not in the document."""

    def to_json(self) -> dict[str, Any]:
        shown: dict[str, Any] = {"check": self.check, "field": self.field, "message": self.message}
        if self.quote is not None:
            shown["quote"] = self.quote
        if self.line is not None:
            shown["line"] = self.line
        return shown

    @classmethod
    def from_json(cls, stored: dict[str, Any]) -> FailedCheck:
        """A failed check as `to_json()` stored it; tolerant of what older verdicts lack."""
        field, quote, line = stored.get("field"), stored.get("quote"), stored.get("line")
        return cls(
            check=str(stored.get("check", "?")),
            field=None if field is None else str(field),
            message=str(stored.get("message", "")),
            quote=None if quote is None else str(quote),
            line=line if isinstance(line, int) and not isinstance(line, bool) else None,
        )


QUOTE_MAX = 120
"""Longest quote a failed check carries: enough to recognise the line, not a copy of the document."""


def shortened_quote(quote: str) -> str:
    """`quote` with whitespace runs collapsed, cut to QUOTE_MAX characters (an ellipsis marks a cut)."""
    normal = " ".join(quote.split())
    return normal if len(normal) <= QUOTE_MAX else normal[:QUOTE_MAX - 1] + "\u2026"


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
