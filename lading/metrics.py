"""
Every Prometheus metric Lading exports, declared once.

Label sets are bounded: pool, tenant, state, outcome class, reason. Never a job id, a
document key or a URL.

Several processes, one /metrics (`lading worker --processes N`): the worker processes run with
PROMETHEUS_MULTIPROC_DIR set to their supervisor's private directory, so every value lives in a
file there; the supervisor serves `combined_registry(directory)`: its own metrics and the
processes' files, added up. Counters and histograms add up across processes. Each gauge says how
(`multiprocess_mode`): `livesum` for what each process holds (attempts in flight), `livemax` for
what every process reads alike from the database; `live`: a process's values go when its
supervisor sees it exit (`mark_process_dead`).
"""

from __future__ import annotations

from collections.abc import Iterable

import prometheus_client as prom
from prometheus_client import multiprocess, registry
from prometheus_client import samples as prom_samples

REGISTRY = prom.REGISTRY
"""The registry /metrics serves: the process default, so client-library process metrics come along."""


class _Combined(registry.Collector):
    """This process's own metrics and those of the processes writing into `directory`, one family per
    name: samples of the same name and labels add up (a `_created` sample keeps the earliest)."""

    def __init__(self, directory: str) -> None:
        self._directory = directory

    def collect(self) -> Iterable[prom.Metric]:
        families: dict[str, prom.Metric] = {}
        values: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], prom_samples.Sample]] = {}
        collector = multiprocess.MultiProcessCollector(None, path=self._directory)  # type: ignore[no-untyped-call]
        children = collector.collect()  # type: ignore[no-untyped-call]
        for family in [*REGISTRY.collect(), *children]:
            if family.name not in families:
                families[family.name] = prom.Metric(family.name, family.documentation, family.type, family.unit)
                values[family.name] = {}
            merged = values[family.name]
            for sample in family.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                seen = merged.get(key)
                if seen is None:
                    merged[key] = sample
                elif sample.name.endswith("_created"):
                    merged[key] = seen._replace(value=min(seen.value, sample.value))
                else:
                    merged[key] = seen._replace(value=seen.value + sample.value)
        for name, family in families.items():
            family.samples = list(values[name].values())
            yield family


def combined_registry(directory: str) -> prom.CollectorRegistry:
    """What a supervisor serves on /metrics: its own metrics and its processes' (PROMETHEUS_MULTIPROC_DIR
    `directory`), added up. The processes write there; this process must not (its own stay in memory)."""
    combined = prom.CollectorRegistry(auto_describe=False)
    combined.register(_Combined(directory))
    return combined

JOBS_CLAIMED = prom.Counter("lading_jobs_claimed_total", "Jobs claimed by this worker", ["pool"])
ATTEMPTS_FINISHED = prom.Counter(
    "lading_attempts_finished_total",
    "Attempts finished, by outcome class and resulting state",
    ["pool", "outcome", "state"],
)
RESULTS_REUSED = prom.Counter(
    "lading_results_reused_total",
    "Jobs that took an earlier accepted result of their tenant instead of calling the model (docs/reuse.md)",
    ["pool"],
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
IN_FLIGHT = prom.Gauge(
    "lading_attempts_in_flight",
    "Attempts currently running in this process",
    ["pool"],
    multiprocess_mode="livesum",
)
PROVIDER_LATENCY = prom.Histogram(
    "lading_provider_latency_seconds",
    "Model call latency per attempt",
    ["pool"],
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120),
)
PROVIDER_FIRST_BYTE = prom.Histogram(
    "lading_provider_first_byte_seconds",
    "Time from sending a model request to the first byte of its answer",
    ["pool"],
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120),
)
TOKENS = prom.Counter(
    "lading_tokens_total", "Tokens the provider reported, by direction: in (prompt) and out (completion)",
    ["pool", "direction"],
)
ADMISSION_REJECTIONS = prom.Counter(
    "lading_admission_rejections_total",
    "Batches not admitted, by reason: NoTenantQuota, PoolNotFound, QuotaExceeded, InvalidManifest, ...",
    ["reason"],
)
COMMIT_BATCH = prom.Histogram(
    "lading_commit_batch_size",
    "Completions committed per group-commit statement",
    buckets=(1, 2, 5, 10, 25, 50, 100, 250),
)

# What model calls cost (lading/costing.py, docs/cost.md).
COST = prom.Counter(
    "lading_cost_total",
    "What model calls cost at their pool's spec.pricing, in the pool's currency (exact sums: the "
    "database, docs/cost.md)",
    ["tenant", "pool", "currency"],
)
COST_SAVED = prom.Counter(
    "lading_cost_saved_total",
    "What reused results avoided paying: the cost of the job each result was taken from, in its currency",
    ["tenant", "pool", "currency"],
)
GPU_COST = prom.Counter(
    "lading_gpu_cost_total",
    "What the GPU time of vLLM pools priced by the GPU hour cost, per closed 60 s interval, in the pool's "
    "currency; kind: charged (split among the interval's attempts) or idle (no tokens, charged to no tenant)",
    ["pool", "currency", "kind"],
)
GPU_INTERVALS_CLOSED = prom.Counter(
    "lading_gpu_intervals_closed_total",
    "Intervals of vLLM pools priced by the GPU hour that the elected allocator closed",
    ["pool"],
)

