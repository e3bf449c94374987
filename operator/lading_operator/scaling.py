"""
How many workers a pool should run: a pure function of the pool's spec, what was measured, and a
little remembered state. No I/O and no clock: the caller passes `Signals.now`, so every rule is
table-tested with exact times (tests/unit/operator/test_scaling.py).

The operator reads the signals (PostgreSQL: `lading.db.registry.pool_signals`; the provider:
`lading_operator.headroom`), calls `decide`, writes `Decision.replicas` to the worker Deployment,
`Decision.engine_replicas` to a vllm pool's Deployment, and `Decision.reason` to the pool's status
(`scalingReason`). The returned `ScaleState` is kept for the next call (`ScaleState.to_dict` /
`from_dict` for an annotation). With `workers.scaling: keda` the operator renders a ScaledObject
instead (`rendering.keda_scaled_object`) and this function only explains.

The formula (all rates in requests per second):

    L  = observed mean latency of an attempt (LATENCY_DEFAULT_S before any attempt finished)
    T  = observed mean tokens per attempt (TOKENS_DEFAULT before any)
    c  = workers.concurrency;  A = workers.targetOldestAgeSeconds
    B  = eligible backlog (jobs a claimer could take now);  O = age of the oldest of them
    F  = in flight (attempts running now)

    capacity     = min(requestsPerMinute/60, tokensPerMinute/(60·T), maxConcurrency/L)
                   the most the provider accepts from the pool; the smallest term is `limited_by`
    per worker   = c/L
    urgency      = clamp(O/A, 1, URGENCY_MAX)  a backlog older than its target drains faster
    required     = urgency·B/A               drain the backlog within one target age
    slots        = F + required·L            Little's law: concurrent calls that rate needs
    demand       = ceil(slots/c)             workers for those slots
    useful       = ceil(capacity·L/c)        more workers than this only wait on the limiter
    raw          = clamp(min(demand, useful), minReplicas, maxReplicas)

Then, like the HorizontalPodAutoscaler (and KEDA on top of it):
- scale-up is immediate: raw > current -> raw;
- scale-down is stabilised: the new count is the highest raw recommendation of the last
  scaleDownStabilizationSeconds, so a lull between bursts does not drop workers;
- scale to zero: with minReplicas 0, a pool with no backlog and nothing in flight keeps one worker
  until it has been idle for workers.idleSeconds; a vllm pool's model server (`engine_replicas`)
  goes to zero at the same moment and comes back with the first eligible job;
- headroom: never add workers the provider cannot serve. When the headroom is exhausted (vLLM
  requests waiting or KV cache nearly full; an external 429 cooldown or a pause), the count stays
  where it is; with a known partial headroom h, at most ceil(current/(1-h)) workers (what the current
  load extrapolates to at full use). Headroom never blocks minReplicas or scaling down.

Reasons are short sentences for `kubectl get ipool -o wide` and events, e.g.
    "backlog 1200, oldest 340s > target 120s: scale up 2→5, limited by tokensPerMinute"
    "no backlog, 3 in flight: hold 4 (stabilising: 4 wanted in the last 300s)"
    "idle 600s: scale to zero"
    "backlog 80, oldest 30s ≤ target 120s: hold 3, no headroom (vLLM: 12 requests waiting)"
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
from typing import Any

from lading.models import specs

LATENCY_DEFAULT_S = 10.0
"""Assumed attempt latency before one finished: a 7B model extracting a one-page invoice."""
TOKENS_DEFAULT = 1500.0
"""Assumed tokens per attempt before one finished (prompt + completion of a one-page invoice)."""
URGENCY_MAX = 4.0
"""A backlog twice as old as its target drains twice as fast; more than four times is no faster
(the limits, not the urgency, are then what holds it back)."""
HEADROOM_EXHAUSTED_BELOW = 0.05
"""Headroom under 5% counts as none: vLLM's scheduler admits nothing new at that point."""
RECOMMENDATIONS_MAX = 64
"""Remembered recommendations: a 300 s window at one decision per 15 s holds 20."""
REASON_MAX = 256
"""The status field `scalingReason` holds at most this many characters."""

LIMITED_BY_DEMAND = "demand"
LIMITED_BY_RPM = "requestsPerMinute"
LIMITED_BY_TPM = "tokensPerMinute"
LIMITED_BY_CONCURRENCY = "maxConcurrency"
LIMITED_BY_MIN = "minReplicas"
LIMITED_BY_MAX = "maxReplicas"
LIMITED_BY_HEADROOM = "headroom"
LIMITED_BY_STABILIZATION = "stabilization"
LIMITED_BY_IDLE = "idle"


