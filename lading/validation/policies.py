"""
Validation policies by name: the rule sets that decide SUCCEEDED vs. REVIEW_REQUIRED.

A pool's spec names its policy; `validate()` runs it over a provider's result and the
document's text and returns a `verdicts.Verdict`. Policies are versioned by name and never
change meaning once released: a stricter rule set is a new name (`invoice-strict-v2`), so
a verdict stored a year ago still says what it was judged by.

    invoice-strict-v1
      schema                  invoice.v1 or stop (one `schema` failure, nothing else runs)
      line_amount             every lines[i].amount = quantity * unit_price
      lines_sum_subtotal      sum of line amounts = subtotal
      total_sum               subtotal + tax_total = total          (each ± checks.TOLERANCE)
      currency_allowed        currency in checks.ALLOWED_CURRENCIES
      date_plausible          issue/due date years in [2000, 2100]
      due_after_issue         due_date >= issue_date
      iban_checksum           supplier.iban: ISO 13616 length and mod-97
      vat_id_format           supplier/buyer vat_id by country prefix
      evidence_missing        amounts, supplier.iban, invoice_number must be quoted
      evidence_not_in_source  every quote occurs in the source text
      evidence_mismatch       the quote contains the value

    invoice-strict-v2         every v1 check (each failure with its quote and line), then
                              every booked field grounded in the document in its role:
                              currency, parties, dates, tax rates, identifiers
                              (lading.validation.strict_v2; docs/validation.md)

The checks themselves are in `lading.validation.checks`; what to do with a verdict is the
executor's business.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Mapping
from typing import Any, Final

from lading import errors
from lading.validation import checks, strict_v2, verdicts

STRICT_V1: Final = "invoice-strict-v1"
STRICT_V2: Final = strict_v2.NAME
DEFAULT_POLICY: Final = STRICT_V2
"""The policy of new batches that name none (`lading.models.specs.VALIDATION_POLICY_DEFAULT`).
A batch stores its policy's name, so changing this default never re-judges an existing batch."""

_Policy = Callable[[Any, str, "str | None"], list[verdicts.FailedCheck]]


def validate(
        result: dict[str, Any],
        *,
        source_text: str,
        policy: str,
        default_currency: str | None = None,
) -> verdicts.Verdict:
    """
    Judge `result` (a provider's output) against the document's `source_text` by `policy`.
    `default_currency`: the ISO code the pool names (`spec.defaultCurrency`) for documents that show no
    currency (`invoice-strict-v2` only; v1 never looks at it). Never raises for a bad result,
    however malformed: that is what the verdict is for. Raises `errors.UnknownPolicy` if no
    policy has that name.
    """
    run = _POLICIES.get(policy)
    if run is None:
        raise errors.UnknownPolicy(policy=policy, known=known_policies())
    return verdicts.Verdict.of(policy=policy, failed=tuple(run(result, source_text, default_currency)))


def known_policies() -> frozenset[str]:
    """Names `validate()` accepts; the operator rejects a pool spec naming any other."""
    return frozenset(_POLICIES)


def _invoice_strict_v1(result: Any, source_text: str, _default_currency: str | None) -> list[verdicts.FailedCheck]:
    inv, failures = checks.schema(result)
    if inv is None:
        return failures
    return [
        *checks.line_amounts(inv),
        *checks.lines_sum_subtotal(inv),
        *checks.total_sum(inv),
        *checks.currency_allowed(inv),
        *checks.dates(inv),
        *checks.iban(inv),
        *checks.vat_ids(inv),
        *checks.evidence(inv, source_text=source_text),
    ]


def _invoice_strict_v2(result: Any, source_text: str, default_currency: str | None) -> list[verdicts.FailedCheck]:
    return strict_v2.run(result, source_text, default_currency=default_currency)


_POLICIES: Final[Mapping[str, _Policy]] = types.MappingProxyType({
    STRICT_V1: _invoice_strict_v1,
    STRICT_V2: _invoice_strict_v2,
})
