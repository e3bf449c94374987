"""
The receiver's Prometheus metrics, served at `/metrics`.

Each running receiver has its own registry (it runs in an ERP team's process, or inside
`lading run` next to Lading's own metrics, and two receivers in one process must not share
counters). Labels are bounded: `outcome` and `reason` take only the values listed here,
never a delivery id, a tenant or a URL.
"""

from __future__ import annotations

import dataclasses

import prometheus_client as prom

ACCEPTED = "accepted"
"""A new delivery whose ERP effect was applied now."""
DUPLICATE_DELIVERY = "duplicate_delivery"
"""A delivery id seen before with the same body: the stored answer was given again, nothing changed."""
DUPLICATE_INTENT = "duplicate_intent"
"""A new delivery id whose business intent (the same invoice) was booked before: answered
with the existing record's reference, nothing booked."""
OUTCOMES = (ACCEPTED, DUPLICATE_DELIVERY, DUPLICATE_INTENT)

# Rejection reasons (the `reason` label). The signature ones come from lading.webhooks.signing.
REASONS = (
    "missing-headers",
    "bad-headers",
    "bad-signature",
    "timestamp-too-old",
    "timestamp-too-new",
    "too-large",
    "unsupported-media-type",
    "bad-json",
    "bad-schema",
    "unsupported-event",
    "unsupported-schema",
    "unstorable",
    "delivery-conflict",
    "database-unavailable",
    "migrations-pending",
    "internal-error",
    "other",
)
"""Any other value is counted as `other`, so the label set stays this one."""


@dataclasses.dataclass(frozen=True)
class Counts:
    """What a receiver has answered since it started (for `lading run` summaries and tests)."""

    accepted: int
    duplicate_delivery: int
    duplicate_intent: int
    rejected: dict[str, int]


class ReceiverMetrics:
    def __init__(self) -> None:
        self.registry = prom.CollectorRegistry()
        self.deliveries = prom.Counter(
            "lading_receiver_deliveries_total",
            "Deliveries answered 200, by outcome (accepted, duplicate_delivery, duplicate_intent)",
            ["outcome"],
            registry=self.registry,
        )
        self.rejected = prom.Counter(
            "lading_receiver_rejected_total",
            "Deliveries refused (4xx/5xx), by reason",
            ["reason"],
            registry=self.registry,
        )
        self.conflicts = prom.Counter(
            "lading_receiver_delivery_conflicts_total",
            "ALARM: a delivery id arrived again with a different body (409); the first body stands",
            registry=self.registry,
        )
        self.transaction_seconds = prom.Histogram(
            "lading_receiver_transaction_seconds",
            "Time from taking a database connection to the commit of a group of deliveries (one transaction)",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10),
            registry=self.registry,
        )
        self.group_size = prom.Histogram(
            "lading_receiver_commit_group_deliveries",
            "Deliveries recorded per transaction (group commit: those that arrived while earlier groups committed)",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
            registry=self.registry,
        )
        self.cleaner_deleted = prom.Counter(
            "lading_receiver_cleaner_deleted_total",
            "Inbox rows deleted past the inbox retention (cleaning.py)",
            registry=self.registry,
        )
        self.inbox_oldest_age = prom.Gauge(
            "lading_receiver_inbox_oldest_age_seconds",
            "Age of the oldest inbox row, read by the cleaner each round (0 when the inbox is empty); "
            "far above the retention: the cleaner is behind or not running",
            registry=self.registry,
        )
        for outcome in OUTCOMES:
            self.deliveries.labels(outcome)
        for reason in REASONS:
            self.rejected.labels(reason)

    def reject(self, reason: str) -> None:
        self.rejected.labels(reason if reason in REASONS else "other").inc()

    def counts(self) -> Counts:
        def value(name: str, labels: dict[str, str]) -> int:
            return int(self.registry.get_sample_value(name, labels) or 0)

        return Counts(
            accepted=value("lading_receiver_deliveries_total", {"outcome": ACCEPTED}),
            duplicate_delivery=value("lading_receiver_deliveries_total", {"outcome": DUPLICATE_DELIVERY}),
            duplicate_intent=value("lading_receiver_deliveries_total", {"outcome": DUPLICATE_INTENT}),
            rejected={r: n for r in REASONS if (n := value("lading_receiver_rejected_total", {"reason": r}))},
        )