@dataclasses.dataclass(frozen=True)
class Headroom:
    """How much more the provider can take: `fraction` 0 (none) .. 1 (idle), None when unknown."""

    fraction: float | None
    reason: str

    @property
    def exhausted(self) -> bool:
        return self.fraction is not None and self.fraction < HEADROOM_EXHAUSTED_BELOW

    @classmethod
    def unknown(cls, reason: str = "headroom unknown") -> Headroom:
        return cls(None, reason)

    def render(self) -> str | None:
        """The status field `headroom`: "0.00".."1.00", or None when unknown."""
        return None if self.fraction is None else f"{min(max(self.fraction, 0.0), 1.0):.2f}"


@dataclasses.dataclass(frozen=True)
class Signals:
    """What was measured about one pool just now."""

    now: dt.datetime
    """The caller's clock (timezone-aware); every age and window is measured against it."""
    current_replicas: int
    """Worker replicas the Deployment has now (spec.replicas)."""
    eligible_backlog: int = 0
    """Jobs a claimer could take now (READY or RETRY_SCHEDULED, due, inside their deadline)."""
    oldest_eligible_age_s: float | None = None
    """Seconds the oldest of them has been eligible; None when there are none."""
    in_flight: int = 0
    """Attempts running now."""
    mean_latency_s: float | None = None
    """Mean latency of the pool's recent attempts; None when none finished recently."""
    mean_tokens_per_attempt: float | None = None
    """Mean tokens (prompt + completion) of recent attempts; None when unknown."""
    headroom: Headroom = Headroom(None, "headroom unknown")
    """The provider's live headroom (lading_operator.headroom)."""
    cooldown_until: dt.datetime | None = None
    """The provider answered 429 (or a pause is in force) and asked us to wait until then."""


@dataclasses.dataclass(frozen=True)
class ScaleState:
    """What `decide` remembers between calls. Start with `ScaleState()`."""

    last_scale_up_at: dt.datetime | None = None
    last_scale_at: dt.datetime | None = None
    """When the worker count last changed (status `lastScaleTime`)."""
    last_nonzero_demand_at: dt.datetime | None = None
    """When the pool last had backlog or calls in flight; the idle period counts from here."""
    recommendations: tuple[tuple[dt.datetime, int], ...] = ()
    """Raw recommendations of the stabilisation window, oldest first (at most RECOMMENDATIONS_MAX)."""

    def to_dict(self) -> dict[str, Any]:
        def iso(value: dt.datetime | None) -> str | None:
            return None if value is None else value.isoformat()

        return {
            "lastScaleUpAt": iso(self.last_scale_up_at),
            "lastScaleAt": iso(self.last_scale_at),
            "lastNonzeroDemandAt": iso(self.last_nonzero_demand_at),
            "recommendations": [[at.isoformat(), replicas] for at, replicas in self.recommendations],
        }

    @classmethod
    def from_dict(cls, data: Any) -> ScaleState:
        """Parse `to_dict`'s output; a ValueError names what was wrong (the caller starts afresh)."""
        if not isinstance(data, dict):
            raise ValueError("scale state must be an object")

        def moment(key: str) -> dt.datetime | None:
            value = data.get(key)
            if value is None:
                return None
            if not isinstance(value, str):
                raise ValueError(f"scale state {key} must be an RFC 3339 time")
            try:
                parsed = dt.datetime.fromisoformat(value)
            except ValueError:
                raise ValueError(f"scale state {key} must be an RFC 3339 time") from None
            if parsed.tzinfo is None:
                raise ValueError(f"scale state {key} has no timezone")
            return parsed

        raw = data.get("recommendations") or []
        if not isinstance(raw, list) or len(raw) > RECOMMENDATIONS_MAX:
            raise ValueError(f"scale state recommendations must be a list of at most {RECOMMENDATIONS_MAX}")
        recommendations: list[tuple[dt.datetime, int]] = []
        for item in raw:
            if (
                not isinstance(item, list) or len(item) != 2 or not isinstance(item[0], str)
                or not isinstance(item[1], int) or isinstance(item[1], bool) or item[1] < 0
            ):
                raise ValueError("scale state recommendations must be [time, replicas] pairs")
            at = dt.datetime.fromisoformat(item[0])
            if at.tzinfo is None:
                raise ValueError("scale state recommendation time has no timezone")
            recommendations.append((at, item[1]))
        return cls(
            last_scale_up_at=moment("lastScaleUpAt"),
            last_scale_at=moment("lastScaleAt"),
            last_nonzero_demand_at=moment("lastNonzeroDemandAt"),
            recommendations=tuple(recommendations),
        )


@dataclasses.dataclass(frozen=True)
class Decision:
    replicas: int
    """Worker replicas to run."""
    reason: str
    """One short sentence: the situation, the action, what bound it."""
    capacity_per_s: float
    """Requests per second the pool's limits allow at the observed latency and tokens."""
    limited_by: str
    """What set the count: demand, requestsPerMinute, tokensPerMinute, maxConcurrency, minReplicas,
    maxReplicas, headroom, stabilization or idle."""
    engine_replicas: int | None = None
    """vLLM replicas for a vllm pool (0 once idle), None for other providers."""
    desired_before_headroom: int = 0
    """The count the demand asked for, before headroom held it back (for status and metrics)."""


