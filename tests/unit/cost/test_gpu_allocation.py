"""Pricing by the GPU hour (lading.costing, lading.db.gpu_time): the spec's combinations, an interval's
cost, its exact split among attempts, and the GPU time of the replica samples."""

from __future__ import annotations

import datetime as dt
import decimal
import random

import pydantic
import pytest

from lading import costing
from lading.db import gpu_time
from lading.models import specs

D = decimal.Decimal


def test_a_vllm_pool_may_be_priced_by_the_gpu_hour_and_its_attempts_then_cost_pending() -> None:
    spec = specs.InferencePoolSpec.model_validate(
        {"provider": "vllm", "model": "m", "pricing": {"currency": "EUR", "gpuHourPrice": "2.50"}}
    )
    stored = spec.model_dump(mode="json", by_alias=True)
    pricing = costing.Pricing.from_stored(stored)
    assert pricing == costing.Pricing(currency="EUR", input_per_million=None, output_per_million=None,
                                      gpu_hour_price=D("2.50"))  # fmt: skip
    assert pricing.by_gpu_time and pricing.cost(tokens_in=10, tokens_out=5) is None


@pytest.mark.parametrize(
    ("spec", "loc", "says"),
    [
        ({"provider": "vllm", "model": "m",
          "pricing": {"currency": "EUR", "gpuHourPrice": "2", "inputPerMillionTokens": "1"}},
         ("pricing", "inputPerMillionTokens"), "gpuHourPrice prices the pool by GPU time"),
        ({"provider": "vllm", "model": "m",
          "pricing": {"currency": "EUR", "gpuHourPrice": "2", "outputPerMillionTokens": "1"}},
         ("pricing", "outputPerMillionTokens"), "give one or the other"),
        ({"provider": "builtin", "pricing": {"currency": "EUR", "gpuHourPrice": "2"}},
         ("pricing",), "gpuHourPrice is only for provider vllm"),
        ({"provider": "openai-compatible", "model": "m", "endpoint": {"url": "https://api.example.com/v1"},
          "pricing": {"currency": "EUR", "gpuHourPrice": "2"}},
         ("pricing",), "gpuHourPrice is only for provider vllm"),
        ({"provider": "vllm", "model": "m", "pricing": {"currency": "EUR"}},
         ("pricing", "inputPerMillionTokens"), "inputPerMillionTokens is required"),
        ({"provider": "vllm", "model": "m", "pricing": {"currency": "EUR", "gpuHourPrice": 2.5}},
         ("pricing", "gpuHourPrice"), "must be a decimal string"),
    ],
)  # fmt: skip
def test_refused_combinations_name_the_field(spec: dict[str, object], loc: tuple[str, ...], says: str) -> None:
    with pytest.raises(pydantic.ValidationError) as refused:
        specs.InferencePoolSpec.model_validate(spec)
    errors = refused.value.errors()
    assert errors[0]["loc"] == loc and says in errors[0]["msg"], errors


def test_an_interval_costs_its_gpu_time_at_the_hourly_price_rounded_half_even_to_1e_9() -> None:
    assert costing.interval_cost(gpu_seconds=D(3600), gpu_hour_price=D("2.5")) == D("2.5")
    assert costing.interval_cost(gpu_seconds=D(120), gpu_hour_price=D("2.5")) == D("0.083333333")
    assert costing.interval_cost(gpu_seconds=D(200), gpu_hour_price=D("2.5")) == D("0.138888889")
    # 0.0000000005 exactly: half to even rounds to 0.000000000, 0.0000000015 to 0.000000002.
    assert costing.interval_cost(gpu_seconds=D("0.0018"), gpu_hour_price=D("0.001")) == D(0)
    assert costing.interval_cost(gpu_seconds=D("0.0054"), gpu_hour_price=D("0.001")) == D("0.000000002")
    assert costing.interval_cost(gpu_seconds=D(0), gpu_hour_price=D("9")) == 0


def test_the_split_is_exact_and_the_units_left_over_go_to_the_largest_remainders_ties_first() -> None:
    assert costing.split_interval(D("0.000000010"), [1, 1, 1]) == [D("0.000000004"), D("0.000000003"),
                                                                     D("0.000000003")]  # fmt: skip
    assert costing.split_interval(D("0.000000010"), [0, 3, 0]) == [0, D("0.000000010"), 0]
    assert costing.split_interval(D("1"), [0, 0]) == [0, 0]  # no tokens: idle, nobody charged
    assert costing.split_interval(D("1"), []) == []
    rand = random.Random(16)
    for _ in range(300):
        cost = D(rand.randrange(0, 10**12)).scaleb(-9)
        weights = [rand.choice([0, 1, rand.randrange(1, 10**6)]) for _ in range(rand.randrange(1, 40))]
        shares = costing.split_interval(cost, weights)
        if sum(weights) == 0:
            assert all(s == 0 for s in shares)
            continue
        assert sum(shares) == cost
        for share, weight in zip(shares, weights, strict=True):
            exact = cost * weight / sum(weights)
            assert share.scaleb(9) == share.scaleb(9).to_integral_value()  # whole units of 1e-9
            assert exact - D("0.000000001") < share < exact + D("0.000000001")
    with pytest.raises(ValueError, match="whole number"):
        costing.split_interval(D("0.0000000001"), [1])


def test_gpu_time_is_the_samples_step_function_over_the_interval() -> None:
    t0 = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.UTC)
    s = dt.timedelta(seconds=1)
    end = t0 + 60 * s
    assert gpu_time.gpu_seconds([], start=t0, end=end) == 0
    assert gpu_time.gpu_seconds([(t0 - 90 * s, 2, 4)], start=t0, end=end) == 480  # holds from before
    samples = [(t0 - 5 * s, 3, 2), (t0 + 20 * s, 1, 2), (t0 + 20.5 * s, 0, 2), (t0 + 70 * s, 5, 2)]
    assert gpu_time.gpu_seconds(samples, start=t0, end=end) == 3 * 2 * 20 + 1 * 2 * D("0.5")
    assert gpu_time.gpu_seconds([(t0 + 30 * s, 1, 1)], start=t0, end=end) == 30  # nothing known before
