"""The scaling decision: one table row per rule, then properties that must hold for any input."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

import hypothesis
import hypothesis.strategies as st
import pytest
from lading_operator import scaling

from lading.models import specs

T0 = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)

#: Limits wide enough that only maxConcurrency (1000 calls / 10 s = 100 requests/s) binds.
WIDE_LIMITS: dict[str, Any] = {"requestsPerMinute": 60_000, "tokensPerMinute": 100_000_000, "maxConcurrency": 1000}


def pool(
        *,
        provider: str = "openai-compatible",
        limits: dict[str, Any] | None = None,
        paused: bool = False,
        vllm: dict[str, Any] | None = None,
        **workers: Any,
) -> specs.InferencePoolSpec:
    data: dict[str, Any] = {
        "provider": provider,
        "model": "Qwen/Qwen2.5-7B-Instruct",
        "limits": WIDE_LIMITS if limits is None else limits,
        "workers": {"maxReplicas": 100, "scaleDownStabilizationSeconds": 0, **workers},
        "paused": paused,
    }
    if provider == "openai-compatible":
        data["endpoint"] = {"url": "https://api.example.com/v1"}
    if vllm is not None:
        data["vllm"] = vllm
    return specs.InferencePoolSpec.model_validate(data)


def signals(at_s: float = 0, **fields: Any) -> scaling.Signals:
    fields.setdefault("current_replicas", 0)
    fields.setdefault("mean_latency_s", 10.0)
    fields.setdefault("mean_tokens_per_attempt", 1500.0)
    return scaling.Signals(now=T0 + dt.timedelta(seconds=at_s), **fields)


def state(**fields: Any) -> scaling.ScaleState:
    return scaling.ScaleState(**fields)


def ago(seconds: float) -> dt.datetime:
    return T0 - dt.timedelta(seconds=seconds)


EXHAUSTED = scaling.Headroom(0.0, "vLLM: 3 requests waiting")

# (id, spec, signals, state, expected replicas, expected limited_by, expected reason)
ROWS: list[tuple[str, specs.InferencePoolSpec, scaling.Signals, scaling.ScaleState, int, str, str]] = [
    ("nothing to do stays at zero",
     pool(), signals(), state(),
     0, "demand", "no work: hold 0"),
    # 3200 jobs in 120 s at 10 s each = 266.7 concurrent calls = 9 workers of 32.
    ("backlog within its target scales up immediately to the demand",
     pool(), signals(current_replicas=2, eligible_backlog=3200, oldest_eligible_age_s=60), state(),
     9, "demand", "backlog 3200, oldest 60s ≤ target 120s: scale up 2→9"),
    ("a backlog twice its target age drains twice as fast",
     pool(), signals(current_replicas=2, eligible_backlog=3200, oldest_eligible_age_s=240), state(),
     17, "demand", "backlog 3200, oldest 240s > target 120s: scale up 2→17"),
    ("urgency stops at four times; then maxConcurrency bounds (100 req/s at 10 s / 32 = 32 workers)",
     pool(), signals(current_replicas=2, eligible_backlog=3200, oldest_eligible_age_s=12_000), state(),
     32, "maxConcurrency", "backlog 3200, oldest 12000s > target 120s: scale up 2→32, limited by maxConcurrency"),
    ("the design's example: tokensPerMinute allows 2 req/s = 5 workers of 8 at 20 s",
     pool(limits={"requestsPerMinute": 6000, "tokensPerMinute": 120_000, "maxConcurrency": 1000}, concurrency=8),
     signals(current_replicas=2, eligible_backlog=1200, oldest_eligible_age_s=340, mean_latency_s=20.0,
             mean_tokens_per_attempt=1000.0),
     state(),
     5, "tokensPerMinute", "backlog 1200, oldest 340s > target 120s: scale up 2→5, limited by tokensPerMinute"),
    ("requestsPerMinute bounds: 60/min = 1 req/s = 1 worker of 32 at 10 s",
     pool(limits={"requestsPerMinute": 60, "tokensPerMinute": 100_000_000, "maxConcurrency": 1000}),
     signals(current_replicas=0, eligible_backlog=500, oldest_eligible_age_s=10), state(),
     1, "requestsPerMinute", "backlog 500, oldest 10s ≤ target 120s: scale up 0→1, limited by requestsPerMinute"),
    ("maxReplicas bounds the demand",
     pool(maxReplicas=5), signals(current_replicas=2, eligible_backlog=3200, oldest_eligible_age_s=60), state(),
     5, "maxReplicas", "backlog 3200, oldest 60s ≤ target 120s: scale up 2→5, limited by maxReplicas"),
    ("minReplicas holds without work",
     pool(minReplicas=3), signals(current_replicas=3), state(last_nonzero_demand_at=ago(5000)),
     3, "minReplicas", "idle 5000s: hold 3, limited by minReplicas"),
    ("minReplicas is reached even from zero",
     pool(minReplicas=2), signals(current_replicas=0), state(),
     2, "minReplicas", "no work: scale up 0→2, limited by minReplicas"),
    ("calls in flight keep their workers: 64 calls = 2 workers of 32",
     pool(), signals(current_replicas=2, in_flight=64), state(),
     2, "demand", "no backlog, 64 in flight: hold 2"),
    ("before any attempt finished latency is assumed (10 s) and the default limits bind on tokens",
     pool(limits={}),
     signals(current_replicas=0, eligible_backlog=1000, oldest_eligible_age_s=1, mean_latency_s=None,
             mean_tokens_per_attempt=None),
     state(),
     1, "tokensPerMinute", "backlog 1000, oldest 1s ≤ target 120s: scale up 0→1, limited by tokensPerMinute"),
    ("scale-down waits for the window's highest recommendation",
     pool(scaleDownStabilizationSeconds=300), signals(current_replicas=8, in_flight=64),
     state(recommendations=((ago(100), 8),), last_nonzero_demand_at=ago(0)),
     8, "stabilization", "no backlog, 64 in flight: hold 8, stabilising: 8 wanted in the last 300s"),
    ("scale-down to the highest recommendation still in the window",
     pool(scaleDownStabilizationSeconds=300), signals(current_replicas=8, in_flight=64),
     state(recommendations=((ago(400), 8), (ago(200), 5), (ago(100), 3))),
     5, "stabilization", "no backlog, 64 in flight: scale down 8→5, stabilising: 5 wanted in the last 300s"),
    ("scale-down once the window has passed",
     pool(scaleDownStabilizationSeconds=300), signals(current_replicas=8, in_flight=64),
     state(recommendations=((ago(301), 8),)),
     2, "demand", "no backlog, 64 in flight: scale down 8→2"),
    ("a fresh state (operator restart) counts the current size as recommended: no immediate scale-down",
     pool(scaleDownStabilizationSeconds=300), signals(current_replicas=8, in_flight=64), state(),
     8, "stabilization", "no backlog, 64 in flight: hold 8, stabilising: 8 wanted in the last 300s"),
    ("with no window, scale-down is immediate",
     pool(), signals(current_replicas=8, in_flight=64), state(recommendations=((ago(1), 8),)),
     2, "demand", "no backlog, 64 in flight: scale down 8→2"),
    ("an idle pool keeps one worker until the idle period is over",
     pool(idleSeconds=600), signals(current_replicas=2), state(last_nonzero_demand_at=ago(100)),
     1, "idle", "idle 100s: scale down 2→1, keeping 1 until idle for 600s"),
    ("an idle pool scales to zero after the idle period",
     pool(idleSeconds=600), signals(current_replicas=1), state(last_nonzero_demand_at=ago(600)),
     0, "demand", "idle 600s: scale to zero"),
    ("idle for zero seconds is scale to zero at once",
     pool(idleSeconds=0), signals(current_replicas=3), state(last_nonzero_demand_at=ago(1)),
     0, "demand", "idle 1s: scale to zero"),
    ("running workers and no memory: the idle period starts now",
     pool(idleSeconds=600), signals(current_replicas=2), state(),
     1, "idle", "idle 0s: scale down 2→1, keeping 1 until idle for 600s"),
    ("no headroom: hold the current count",
     pool(), signals(current_replicas=2, eligible_backlog=3200, oldest_eligible_age_s=60, headroom=EXHAUSTED), state(),
     2, "headroom", "backlog 3200, oldest 60s ≤ target 120s: hold 2, no headroom (vLLM: 3 requests waiting)"),
    ("no headroom does not block minReplicas",
     pool(minReplicas=3), signals(current_replicas=1, eligible_backlog=3200, oldest_eligible_age_s=60,
                                  headroom=EXHAUSTED), state(),
     3, "headroom", "backlog 3200, oldest 60s ≤ target 120s: scale up 1→3, no headroom (vLLM: 3 requests waiting)"),
    ("no headroom does not block scaling down",
     pool(), signals(current_replicas=8, in_flight=64, headroom=EXHAUSTED), state(recommendations=((ago(1), 8),)),
     2, "demand", "no backlog, 64 in flight: scale down 8→2"),
    ("a 429 cooldown in force blocks scale-up",
     pool(), signals(current_replicas=2, eligible_backlog=3200, oldest_eligible_age_s=60,
                     cooldown_until=T0 + dt.timedelta(seconds=30)), state(),
     2, "headroom", "backlog 3200, oldest 60s ≤ target 120s: hold 2, no headroom (provider cooldown 30s left)"),
    ("an expired cooldown does not",
     pool(), signals(current_replicas=2, eligible_backlog=3200, oldest_eligible_age_s=60,
                     cooldown_until=T0 - dt.timedelta(seconds=1)), state(),
     9, "demand", "backlog 3200, oldest 60s ≤ target 120s: scale up 2→9"),
    ("a paused pool adds no workers",
     pool(paused=True), signals(current_replicas=1, eligible_backlog=3200, oldest_eligible_age_s=60), state(),
     1, "headroom", "backlog 3200, oldest 60s ≤ target 120s: hold 1, no headroom (pool paused)"),
    ("unknown headroom does not block",
     pool(), signals(current_replicas=2, eligible_backlog=3200, oldest_eligible_age_s=60,
                     headroom=scaling.Headroom.unknown("vLLM metrics unavailable")), state(),
     9, "demand", "backlog 3200, oldest 60s ≤ target 120s: scale up 2→9"),
    ("partial headroom caps the step: 4 workers using 50% extrapolate to 8",
     pool(), signals(current_replicas=4, eligible_backlog=9000, oldest_eligible_age_s=60,
                     headroom=scaling.Headroom(0.5, "vLLM: 128 of 256 sequences running")), state(),
     8, "headroom", "backlog 9000, oldest 60s ≤ target 120s: scale up 4→8, headroom 0.50 allows 8"),
    ("from zero workers, partial headroom cannot be extrapolated and does not cap",
     pool(), signals(current_replicas=0, eligible_backlog=3200, oldest_eligible_age_s=60,
                     headroom=scaling.Headroom(0.5, "x")), state(),
     9, "demand", "backlog 3200, oldest 60s ≤ target 120s: scale up 0→9"),
    ("a lowered maxReplicas applies at once",
     pool(maxReplicas=3, scaleDownStabilizationSeconds=300), signals(current_replicas=8, in_flight=256),
     state(recommendations=((ago(1), 8),)),
     3, "maxReplicas", "no backlog, 256 in flight: scale down 8→3, limited by maxReplicas"),
]


@pytest.mark.parametrize(
    ("spec", "sig", "before", "replicas", "limited_by", "reason"),
    [row[1:] for row in ROWS],
    ids=[row[0] for row in ROWS],
)
def test_decision_table(
        spec: specs.InferencePoolSpec,
        sig: scaling.Signals,
        before: scaling.ScaleState,
        replicas: int,
        limited_by: str,
        reason: str,
) -> None:
    decision, _ = scaling.decide(spec, sig, before)
    assert (decision.replicas, decision.limited_by, decision.reason) == (replicas, limited_by, reason)


def test_capacity_is_the_smallest_limit_at_the_observed_latency_and_tokens() -> None:
    spec = pool(limits={"requestsPerMinute": 600, "tokensPerMinute": 300_000, "maxConcurrency": 16})
    assert scaling.capacity(spec, signals(mean_latency_s=2.0, mean_tokens_per_attempt=1000.0)) == scaling.Capacity(
        per_s=5.0, limited_by="tokensPerMinute", latency_s=2.0, tokens=1000.0
    )
    assert scaling.capacity(spec, signals(mean_latency_s=4.0, mean_tokens_per_attempt=100.0)).limited_by == (
        "maxConcurrency"
    )
    assert scaling.capacity(spec, signals(mean_latency_s=0.5, mean_tokens_per_attempt=100.0)).limited_by == (
        "requestsPerMinute"
    )
    # Nonsense measurements fall back to the defaults instead of dividing by zero.
    fallback = scaling.capacity(spec, signals(mean_latency_s=0.0, mean_tokens_per_attempt=float("nan")))
    assert (fallback.latency_s, fallback.tokens) == (scaling.LATENCY_DEFAULT_S, scaling.TOKENS_DEFAULT)


def test_decision_reports_capacity() -> None:
    decision, _ = scaling.decide(pool(), signals(eligible_backlog=10, oldest_eligible_age_s=1), state())
    assert decision.capacity_per_s == pytest.approx(100.0)


def test_a_burst_then_a_lull_scales_down_only_after_the_window() -> None:
    spec = pool(scaleDownStabilizationSeconds=300, idleSeconds=600)
    s = state()
    replicas = 0
    timeline: list[tuple[int, int]] = []
    for t in range(0, 1500, 15):
        busy = t < 120
        sig = signals(
            at_s=t,
            current_replicas=replicas,
            eligible_backlog=3200 if busy else 0,
            oldest_eligible_age_s=60 if busy else None,
        )
        decision, s = scaling.decide(spec, sig, s)
        replicas = decision.replicas
        timeline.append((t, replicas))
    by_time = dict(timeline)
    assert by_time[0] == 9                   # up at once
    assert by_time[105] == 9                 # last busy tick
    assert by_time[105 + 285] == 9           # still inside the window after the last busy recommendation
    assert by_time[105 + 300] == 1           # window over: down to the idle floor, not zero
    assert by_time[105 + 585] == 1           # idle since 120 s: not yet 600 s
    assert by_time[120 + 600] == 0           # idle period over: zero
    assert all(r == 0 for t, r in timeline if t >= 720)


def test_vllm_engine_sleeps_with_its_workers_and_wakes_on_demand() -> None:
    spec = pool(provider="vllm", vllm={"replicas": 2}, idleSeconds=60)
    asleep, s = scaling.decide(spec, signals(current_replicas=1), state(last_nonzero_demand_at=ago(60)))
    assert (asleep.replicas, asleep.engine_replicas) == (0, 0)
    waking, s = scaling.decide(
        spec,
        signals(at_s=5, current_replicas=0, eligible_backlog=10, oldest_eligible_age_s=1,
                headroom=scaling.Headroom(0.0, "vLLM not ready (0/2 replicas)")),
        s,
    )
    # The model server starts; workers wait for it (no headroom until it is ready).
    assert (waking.replicas, waking.engine_replicas) == (0, 2)
    assert waking.desired_before_headroom == 1
    assert waking.reason.endswith("no headroom (vLLM not ready (0/2 replicas))")
    ready, _ = scaling.decide(
        spec, signals(at_s=60, current_replicas=0, eligible_backlog=10, oldest_eligible_age_s=56), s
    )
    assert (ready.replicas, ready.engine_replicas) == (1, 2)


def test_vllm_engine_stays_up_while_workers_linger_or_minimum_is_set() -> None:
    lingering, _ = scaling.decide(
        pool(provider="vllm", idleSeconds=600), signals(current_replicas=2), state(last_nonzero_demand_at=ago(10))
    )
    assert (lingering.replicas, lingering.engine_replicas) == (1, 1)
    kept, _ = scaling.decide(pool(provider="vllm", minReplicas=1), signals(current_replicas=1), state())
    assert kept.engine_replicas == 1


def test_external_pools_have_no_engine() -> None:
    decision, _ = scaling.decide(pool(), signals(), state())
    assert decision.engine_replicas is None


def test_state_remembers_scale_times_and_demand() -> None:
    decision, after = scaling.decide(
        pool(), signals(at_s=30, current_replicas=1, eligible_backlog=3200, oldest_eligible_age_s=60), state()
    )
    now = T0 + dt.timedelta(seconds=30)
    assert decision.replicas == 9
    assert (after.last_scale_up_at, after.last_scale_at, after.last_nonzero_demand_at) == (now, now, now)
    _, held = scaling.decide(pool(), signals(at_s=45, current_replicas=9, eligible_backlog=3200,
                                              oldest_eligible_age_s=75), after)
    assert held.last_scale_at == now


def test_state_round_trips_through_a_dict() -> None:
    _, after = scaling.decide(
        pool(scaleDownStabilizationSeconds=300),
        signals(current_replicas=1, eligible_backlog=3200, oldest_eligible_age_s=60),
        state(recommendations=((ago(30), 4),)),
    )
    assert scaling.ScaleState.from_dict(after.to_dict()) == after
    assert scaling.ScaleState.from_dict({}) == scaling.ScaleState()


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ("x", "must be an object"),
        ({"lastScaleAt": 5}, "lastScaleAt must be an RFC 3339 time"),
        ({"lastScaleAt": "yesterday"}, "lastScaleAt must be an RFC 3339 time"),
        ({"lastScaleAt": "2026-03-01T12:00:00"}, "has no timezone"),
        ({"recommendations": [["2026-03-01T12:00:00+00:00", -1]]}, "pairs"),
        ({"recommendations": [["2026-03-01T12:00:00+00:00", True]]}, "pairs"),
        ({"recommendations": [[1, 2]]}, "pairs"),
        ({"recommendations": [["2026-03-01T12:00:00+00:00", 1]] * 65}, "at most 64"),
    ],
)
def test_state_from_bad_dict_names_the_problem(data: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        scaling.ScaleState.from_dict(data)


def test_remembered_recommendations_are_bounded() -> None:
    spec = pool(scaleDownStabilizationSeconds=3600)
    s = state()
    for t in range(200):
        _, s = scaling.decide(spec, signals(at_s=t, current_replicas=5, in_flight=32 * (t % 7)), s)
    assert len(s.recommendations) == scaling.RECOMMENDATIONS_MAX
    assert [at for at, _ in s.recommendations] == sorted(at for at, _ in s.recommendations)


def test_reason_is_bounded() -> None:
    decision, _ = scaling.decide(
        pool(paused=True),
        signals(current_replicas=1, eligible_backlog=10**9, oldest_eligible_age_s=10**9,
                headroom=scaling.Headroom(0.0, "x" * 1000)),
        state(),
    )
    assert len(decision.reason) <= scaling.REASON_MAX


# --- properties

worker_settings = st.fixed_dictionaries({
    "minReplicas": st.integers(0, 5),
    "maxReplicas": st.integers(5, 60),
    "concurrency": st.integers(1, 64),
    "targetOldestAgeSeconds": st.integers(1, 600),
    "scaleDownStabilizationSeconds": st.integers(0, 600),
    "idleSeconds": st.integers(0, 900),
})
limits = st.fixed_dictionaries({
    "requestsPerMinute": st.integers(1, 100_000),
    "tokensPerMinute": st.integers(1, 10**8),
    "maxConcurrency": st.integers(1, 5000),
})
headrooms = st.one_of(
    st.builds(scaling.Headroom, st.none(), st.just("unknown")),
    st.builds(scaling.Headroom, st.floats(0.0, 1.0), st.just("measured")),
)
observations = st.fixed_dictionaries({
    "eligible_backlog": st.integers(0, 100_000),
    "oldest_eligible_age_s": st.one_of(st.none(), st.floats(0, 10_000)),
    "in_flight": st.integers(0, 5000),
    "mean_latency_s": st.one_of(st.none(), st.floats(0.01, 600)),
    "mean_tokens_per_attempt": st.one_of(st.none(), st.floats(1, 100_000)),
    "headroom": headrooms,
    "cooldown": st.booleans(),
    "step_s": st.integers(1, 120),
})


def make_spec(workers: dict[str, Any], lims: dict[str, Any]) -> specs.InferencePoolSpec:
    return pool(limits=lims, **workers)


def run(
        spec: specs.InferencePoolSpec,
        steps: list[dict[str, Any]],
        start_replicas: int,
) -> list[tuple[dt.datetime, int, scaling.Signals, scaling.Decision]]:
    """Apply each decision to the next step's current count, like the operator does."""
    s = scaling.ScaleState()
    replicas = start_replicas
    now = T0
    out = []
    for step in steps:
        now += dt.timedelta(seconds=step["step_s"])
        fields = {k: v for k, v in step.items() if k not in ("step_s", "cooldown")}
        sig = scaling.Signals(
            now=now,
            current_replicas=replicas,
            cooldown_until=now + dt.timedelta(seconds=10) if step["cooldown"] else None,
            **fields,
        )
        decision, s = scaling.decide(spec, sig, s)
        out.append((now, replicas, sig, decision))
        replicas = decision.replicas
    return out


