"""
Settings of the HTTP intake (`lading api` flags).
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class ApiSettings:
    max_body_bytes: int = 1024 * 1024
    """Largest request body; 413 above, before the body is read. An inline batch holds at most
    512 KiB of text (the ExtractionBatch's own bound) plus keys and JSON escaping: 1 MiB fits it."""
    pool_max_size: int = 10
    """Database connections for the work of requests. As many again hold the idempotency keys of
    batch POSTs in flight (a separate pool, so a request holding its key never waits for a
    connection that another request holding its key has); a document POST's key is kept in the
    transaction that accepts the document."""
    in_progress_wait_s: float = 0.2
    """How long a POST waits for an earlier request with the same Idempotency-Key to finish before
    answering 409: long enough that a client's immediate retry usually gets the replay."""
    unavailable_retry_after_s: int = 5
    """Retry-After of a 503 (database unreachable, acceptance saturated)."""
    running_retry_after_s: int = 5
    """Retry-After of `GET /v1/jobs/{id}` while the job runs or waits: when to look again."""
    drain_window_s: float = 300.0
    """How far back a tenant's drain rate is measured for the Retry-After of a 429."""
    retry_after_max_s: int = 3600
    """The longest Retry-After the intake gives; a tenant whose queue did not drain at all gets it."""
    results_page_default: int = 100
    results_page_max: int = 1000
    shutdown_grace_s: float = 10.0
    """Seconds requests in flight get to finish on SIGTERM."""
    token_cache_s: float = 1.0
    """How long a valid Lading token's lookup is reused (0: every request looks it up): a token
    revoked or expired stops working within this time."""

    def __post_init__(self) -> None:
        if self.max_body_bytes < 1024:
            raise ValueError(f"max body bytes must be at least 1024, got {self.max_body_bytes}")
        if self.pool_max_size < 1:
            raise ValueError(f"pool size must be at least 1, got {self.pool_max_size}")
        if not 0 <= self.token_cache_s <= 60:
            raise ValueError(f"token cache must be 0 to 60 seconds, got {self.token_cache_s}")
        if self.in_progress_wait_s <= 0:
            raise ValueError(f"in-progress wait must be positive, got {self.in_progress_wait_s}")
