"""
What a model call costs, in exact decimals, never floats (docs/cost.md).

An InferencePool's `spec.pricing` gives the price of a million prompt (input) and a million
completion (output) tokens in one ISO 4217 currency, as decimal strings. The worker prices every
attempt it finishes with its pool's prices and the tokens the attempt is billed for:

    what the attempt did                                   billed tokens
    ─────────────────────────────────────────────────────  ──────────────────────────────────────
    an answer that reports usage (any outcome)              the reported prompt and completion
    an answer without usage (OK, invalid output)            the reservation (prompt estimate and
    a timeout after the request was sent                    max_tokens): it may have been billed,
      (timeout-ambiguous)                                   and never less than the limiter counts
    nothing sent, or refused before any work (429, 5xx,     what it reported, else nothing
      connection, a document that could not be fetched)

The cost lands on the attempt row, the job's sum and the tenant's spend of the day in the same
statement that records the attempt (`job_finish_many`), stale attempts included: their calls
were paid for. An attempt of an unpriced pool has no cost (NULL), not a cost of zero.

What this module does not own: the sums (SQL, lading/db), the budgets' gate (the claim plan,
migration 0018), the metric names (`lading.metrics`).
"""

from __future__ import annotations

import dataclasses
import decimal
import re
from collections.abc import Mapping

from lading import metrics

DECIMAL_PATTERN = r"^(0|[1-9][0-9]{0,11})(\.[0-9]{1,9})?$"
"""A price or budget amount as written in a spec: a decimal string with at most 12 integer digits
and 9 decimal places (`"0.15"`, `"500.00"`), no sign, exponent or spaces. Bounded so that every
product of a price and a token count is exact in `_CONTEXT` and storable in `numeric`."""

CURRENCY_PATTERN = r"^[A-Z]{3}$"
"""An ISO 4217 alphabetic code, upper case (`USD`, `EUR`)."""

TOKENS_PER_PRICE_UNIT = 1_000_000
"""Prices are per million tokens, as every hosted API publishes them."""

_CONTEXT = decimal.Context(prec=60, traps=[decimal.Inexact, decimal.InvalidOperation, decimal.Overflow])
"""Wide enough that a 21-digit price times a 19-digit token count is exact; inexactness would be a
bug and raises instead of rounding money."""


class InvalidAmount(ValueError):
    """A price or budget amount that is not a decimal string of the accepted form; the message names
    the field and what was wrong, never a float's rounded value."""


def parse_amount(value: object, *, field: str) -> decimal.Decimal:
    """`value` (a decimal string as `DECIMAL_PATTERN` allows) as an exact Decimal; InvalidAmount
    naming `field` otherwise. A YAML or JSON number is refused: `0.1` as a float is not 0.1."""
    if not isinstance(value, str):
        raise InvalidAmount(
            f"{field}: must be a decimal string such as \"0.15\" (quoted, so it stays exact), "
            f"not a {type(value).__name__}"
        )
    if re.fullmatch(DECIMAL_PATTERN, value) is None:
        raise InvalidAmount(
            f"{field}: {value[:40]!r} is not a decimal amount: digits with an optional '.' and at most 9 "
            "decimal places, at most 12 digits before it, no sign, exponent or spaces"
        )
    return decimal.Decimal(value)


@dataclasses.dataclass(frozen=True)
class Pricing:
    """A pool's prices: `currency` per million input (prompt) and output (completion) tokens."""

    currency: str
    input_per_million: decimal.Decimal
    output_per_million: decimal.Decimal

    @classmethod
    def from_stored(cls, spec: Mapping[str, object]) -> Pricing | None:
        """The `pricing` of an InferencePool spec as stored in `pools.spec` (camelCase JSON written by
        `lading.applying`); None for an unpriced pool. A stored value the spec model would refuse (a
        row written by hand) raises InvalidAmount naming it: pricing by a guess would bill wrongly."""
        raw = spec.get("pricing")
        if raw is None:
            return None
        if not isinstance(raw, Mapping):
            raise InvalidAmount(f"spec.pricing: must be an object, not {type(raw).__name__}")
        currency = raw.get("currency")
        if not isinstance(currency, str) or re.fullmatch(CURRENCY_PATTERN, currency) is None:
            raise InvalidAmount(f"spec.pricing.currency: {currency!r} is not an ISO 4217 code")
        return cls(
            currency=currency,
            input_per_million=parse_amount(raw.get("inputPerMillionTokens"),
                                           field="spec.pricing.inputPerMillionTokens"),
            output_per_million=parse_amount(raw.get("outputPerMillionTokens"),
                                            field="spec.pricing.outputPerMillionTokens"),
        )  # fmt: skip

    def cost(self, *, tokens_in: int, tokens_out: int) -> decimal.Decimal:
        """The exact price of `tokens_in` prompt and `tokens_out` completion tokens."""
        if tokens_in < 0 or tokens_out < 0:
            raise ValueError(f"token counts must not be negative, got {tokens_in} and {tokens_out}")
        total = _CONTEXT.add(
            _CONTEXT.multiply(decimal.Decimal(tokens_in), self.input_per_million),
            _CONTEXT.multiply(decimal.Decimal(tokens_out), self.output_per_million),
        )
        return _CONTEXT.divide(total, decimal.Decimal(TOKENS_PER_PRICE_UNIT))


@dataclasses.dataclass(frozen=True)
class Billed:
    """The tokens an attempt is billed for (see the module's table)."""

    tokens_in: int
    tokens_out: int


NOTHING = Billed(0, 0)


def billed(
        *,
        answered: bool,
        sent_and_lost: bool,
        tokens_in: int | None,
        tokens_out: int | None,
        reserved_in: int,
        reserved_out: int,
) -> Billed:
    """What an attempt is billed for. `answered`: the model produced an answer (OK or invalid
    output); `sent_and_lost`: the request was sent and no answer came (timeout-ambiguous). Reported
    usage wins when there is any; an answer or a lost request without usage is billed its
    reservation; anything else (nothing sent, refused before work) nothing."""
    if tokens_in is not None or tokens_out is not None:
        return Billed(tokens_in or 0, tokens_out or 0)
    if answered or sent_and_lost:
        return Billed(reserved_in, reserved_out)
    return NOTHING


def count_spent(*, tenant: str, pool: str, pricing: Pricing, amount: decimal.Decimal) -> None:
    """Add an attempt's cost to `lading_cost_total` (a float for Prometheus; the database keeps the
    exact sums)."""
    if amount:
        metrics.COST.labels(tenant, pool, pricing.currency).inc(float(amount))


def count_saved(*, tenant: str, pool: str, currency: str, amount: decimal.Decimal) -> None:
    """Add what a reused result avoided paying (the cost of the job it was taken from, in that job's
    currency) to `lading_cost_saved_total`. The reused job itself records cost 0. For result reuse:
    call it once per job that took an earlier result instead of calling the model."""
    if amount:
        metrics.COST_SAVED.labels(tenant, pool, currency).inc(float(amount))
