"""
The receiver's settings, with the reason for each default. Signing secrets are not here:
they are parsed once into `lading.webhooks.signing.SigningKey`s (whose repr hides them) and
passed next to the settings, so printing settings can never print a secret.
"""

from __future__ import annotations

import dataclasses
from typing import Final

from lading.models import specs
from lading.webhooks import signing

PATH = "/webhooks/lading"
"""Where deliveries are POSTed; liveness and readiness are under it, metrics at `/metrics`."""

HOUR_S: Final = 3600.0
DAY_S: Final = 24 * HOUR_S
SENDER_RETRY_SPAN_MAX_S: Final = specs.DEADLINE_S_MAX
"""The longest a Lading dispatcher retries one delivery: a DeliveryEndpoint's
`retryBudget.maxAgeSeconds` is at most this (30 days), counted from its first attempt, which is
never later than the first receipt here."""


def dedup_window_s(tolerance_s: int) -> float:
    """How long an inbox row must stay: the sender's longest retry span, plus how long a captured
    request stays replayable (the timestamp tolerance). A row deleted earlier could meet a retry or
    a replay of its delivery, which would then be applied again (the ledger's intent key would
    still refuse to book the same invoice twice, but the inbox is the delivery's guarantee)."""
    return SENDER_RETRY_SPAN_MAX_S + tolerance_s


@dataclasses.dataclass(frozen=True)
class ReceiverSettings:
    tolerance_s: int = signing.DEFAULT_TOLERANCE_S
    """How far `webhook-timestamp` may be from this host's clock, either way (the Standard
    Webhooks recommendation, 5 minutes). Bounds how long a captured request can be replayed;
    the inbox dedups replays inside the window."""
    max_body_bytes: int = 1024 * 1024
    """Largest body accepted (413 above it), checked on Content-Length before reading and while
    reading. 1 MiB holds an invoice with hundreds of lines and its evidence several times over."""
    pool_min_size: int = 2
    """Connections kept open to the receiver's database."""
    pool_max_size: int = 10
    """Connections at most: the group transactions below, the readiness probe and the inbox cleaner."""
    commit_groups: int = 4
    """Group transactions at once (each on its own connection, at most `pool_max_size`). A
    delivery arriving while fewer run starts one at once; otherwise it joins the next group,
    recorded with the others that arrived meanwhile in one transaction and one durable commit."""
    commit_group_max: int = 256
    """Deliveries in one group transaction at most."""
    database_timeout_s: float = 10.0
    """The longest wait for a connection, and for each statement of a delivery's transaction
    (and for the readiness check). Past it the delivery is answered 503 with Retry-After: the
    sender retries, the inbox dedups."""
    retry_after_s: int = 5
    """The Retry-After of a 503 (database unavailable)."""
    shutdown_grace_s: float = 30.0
    """On SIGTERM, deliveries in flight get this long to finish before the server closes."""
    adapter: str = "ledger"
    """The ERP adapter applying the effect (see `adapters.by_name`)."""
    inbox_retention_s: float = 45 * DAY_S
    """Inbox rows are deleted this long after receipt. Never below the dedup window (30 days and
    the tolerance, `dedup_window_s`); 45 days leaves two weeks to reconcile after the last retry."""
    cleaner_interval_s: float = 60.0
    """Seconds between cleaning rounds. Retention is days: a minute's delay is invisible, and an
    idle round is one indexed probe."""
    cleaner_batch_size: int = 1000
    """Inbox rows per DELETE statement: a few milliseconds of locks each, so deliveries (which
    insert into the same table) never wait behind a long statement."""
    cleaner_max_batches: int = 100
    """Statements per round: a large backlog (a first clean-up) is worked off over several rounds."""

    def __post_init__(self) -> None:
        if self.tolerance_s < 1:
            raise ValueError(f"tolerance must be at least 1 second, got {self.tolerance_s}")
        if self.max_body_bytes < 1024:
            raise ValueError(f"body size limit must be at least 1024 bytes, got {self.max_body_bytes}")
        window_s = dedup_window_s(self.tolerance_s)
        if self.inbox_retention_s < window_s:
            raise ValueError(
                f"inbox retention must be at least {window_s / HOUR_S:g} hours (the dedup window: the sender's "
                f"longest retry span, 30 days, plus the {self.tolerance_s} s tolerance), got "
                f"{self.inbox_retention_s / HOUR_S:g} hours"
            )
        if self.cleaner_interval_s <= 0:
            raise ValueError(f"cleaner interval must be positive, got {self.cleaner_interval_s}")
        if self.cleaner_batch_size < 1 or self.cleaner_max_batches < 1:
            raise ValueError(
                f"cleaner batch size and batches per round must be at least 1, got {self.cleaner_batch_size} "
                f"and {self.cleaner_max_batches}"
            )
        if self.commit_groups < 1 or self.commit_group_max < 1:
            raise ValueError(
                f"need at least one commit group of at least one delivery, got {self.commit_groups} and "
                f"{self.commit_group_max}"
            )
        if not 1 <= self.pool_min_size <= self.pool_max_size:
            raise ValueError(
                f"need 1 <= pool_min_size <= pool_max_size, got {self.pool_min_size} and {self.pool_max_size}"
            )