# Documents given by manifest (lading/documents/fetching.py), read by workers before the model call.
DOCUMENT_FETCHES = prom.Counter(
    "lading_document_fetches_total",
    "Documents given by URI that workers read, by result: ok or the error class (DOCUMENT_DIGEST_MISMATCH, ...)",
    ["pool", "result"],
)
DOCUMENT_FETCH_SECONDS = prom.Histogram(
    "lading_document_fetch_seconds",
    "Time to read and verify one document given by URI",
    ["pool"],
    buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60),
)

# The distributed admission limiter (lading/limiting.py).
LIMITER_WAIT = prom.Histogram(
    "lading_limiter_wait_seconds",
    "Time an attempt waited for a limiter permit (request, tokens and concurrency) before its model call",
    ["pool"],
    buckets=(0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60),
)
LIMITER_REFUSALS = prom.Counter(
    "lading_limiter_refusals_total",
    "Permit requests refused, by the limit that refused: cooldown, requests, tokens, concurrency",
    ["pool", "reason"],
)
LIMITER_COOLDOWNS = prom.Counter("lading_limiter_cooldowns_total", "429 answers that cooled a pool down", ["pool"])
LIMITER_COOLDOWN_SECONDS = prom.Counter(
    "lading_limiter_cooldown_seconds_total", "Seconds of pool cooldown requested by 429 answers", ["pool"]
)

# Database gauges: refreshed by the one elected process (lading_elected/gauges.py); absent elsewhere.
LabelledGauge = prom.Gauge
JOBS_BY_STATE = prom.Gauge(
    "lading_jobs", "Non-terminal jobs by pool, tenant and state (from the database)", ["pool", "tenant", "state"],
    multiprocess_mode="livemax",
)
OLDEST_ELIGIBLE_AGE = prom.Gauge(
    "lading_oldest_eligible_age_seconds",
    "Age of the oldest job that could run now, per pool: the autoscaling signal (from the database)",
    ["pool"],
    multiprocess_mode="livemax",
)
POOL_PAUSED = prom.Gauge(
    "lading_pool_paused",
    "1 while a pool claims nothing: paused by its spec, or after its provider refused the key or the quota",
    ["pool"],
    multiprocess_mode="livemax",
)
POOL_COOLING = prom.Gauge(
    "lading_pool_cooling_down",
    "1 while a pool waits out a 429 cooldown",
    ["pool"],
    multiprocess_mode="livemax",
)
REVIEW_QUEUE_SIZE = prom.Gauge(
    "lading_review_queue_size",
    "Jobs awaiting a reviewer (from the database)",
    multiprocess_mode="livemax",
)
REVIEW_QUEUE_OLDEST_AGE = prom.Gauge(
    "lading_review_queue_oldest_age_seconds", "How long the oldest job awaiting review has waited (from the database)",
    multiprocess_mode="livemax",
)
OUTBOX_UNPUBLISHED = prom.Gauge(
    "lading_outbox_unpublished",
    "Outbox events not yet published (from the database)",
    multiprocess_mode="livemax",
)
OUTBOX_BACKLOG_OLDEST_AGE = prom.Gauge(
    "lading_outbox_backlog_oldest_age_seconds",
    "Age of the oldest unpublished outbox event (from the database, whichever relay runs)",
    multiprocess_mode="livemax",
)
OUTBOX_SET_ASIDE = prom.Gauge(
    "lading_outbox_set_aside",
    "Outbox events set aside because PostgreSQL refused to record their fate (UNSTORABLE); they wait for a "
    "human, not the relay (from the database; alarm when > 0)",
    multiprocess_mode="livemax",
)
DELIVERIES_WAITING_FOR_ENDPOINT = prom.Gauge(
    "lading_deliveries_waiting_for_endpoint",
    "Deliveries held back because their batch names a DeliveryEndpoint that does not exist, per tenant "
    "(from the database; alarm when > 0)",
    ["tenant"],
    multiprocess_mode="livemax",
)
TENANT_BUDGET_EXHAUSTED = prom.Gauge(
    "lading_tenant_budget_exhausted",
    "1 while a budget of the tenant (TenantQuota spec.budget per month or day, or dailyTokenBudget) is spent "
    "and its claims stop, else 0; only tenants with a budget (from the database)",
    ["tenant"],
    multiprocess_mode="livemax",
)
GAUGE_REFRESHES = prom.Counter(
    "lading_gauge_refreshes_total", "Database gauge refreshes done by this process while elected"
)

