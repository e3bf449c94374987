"""The prompt estimate learned from the provider's answers: conservative, bounded, converging."""

from __future__ import annotations

import math

from lading import limiting


def test_it_keeps_the_floor_until_enough_answers_then_reserves_the_most_counted_plus_the_margin() -> None:
    estimator = limiting.PromptEstimator()
    assert estimator.factor == 1.0 and estimator.tokens(1000) == 1000  # nothing learned: the local estimate
    for reported in (700, 750, 720, 745, 730, 710, 740):
        estimator.observe(estimated=1000, reported=reported)
    assert estimator.factor == 1.0  # seven answers: not enough to go below the floor
    estimator.observe(estimated=1000, reported=735)
    assert estimator.factor == 0.75 * (1 + limiting.ESTIMATE_MARGIN)  # the highest ratio seen, plus the margin
    assert estimator.tokens(2000) == math.ceil(2000 * estimator.factor) > 2000 * 0.75  # never below what was counted


def test_a_provider_counting_more_than_estimated_raises_the_reservation_at_once() -> None:
    estimator = limiting.PromptEstimator()
    estimator.observe(estimated=1000, reported=1500)  # a script tokenised at fewer characters per token
    assert estimator.factor == 1.5 * 1.01


def test_the_factor_is_bounded_and_nonsense_is_ignored() -> None:
    estimator = limiting.PromptEstimator()
    for _ in range(limiting.ESTIMATE_MIN_SAMPLES):
        estimator.observe(estimated=1000, reported=1)  # a provider reporting nonsense
    estimator.observe(estimated=1000, reported=0)
    estimator.observe(estimated=0, reported=500)
    assert estimator.factor == limiting.ESTIMATE_BOUNDS[0] and estimator.learned == limiting.ESTIMATE_MIN_SAMPLES
    estimator.observe(estimated=1, reported=10**9)
    assert estimator.factor == limiting.ESTIMATE_BOUNDS[1]


def test_only_recent_answers_count() -> None:
    estimator = limiting.PromptEstimator(samples=10)
    estimator.observe(estimated=1000, reported=900)  # an older, costlier prompt template
    for _ in range(10):
        estimator.observe(estimated=1000, reported=700)
    assert estimator.factor == 0.7 * 1.01


def test_a_recorded_factor_is_the_floor_until_this_process_has_seen_enough() -> None:
    estimator = limiting.PromptEstimator(floor=0.8)
    assert estimator.factor == 0.8
    estimator.observe(estimated=1000, reported=700)
    assert estimator.factor == 0.8
    estimator.observe(estimated=1000, reported=900)  # more than recorded: followed at once
    assert estimator.factor == 0.9 * 1.01
