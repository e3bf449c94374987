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
    cut off without finishing (worker died, lease lost)     the reservation the worker noted before
                                                            sending (priced by the reaper, in SQL)

The cost lands on the attempt row, the job's sum, the batch's sum and the tenant's spend of the day
in the same statement that records the attempt (`job_finish_many`), stale attempts included: their
calls were paid for. An attempt of an unpriced pool has no cost (NULL), not a cost of zero; a reused
one costs 0. A vLLM pool priced by the GPU hour (`gpu_hour_price`) prices its attempts after the
fact: each 60 s interval's GPU time (`interval_cost`) is split among the attempts that finished in
it by their tokens (`split_interval`), by the elected allocator (`lading.db.gpu_time`).

What this module does not own: the sums (SQL, lading/db), the budgets' gate (the claim plan,
migration 0018), the metric names (`lading.metrics`).
"""

from __future__ import annotations

import dataclasses
import decimal
import re
from collections.abc import Mapping, Sequence

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
    """A pool's prices in `currency`: per million input (prompt) and output (completion) tokens, or
    (a vLLM pool) `gpu_hour_price` per GPU hour, whose attempts are priced when their interval
    closes (`split_interval`) instead of when they finish."""

    currency: str
    input_per_million: decimal.Decimal | None
    output_per_million: decimal.Decimal | None
    gpu_hour_price: decimal.Decimal | None = None

    @property
    def by_gpu_time(self) -> bool:
        return self.gpu_hour_price is not None

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
        if raw.get("gpuHourPrice") is not None:
            if raw.get("inputPerMillionTokens") is not None or raw.get("outputPerMillionTokens") is not None:
                raise InvalidAmount("spec.pricing.gpuHourPrice: excludes the per-token prices")
            return cls(
                currency=currency, input_per_million=None, output_per_million=None,
                gpu_hour_price=parse_amount(raw.get("gpuHourPrice"), field="spec.pricing.gpuHourPrice"),
            )  # fmt: skip
        return cls(
            currency=currency,
            input_per_million=parse_amount(raw.get("inputPerMillionTokens"),
                                           field="spec.pricing.inputPerMillionTokens"),
            output_per_million=parse_amount(raw.get("outputPerMillionTokens"),
                                            field="spec.pricing.outputPerMillionTokens"),
        )  # fmt: skip

    def cost(self, *, tokens_in: int, tokens_out: int) -> decimal.Decimal | None:
        """The exact price of `tokens_in` prompt and `tokens_out` completion tokens; None for a pool
        priced by GPU time, whose attempts' cost is known only when their interval closes."""
        if tokens_in < 0 or tokens_out < 0:
            raise ValueError(f"token counts must not be negative, got {tokens_in} and {tokens_out}")
        if self.input_per_million is None or self.output_per_million is None:
            return None
        total = _CONTEXT.add(
            _CONTEXT.multiply(decimal.Decimal(tokens_in), self.input_per_million),
            _CONTEXT.multiply(decimal.Decimal(tokens_out), self.output_per_million),
        )
        return _CONTEXT.divide(total, decimal.Decimal(TOKENS_PER_PRICE_UNIT))


INTERVAL_S = 60
"""A GPU-priced pool's GPU time is priced and allocated per interval of this many seconds, aligned
to the minute (UTC)."""

GPU_COST_QUANTUM = decimal.Decimal("0.000000001")
"""An interval's cost is rounded (half to even) to 10⁻⁹ of the currency, the scale of the prices;
allocated shares are whole multiples of it and sum to the interval's cost exactly."""


def interval_cost(*, gpu_seconds: decimal.Decimal, gpu_hour_price: decimal.Decimal) -> decimal.Decimal:
    """What `gpu_seconds` GPU-seconds cost at `gpu_hour_price` per GPU hour, rounded half to even to
    `GPU_COST_QUANTUM` (the only rounding of money in Lading: a price per hour over seconds is not
    a terminating decimal in general)."""
    if gpu_seconds < 0:
        raise ValueError(f"GPU time must not be negative, got {gpu_seconds}")
    exact = decimal.Context(prec=80, rounding=decimal.ROUND_HALF_EVEN).divide(
        _CONTEXT.multiply(gpu_seconds, gpu_hour_price), decimal.Decimal(3600)
    )
    return exact.quantize(GPU_COST_QUANTUM, rounding=decimal.ROUND_HALF_EVEN, context=decimal.Context(prec=80))


def split_interval(cost: decimal.Decimal, weights: Sequence[int]) -> list[decimal.Decimal]:
    """`cost` (a multiple of `GPU_COST_QUANTUM`) split in proportion to `weights` (tokens), in whole
    quanta, summing to `cost` exactly. The largest-remainder rule: each share is first rounded down
    to a quantum; the quanta left over (fewer than there are shares) go one each to the shares with
    the largest remainders, ties to the earlier position (callers order attempts by job id and
    fence). All weights 0 (or none): every share 0, the interval is idle."""
    if any(w < 0 for w in weights):
        raise ValueError("weights must not be negative")
    total = sum(weights)
    if total == 0:
        return [decimal.Decimal(0) for _ in weights]
    units = int(_CONTEXT.divide(cost, GPU_COST_QUANTUM))
    if _CONTEXT.multiply(decimal.Decimal(units), GPU_COST_QUANTUM) != cost:
        raise ValueError(f"{cost} is not a whole number of {GPU_COST_QUANTUM}")
    floors = [units * w // total for w in weights]
    remainders = [units * w % total for w in weights]
    left = units - sum(floors)
    for i in sorted(range(len(weights)), key=lambda i: (-remainders[i], i))[:left]:
        floors[i] += 1
    return [_CONTEXT.multiply(decimal.Decimal(u), GPU_COST_QUANTUM) for u in floors]


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
    count_cost(tenant=tenant, pool=pool, currency=pricing.currency, amount=amount)


def count_cost(*, tenant: str, pool: str, currency: str, amount: decimal.Decimal) -> None:
    """Add `amount` to `lading_cost_total`: the worker for each attempt it prices, the GPU-time
    allocator for each tenant's share of an interval it closes."""
    if amount:
        metrics.COST.labels(tenant, pool, currency).inc(float(amount))


def count_saved(*, tenant: str, pool: str, currency: str, amount: decimal.Decimal) -> None:
    """Add what a reused result avoided paying (the cost of the job it was taken from, in that job's
    currency) to `lading_cost_saved_total`. The reused job itself records cost 0. For result reuse:
    call it once per job that took an earlier result instead of calling the model."""
    if amount:
        metrics.COST_SAVED.labels(tenant, pool, currency).inc(float(amount))