# Retention: the cleaner, run by one elected process (worker/lading_worker/cleaning.py).
CLEANER_DELETED = prom.Counter(
    "lading_cleaner_deleted_total", "Rows deleted by the cleaner past their retention, per table", ["table"]
)
CLEANER_OLDEST_AGE = prom.Gauge(
    "lading_cleaner_oldest_retained_age_seconds",
    "Age of the oldest row the cleaner could delete once past its retention, per table (absent when none; "
    "far above the retention: the cleaner is behind or not running)",
    ["table"],
    multiprocess_mode="livemax",
)

# Events: the outbox relay and the broker ingress inbox (lading/events/).
OUTBOX_OLDEST_UNPUBLISHED_AGE = prom.Gauge(
    "lading_outbox_oldest_unpublished_age_seconds",
    "Age of the oldest outbox event not yet confirmed by the broker (0 when none), measured by the relay",
    multiprocess_mode="livemax",
)
OUTBOX_PUBLISHES = prom.Counter(
    "lading_outbox_publishes_total",
    "Outbox events published, by broker answer: confirmed, nacked, returned (unroutable), unconfirmed (no answer)",
    ["result"],
)
OUTBOX_MARKED = prom.Counter(
    "lading_outbox_marked_published_total", "Confirmed outbox events marked published by this relay"
)
BROKER_RECONNECTS = prom.Counter(
    "lading_broker_reconnects_total", "Broker connections lost and rebuilt, by loop", ["loop"]
)
INBOX_MESSAGES = prom.Counter(
    "lading_inbox_messages_total",
    "Broker messages handled by the ingress consumer, by outcome: recorded, duplicate, quarantined, rejected",
    ["outcome"],
)

# Deliveries to ERP webhooks (lading/delivery/). `endpoint` is a registered DeliveryEndpoint
# (namespace/name): bounded by what the platform team registers.
DELIVERY_ATTEMPTS = prom.Counter(
    "lading_delivery_attempts_total",
    "Delivery attempts by endpoint and outcome: delivered, retry, failed, unknown, stale",
    ["endpoint", "outcome"],
)
DELIVERIES_FINISHED = prom.Counter(
    "lading_deliveries_total",
    "Deliveries that reached a settled state, by endpoint and state (DELIVERED, FAILED_TERMINAL, UNKNOWN_EXTERNAL)",
    ["endpoint", "state"],
)
DELIVERIES_UNKNOWN_EXTERNAL = prom.Gauge(
    "lading_deliveries_unknown_external",
    "Deliveries whose outcome is unknown and wait for reconciliation (`lading deliveries`), per endpoint",
    ["endpoint"],
    multiprocess_mode="livemax",
)
DELIVERIES_WAITING_FOR_SECRET = prom.Gauge(
    "lading_deliveries_waiting_for_secret",
    "Due deliveries held back because their endpoint has no signing secret in this dispatcher (alarm when > 0)",
    ["endpoint"],
    multiprocess_mode="livemax",
)
DELIVERY_BREAKER_STATE = prom.Gauge(
    "lading_delivery_breaker_state",
    "Circuit breaker of an endpoint, shared by all dispatchers: 0 closed, 1 half-open, 2 open",
    ["endpoint"],
    multiprocess_mode="livemax",
)
DELIVERY_AUTH_FAILING = prom.Gauge(
    "lading_delivery_endpoint_auth_failing",
    "1 while an endpoint answers 401/403 repeatedly (its AuthFailing condition): alarm",
    ["endpoint"],
    multiprocess_mode="livemax",
)
DELIVERY_EGRESS_REFUSED = prom.Counter(
    "lading_delivery_egress_refused_total",
    "Attempts refused before connecting because the endpoint's address is not allowed (SSRF policy)",
    ["endpoint"],
)
DELIVERY_STALE = prom.Counter(
    "lading_delivery_stale_results_total",
    "Attempt outcomes discarded because the dispatcher no longer owned the delivery (fence or lease)",
)
DELIVERY_LATENCY = prom.Histogram(
    "lading_delivery_latency_seconds",
    "One delivery attempt, from sending the request to the receiver's answer (or failure)",
    ["endpoint"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20),
)
DELIVERY_END_TO_END = prom.Histogram(
    "lading_delivery_end_to_end_seconds",
    "From the job's success (the delivery row) to the receiver's 2xx",
    ["endpoint"],
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800, 3600),
)

# The HTTP intake (`lading api`). `route` is the route's template (/v1/jobs/{id}), never a concrete path.
API_REQUESTS = prom.Counter(
    "lading_api_requests_total", "Requests answered by the HTTP intake, by method, route template and status",
    ["method", "route", "status"],
)
API_LATENCY = prom.Histogram(
    "lading_api_request_seconds",
    "Time to answer a request of the HTTP intake, by method and route template",
    ["method", "route"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)