@hypothesis.settings(max_examples=300, deadline=None)
@hypothesis.given(
    workers=worker_settings, lims=limits, steps=st.lists(observations, min_size=1, max_size=25),
    start=st.integers(0, 80),
)
def test_replicas_stay_within_min_and_max(
        workers: dict[str, Any], lims: dict[str, Any], steps: list[dict[str, Any]], start: int
) -> None:
    spec = make_spec(workers, lims)
    for _, _, _, decision in run(spec, steps, start):
        assert workers["minReplicas"] <= decision.replicas <= workers["maxReplicas"]
        assert len(decision.reason) <= scaling.REASON_MAX


@hypothesis.settings(max_examples=300, deadline=None)
@hypothesis.given(
    workers=worker_settings, lims=limits, steps=st.lists(observations, min_size=1, max_size=25),
    start=st.integers(0, 80),
)
def test_never_scales_up_without_headroom(
        workers: dict[str, Any], lims: dict[str, Any], steps: list[dict[str, Any]], start: int
) -> None:
    spec = make_spec(workers, lims)
    for _, current, sig, decision in run(spec, steps, start):
        blocked = sig.headroom.exhausted or sig.cooldown_until is not None
        if blocked:
            assert decision.replicas <= max(current, workers["minReplicas"])
        if sig.headroom.fraction is not None and not blocked and current > 0 and sig.headroom.fraction < 1:
            room = -(-current // 1) if sig.headroom.fraction == 0 else current / (1 - sig.headroom.fraction)
            assert decision.replicas <= max(room + 1, current, workers["minReplicas"])


@hypothesis.settings(max_examples=300, deadline=None)
@hypothesis.given(
    workers=worker_settings, lims=limits, steps=st.lists(observations, min_size=2, max_size=30),
    start=st.integers(0, 80),
)
def test_scale_down_is_never_faster_than_the_window(
        workers: dict[str, Any], lims: dict[str, Any], steps: list[dict[str, Any]], start: int
) -> None:
    """Every count is at least min(previous count, each recommendation of the window), within maxReplicas."""
    spec = make_spec(workers, lims)
    window = dt.timedelta(seconds=workers["scaleDownStabilizationSeconds"])
    history = run(spec, steps, start)
    recommended = [(now, scaling.recommend(spec, sig).replicas) for now, _, sig, _ in history]
    for i, (now, current, _, decision) in enumerate(history):
        for at, raw in recommended[: i + 1]:
            if at > now - window:
                assert decision.replicas >= min(current, raw, workers["maxReplicas"])
        # A fresh state counts the starting size as recommended at the first decision.
        if history[0][0] > now - window:
            assert decision.replicas >= min(current, start, workers["maxReplicas"])


@hypothesis.settings(max_examples=200, deadline=None)
@hypothesis.given(workers=worker_settings, lims=limits, obs=observations, start=st.integers(0, 80))
def test_decide_is_a_pure_function(
        workers: dict[str, Any], lims: dict[str, Any], obs: dict[str, Any], start: int
) -> None:
    spec = make_spec(workers, lims)
    first = run(spec, [obs], start)
    second = run(spec, [obs], start)
    assert [d for *_, d in first] == [d for *_, d in second]


def test_signals_and_state_are_immutable() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        signals().current_replicas = 3  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        state().recommendations = ()  # type: ignore[misc]