@dataclasses.dataclass(frozen=True)
class Capacity:
    per_s: float
    limited_by: str
    latency_s: float
    tokens: float


def capacity(spec: specs.InferencePoolSpec, signals: Signals) -> Capacity:
    """capacity = min(RPM/60, TPM/(60·T), maxConcurrency/L), and which term is the smallest."""
    latency = signals.mean_latency_s if _positive(signals.mean_latency_s) else LATENCY_DEFAULT_S
    tokens = signals.mean_tokens_per_attempt if _positive(signals.mean_tokens_per_attempt) else TOKENS_DEFAULT
    assert latency is not None and tokens is not None
    limits = spec.limits
    terms = [
        (limits.requests_per_minute / 60.0, LIMITED_BY_RPM),
        (limits.tokens_per_minute / (60.0 * tokens), LIMITED_BY_TPM),
        (limits.max_concurrency / latency, LIMITED_BY_CONCURRENCY),
    ]
    per_s, limited_by = min(terms, key=lambda term: term[0])
    return Capacity(per_s=per_s, limited_by=limited_by, latency_s=latency, tokens=tokens)


def _positive(value: float | None) -> bool:
    return value is not None and math.isfinite(value) and value > 0


def _ceil(value: float) -> int:
    # Guard against 2.0000000001 becoming 3: rates are measured, not exact.
    return max(0, math.ceil(value - 1e-9))


def _age(value: float | None) -> str:
    return "?" if value is None else f"{value:.0f}s"


def _situation(signals: Signals, target_s: int, idle_s: float | None) -> str:
    if signals.eligible_backlog > 0:
        age = signals.oldest_eligible_age_s
        compare = ">" if age is not None and age > target_s else "≤"
        return f"backlog {signals.eligible_backlog}, oldest {_age(age)} {compare} target {target_s}s"
    if signals.in_flight > 0:
        return f"no backlog, {signals.in_flight} in flight"
    if idle_s is None:
        return "no work"
    return f"idle {idle_s:.0f}s"


@dataclasses.dataclass(frozen=True)
class Recommendation:
    """What the demand and the limits ask for, before stabilisation, idling and headroom."""

    replicas: int
    limited_by: str
    capacity: Capacity


def recommend(spec: specs.InferencePoolSpec, signals: Signals) -> Recommendation:
    """raw = clamp(min(demand, useful), minReplicas, maxReplicas) (see the module doc)."""
    workers = spec.workers
    backlog = max(signals.eligible_backlog, 0)
    in_flight = max(signals.in_flight, 0)
    cap = capacity(spec, signals)
    target_s = workers.target_oldest_age_seconds
    age = signals.oldest_eligible_age_s or 0.0
    urgency = min(max(age / target_s, 1.0), URGENCY_MAX) if backlog else 1.0
    required_per_s = urgency * backlog / target_s
    slots = in_flight + required_per_s * cap.latency_s
    demand = _ceil(slots / workers.concurrency)
    useful = max(_ceil(cap.per_s * cap.latency_s / workers.concurrency), 1)
    limited_by = LIMITED_BY_DEMAND
    wanted = demand
    if useful < demand:
        wanted, limited_by = useful, cap.limited_by
    if wanted > workers.max_replicas:
        wanted, limited_by = workers.max_replicas, LIMITED_BY_MAX
    if wanted < workers.min_replicas:
        wanted, limited_by = workers.min_replicas, LIMITED_BY_MIN
    return Recommendation(replicas=wanted, limited_by=limited_by, capacity=cap)


