"""
Settings, grouped by the loop that reads them. Every field says its unit and why its
default was chosen. Processes build these from flags/environment; tests pass them in.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class LeaseSettings:
    ttl_s: float = 30.0
    """How long a claim is owned without a heartbeat. Long enough to ride out a GC pause or a
    slow database round trip; short enough that a killed worker's job is rescued within a minute."""
    heartbeat_interval_s: float = 10.0
    """How often the owner extends its leases: a third of the TTL, so two heartbeats can be lost."""


@dataclasses.dataclass(frozen=True)
class ClaimerSettings:
    concurrency: int = 32
    """Attempts in flight in one worker process. Hundreds work: attempts are coroutines."""
    batch_size: int = 50
    """Claim up to this many jobs per round trip. Round trips decide throughput."""
    prefetch: int = 0
    """Jobs claimed ahead of free slots. A slot that frees then starts its next job at once
    instead of after a claim round trip, which matters when many calls end together. Each
    prefetched job holds a heartbeated lease without running; on shutdown it is released
    unstarted (its attempt given back). 0 claims only for free slots, which spreads a small
    backlog most evenly across replicas."""
    poll_interval_s: float = 1.0
    """Sleep between empty polls; LISTEN/NOTIFY on new work wakes the claimer earlier."""
    commit_batch_size: int = 100
    """Completions committed together in one transaction (group commit)."""
    commit_linger_s: float = 0.002
    """How long the committer waits for more completions before it flushes a batch."""


@dataclasses.dataclass(frozen=True)
class ReaperSettings:
    interval_s: float = 5.0
    """How often to look for expired leases and expired deadlines. The rescue time of a
    killed worker is at most lease TTL + this interval + the first retry backoff."""
    batch_size: int = 500
    """Jobs rescued per transaction; keeps the reaper's transactions short."""


@dataclasses.dataclass(frozen=True)
class AttemptSettings:
    timeout_s: float = 120.0
    """Upper bound for one model call. A retry is only scheduled if a whole attempt still
    fits before the job's deadline."""
    max_attempts: int = 5
    """Attempts per job, the first included, for jobs accepted without a budget of their own.
    Each job stores its budget (`extraction_jobs.max_attempts`) and the retry policy uses that.
    Counters are never reset."""
    backoff_base_s: float = 2.0
    """First retry waits up to this long (full jitter)."""
    backoff_cap_s: float = 300.0
    """No retry waits longer than this, unless the provider's Retry-After asks for longer."""


@dataclasses.dataclass(frozen=True)
class WorkerSettings:
    pool: str
    """The InferencePool (`namespace/name`) whose jobs this worker claims."""
    lease: LeaseSettings = dataclasses.field(default_factory=LeaseSettings)
    claimer: ClaimerSettings = dataclasses.field(default_factory=ClaimerSettings)
    reaper: ReaperSettings = dataclasses.field(default_factory=ReaperSettings)
    attempt: AttemptSettings = dataclasses.field(default_factory=AttemptSettings)
    shutdown_grace_s: float = 20.0
    """On SIGTERM: stop claiming, let in-flight attempts finish this long, then leave the rest
    to lease expiry. Below Kubernetes' default 30 s termination grace period."""
