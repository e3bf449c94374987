"""
Every Prometheus metric Lading exports, declared once.

Label sets are bounded: pool, tenant, state, outcome class, reason. Never a job id, a
document key or a URL.
"""

from __future__ import annotations

import prometheus_client as prom

REGISTRY = prom.REGISTRY
"""The registry /metrics serves: the process default, so client-library process metrics come along."""

JOBS_CLAIMED = prom.Counter("lading_jobs_claimed_total", "Jobs claimed by this worker", ["pool"])
ATTEMPTS_FINISHED = prom.Counter(
    "lading_attempts_finished_total",
    "Attempts finished, by outcome class and resulting state",
    ["pool", "outcome", "state"],
)
STALE_COMPLETIONS = prom.Counter(
    "lading_stale_completions_total",
    "Completions discarded because the attempt no longer owned the job (fence or lease)",
    ["pool"],
)
LEASES_LOST = prom.Counter(
    "lading_leases_lost_total", "In-flight attempts cancelled because their lease was gone", ["pool"]
)
REAPER_RECOVERIES = prom.Counter(
    "lading_reaper_recoveries_total", "Expired leases and deadlines handled by the reaper", ["to_state", "reason"]
)
IN_FLIGHT = prom.Gauge("lading_attempts_in_flight", "Attempts currently running in this process", ["pool"])
PROVIDER_LATENCY = prom.Histogram(
    "lading_provider_latency_seconds",
    "Model call latency per attempt",
    ["pool"],
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120),
)
COMMIT_BATCH = prom.Histogram(
    "lading_commit_batch_size",
    "Completions committed per group-commit statement",
    buckets=(1, 2, 5, 10, 25, 50, 100, 250),
)