def decide(
        spec: specs.InferencePoolSpec,
        signals: Signals,
        state: ScaleState,
) -> tuple[Decision, ScaleState]:
    """The worker count for the pool now, why, and the state to pass next time (see the module doc)."""
    workers = spec.workers
    now = signals.now
    current = max(signals.current_replicas, 0)
    backlog = max(signals.eligible_backlog, 0)
    in_flight = max(signals.in_flight, 0)
    target_s = workers.target_oldest_age_seconds
    recommendation = recommend(spec, signals)
    cap = recommendation.capacity
    raw = recommendation.replicas
    limited_by = recommendation.limited_by

    # Idle: since when nothing waited or ran.
    has_demand = backlog > 0 or in_flight > 0
    last_demand = now if has_demand else state.last_nonzero_demand_at
    if last_demand is None and current > 0:
        # Running workers and no memory (operator restarted): the idle period starts now.
        last_demand = now
    idle_s = None if has_demand or last_demand is None else max((now - last_demand).total_seconds(), 0.0)
    idle_long_enough = not has_demand and (idle_s is None or idle_s >= workers.idle_seconds)

    # Stabilisation window: remember this recommendation, forget the expired ones.
    # A fresh state (first decision, operator restarted) counts the current size as recommended
    # just now: a restart must not be an occasion to scale down at once.
    window = dt.timedelta(seconds=workers.scale_down_stabilization_seconds)
    history = state.recommendations or ((now, current),)
    recommendations = _remember(history, now=now, replicas=raw, window=window)
    stabilized = min(max(replicas for _, replicas in recommendations), workers.max_replicas)

    notes: list[str] = []
    if raw > current:
        target = raw
    else:
        target = max(raw, min(current, stabilized))
        if target > raw:
            limited_by = LIMITED_BY_STABILIZATION
            notes.append(f"stabilising: {stabilized} wanted in the last {workers.scale_down_stabilization_seconds}s")

    # Scale to zero only after the idle period; until then keep one worker (if there is one).
    if target == 0 and current > 0 and not idle_long_enough:
        target = 1
        limited_by = LIMITED_BY_IDLE
        notes.append(f"keeping 1 until idle for {workers.idle_seconds}s")

    # Headroom: never add workers the provider cannot serve.
    desired_before_headroom = target
    floor = max(current, workers.min_replicas)
    if target > floor:
        blocker = _headroom_blocker(spec, signals)
        if blocker is not None:
            target, limited_by = min(floor, workers.max_replicas), LIMITED_BY_HEADROOM
            notes.append(f"no headroom ({blocker})")
        elif (
            signals.headroom.fraction is not None and current > 0 and signals.headroom.fraction < 1.0
        ):
            room = max(_ceil(current / (1.0 - max(signals.headroom.fraction, 0.0))), current)
            if target > room:
                target, limited_by = max(room, floor), LIMITED_BY_HEADROOM
                notes.append(f"headroom {signals.headroom.render()} allows {room}")
    target = min(max(target, workers.min_replicas), workers.max_replicas)

    if target > current:
        action = f"scale up {current}→{target}"
    elif target < current:
        action = "scale to zero" if target == 0 else f"scale down {current}→{target}"
    else:
        action = f"hold {target}"
    if limited_by in (LIMITED_BY_RPM, LIMITED_BY_TPM, LIMITED_BY_CONCURRENCY, LIMITED_BY_MAX, LIMITED_BY_MIN):
        notes.insert(0, f"limited by {limited_by}")
    reason = f"{_situation(signals, target_s, idle_s)}: {action}"
    if notes:
        reason += ", " + ", ".join(notes)
    if len(reason) > REASON_MAX:
        reason = reason[: REASON_MAX - 1] + "…"

    engine_replicas: int | None = None
    if spec.provider == "vllm":
        vllm = spec.vllm or specs.VllmSettings()
        asleep = workers.min_replicas == 0 and target == 0 and not has_demand
        engine_replicas = 0 if asleep else vllm.replicas

    new_state = ScaleState(
        last_scale_up_at=now if target > current else state.last_scale_up_at,
        last_scale_at=now if target != current else state.last_scale_at,
        last_nonzero_demand_at=last_demand,
        recommendations=recommendations,
    )
    decision = Decision(
        replicas=target,
        reason=reason,
        capacity_per_s=cap.per_s,
        limited_by=limited_by,
        engine_replicas=engine_replicas,
        desired_before_headroom=desired_before_headroom,
    )
    return decision, new_state


def _headroom_blocker(spec: specs.InferencePoolSpec, signals: Signals) -> str | None:
    """Why no worker may be added now, or None."""
    if spec.paused:
        return "pool paused"
    if signals.cooldown_until is not None and signals.cooldown_until > signals.now:
        left = (signals.cooldown_until - signals.now).total_seconds()
        return f"provider cooldown {left:.0f}s left"
    if signals.headroom.exhausted:
        return signals.headroom.reason
    return None


def _remember(
        recommendations: tuple[tuple[dt.datetime, int], ...],
        *,
        now: dt.datetime,
        replicas: int,
        window: dt.timedelta,
) -> tuple[tuple[dt.datetime, int], ...]:
    """The window's recommendations plus this one, oldest first, at most RECOMMENDATIONS_MAX.

    Over the bound, the two oldest merge into one with the later time and the higher count: the
    window then remembers a high count a little longer than it was seen, never shorter, so bounding
    the list can slow a scale-down but never speed it up.
    """
    kept = [(at, count) for at, count in recommendations if at > now - window and at <= now]
    kept.append((now, replicas))
    while len(kept) > RECOMMENDATIONS_MAX:
        (_, first), (second_at, second) = kept[0], kept[1]
        kept[0:2] = [(second_at, max(first, second))]
    return tuple(kept)
