"""
The receiver's settings, with the reason for each default. Signing secrets are not here:
they are parsed once into `lading.webhooks.signing.SigningKey`s (whose repr hides them) and
passed next to the settings, so printing settings can never print a secret.
"""

from __future__ import annotations

import dataclasses

from lading.webhooks import signing

PATH = "/webhooks/lading"
"""Where deliveries are POSTed; liveness and readiness are under it, metrics at `/metrics`."""


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
    """At most this many deliveries are in a transaction at once; more wait for a connection."""
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

    def __post_init__(self) -> None:
        if self.tolerance_s < 1:
            raise ValueError(f"tolerance must be at least 1 second, got {self.tolerance_s}")
        if self.max_body_bytes < 1024:
            raise ValueError(f"body size limit must be at least 1024 bytes, got {self.max_body_bytes}")
        if not 1 <= self.pool_min_size <= self.pool_max_size:
            raise ValueError(
                f"need 1 <= pool_min_size <= pool_max_size, got {self.pool_min_size} and {self.pool_max_size}"
            )
