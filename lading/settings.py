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
class DocumentSettings:
    """Reading manifests (admission) and documents given by URI (workers). See docs/large-batches.md."""

    roots: tuple[str, ...] = ()
    """Directories file:// manifests and documents may be read from (`--document-root`, repeatable;
    $LADING_DOCUMENT_ROOTS, separated by ':'), one subdirectory per namespace: a batch of namespace
    N reads only beneath `<root>/N/`. Empty: every file:// URI is refused, so a batch cannot make
    a worker read an arbitrary file of its container."""
    namespace_directories: tuple[tuple[str, str], ...] = ()
    """(namespace, directory) pairs: directories a namespace's batches may read beneath besides
    `<root>/<namespace>/`. `lading run` gives each batch the directory of the manifest named on
    its command line (the operator's own files); never filled from a batch or a manifest."""
    fetch_timeout_s: float = 60.0
    """Upper bound for fetching one document or one manifest's connection phase and each read; a
    shared volume or an object store that stalls longer is treated as unavailable (retried)."""
    manifest_timeout_s: float = 600.0
    """Upper bound for reading a whole manifest at admission: a million lines over a slow link."""
    max_redirects: int = 3
    """http(s) redirects followed per fetch, each to http(s) only and vetted like the first URL."""
    egress_allow: tuple[str, ...] = ()
    """CIDRs http(s) fetches may reach although they are not global addresses ($LADING_EGRESS_ALLOW,
    the same allow-list as webhook delivery). Empty: only global addresses, so a manifest cannot
    point a worker at the cloud metadata service or a cluster-internal service."""


@dataclasses.dataclass(frozen=True)
class RollingBatchSettings:
    """How single documents (the HTTP API, the queue intake) are grouped into rolling batches
    (`lading.intake`). See docs/operations.md, "Single documents and rolling batches"."""

    max_documents: int = 1000
    """Documents per rolling batch, as many as an inline ExtractionBatch may list: status and
    result listings stay the size of an ordinary batch."""
    open_s: float = 300.0
    """Seconds a rolling batch takes documents after it opened. Five minutes: a trickle of
    documents still lands in few batches, and a batch's status settles soon after its last one."""
    open_batches: int = 4
    """Open rolling batches per group at once. A batch's row is held from a document's append to
    its commit, so documents of one group sent at the same time append to different batches
    instead of waiting for each other's commits; sent one after another, they fill one batch."""
    lock_timeout_s: float = 5.0
    """Longest wait for another transaction holding the same idempotency key (then
    AcceptanceInProgress: HTTP 409) or the group's batch row, as acceptance of a batch waits."""

    def __post_init__(self) -> None:
        if self.max_documents < 1 or self.open_batches < 1:
            raise ValueError(f"a rolling batch needs room for a document and a group an open batch, got "
                             f"max_documents={self.max_documents}, open_batches={self.open_batches}")


@dataclasses.dataclass(frozen=True)
class WorkerProcessSettings:
    """Everything one worker process runs with (`lading worker` flags). Not the InferencePool's
    `spec.workers` (`lading.models.specs.WorkerSettings`: replicas and scaling of the Deployment)."""

    pool: str
    """The InferencePool (`namespace/name`) whose jobs this worker claims."""
    lease: LeaseSettings = dataclasses.field(default_factory=LeaseSettings)
    claimer: ClaimerSettings = dataclasses.field(default_factory=ClaimerSettings)
    reaper: ReaperSettings = dataclasses.field(default_factory=ReaperSettings)
    attempt: AttemptSettings = dataclasses.field(default_factory=AttemptSettings)
    documents: DocumentSettings = dataclasses.field(default_factory=DocumentSettings)
    shutdown_grace_s: float = 20.0
    """On SIGTERM: stop claiming, let in-flight attempts finish this long, then leave the rest
    to lease expiry. Below Kubernetes' default 30 s termination grace period."""


@dataclasses.dataclass(frozen=True)
class BrokerTopology:
    """Names and arguments of what Lading declares on RabbitMQ (lading/events/topology.py).

    Changing an argument of an existing queue makes the declaration fail (PRECONDITION_FAILED):
    RabbitMQ never changes a queue's arguments in place. See docs/events.md."""

    prefix: str = ""
    """Put in front of every name below, e.g. `staging.`; isolates several installations (or test
    runs) on one vhost."""
    exchange: str = "lading.events"
    """Durable topic exchange the relay publishes to; the routing key is the event type."""
    ingress_queue: str = "lading.ingress"
    """Quorum queue the ingress consumer reads."""
    dead_letter_exchange: str = "lading.dlx"
    """Fanout exchange the ingress queue dead-letters to (rejected or over the delivery limit)."""
    dead_letter_queue: str = "lading.ingress.dead"
    """Quorum queue holding dead letters until an operator looks at them."""
    ingress_bindings: tuple[str, ...] = ("document.submitted.v1", "batch.accepted.v1", "extraction.*.v1")
    """Routing keys bound to the ingress queue: documents sent to the queue intake, and Lading's own
    events (recorded in the inbox, the durable event log). An event type matching none of them is
    returned to the relay as unroutable and stays unpublished, which shows as outbox age: add a binding."""
    delivery_limit: int = 20
    """`x-delivery-limit`: deliveries of one message before it is dead-lettered. RabbitMQ 3.10 has
    no default (unlimited), so a poison message would loop forever; 20 rides out consumer restarts."""
    max_length: int = 100_000
    """`x-max-length` of both queues. With `x-overflow: reject-publish` a full queue nacks the relay's
    publishes, and the events wait in the outbox (durable) instead of being dropped."""

    def name(self, base: str) -> str:
        return f"{self.prefix}{base}"


@dataclasses.dataclass(frozen=True)
class RelaySettings:
    batch_size: int = 100
    """Events claimed and published per round. Confirms are awaited for the whole batch at once,
    so this is also the bound on unconfirmed publishes in flight."""
    claim_ttl_s: float = 30.0
    """How long a claimed batch belongs to one relay. A relay that dies mid-batch delays those
    events by at most this long; it must exceed `publish_timeout_s`."""
    poll_interval_s: float = 0.5
    """Sleep between rounds that found fewer events than a full batch."""
    publish_timeout_s: float = 10.0
    """Wait this long for a batch's confirms; the unconfirmed events are then released and the
    connection is rebuilt (a confirm that never comes usually means a dead connection)."""
    refused_retry_s: float = 5.0
    """A nacked or returned (unroutable) event is retried after this long, not at once."""
    reconnect_base_s: float = 0.5
    """First wait after the broker went away (full jitter, doubling)."""
    reconnect_cap_s: float = 30.0
    """Longest wait between reconnection attempts."""


@dataclasses.dataclass(frozen=True)
class IngressSettings:
    prefetch: int = 32
    """Unacked messages the broker sends ahead to one consumer (basic.qos). Bounds memory and the
    redeliveries after a consumer crash."""
    db_concurrency: int = 2
    """Inbox transactions run at once; the rest of the prefetched messages wait their turn. Keeps a
    worker's shared connection pool free for heartbeats and claims."""
    retry_base_s: float = 0.5
    """First wait when the database refuses an inbox transaction (full jitter, doubling). The
    message stays unacked meanwhile, so its delivery count does not grow."""
    retry_cap_s: float = 30.0
    """Longest wait between inbox transaction attempts."""
    reconnect_base_s: float = 0.5
    """First wait after the broker went away (full jitter, doubling)."""
    reconnect_cap_s: float = 30.0
    """Longest wait between reconnection attempts."""


@dataclasses.dataclass(frozen=True)
class EventSettings:
    """The outbox relay and the ingress consumer. Both run only when a broker URL is given; the
    URL carries a password, so it is passed beside these settings, never inside them."""

    topology: BrokerTopology = dataclasses.field(default_factory=BrokerTopology)
    relay: RelaySettings = dataclasses.field(default_factory=RelaySettings)
    ingress: IngressSettings = dataclasses.field(default_factory=IngressSettings)


@dataclasses.dataclass(frozen=True)
class DeliverySettings:
    """The delivery dispatcher (worker/lading_worker/dispatching.py). Retry budgets come from each
    DeliveryEndpoint's `retryBudget`; the rest is here."""

    concurrency: int = 64
    """Deliveries claimed and in flight at once per dispatcher. Requests are coroutines; the
    budget is the receivers' patience, not ours."""
    lanes: int = 2
    """Claim/send/record loops sharing `concurrency`: while one lane records its round's outcomes
    and claims again, the others' requests are in flight, so the receiver is never left idle
    between rounds. One lane is strictly round by round."""
    poll_interval_s: float = 0.5
    """Sleep between polls that found nothing due: the delay of a new delivery at worst."""
    connect_timeout_s: float = 5.0
    """Connecting (TCP and TLS). A connect that fails never reached the receiver: a safe retry."""
    read_timeout_s: float = 10.0
    """Waiting for the receiver's answer, and between chunks of it. A time-out after the request
    was sent leaves the outcome unknown."""
    total_timeout_s: float = 20.0
    """Upper bound of one attempt. The lease is longer (see lease_ttl_s)."""
    lease_ttl_s: float = 60.0
    """How long a claim is owned. Longer than total_timeout_s plus a slow commit, so a live
    dispatcher always records its own outcome; a dead one's deliveries are reaped after this."""
    max_body_bytes: int = 1024 * 1024
    """A body larger than this is not sent (FAILED_TERMINAL BodyTooLarge): one invoice is kilobytes."""
    max_response_bytes: int = 64 * 1024
    """At most this much of an answer is read; the rest is dropped with the connection."""
    backoff_base_s: float = 2.0
    """First retry waits up to this long (full jitter, lading.jobs.retry)."""
    backoff_cap_s: float = 600.0
    """No retry waits longer, unless the receiver's Retry-After asks for longer."""
    breaker_threshold: int = 5
    """Consecutive failed attempts (5xx, 429, 401/403, network) that open an endpoint's breaker."""
    breaker_cooldown_s: float = 10.0
    """First open period; each further opening without a success doubles it, up to breaker_cooldown_cap_s."""
    breaker_cooldown_cap_s: float = 300.0
    """Longest open period: a recovered ERP is probed at least this often."""
    auth_failing_threshold: int = 3
    """Consecutive 401/403 answers that set the endpoint's AuthFailing condition."""
    reap_interval_s: float = 5.0
    """How often in-flight deliveries whose lease ran out are looked for."""
    health_interval_s: float = 5.0
    """How often per-endpoint counts (UNKNOWN_EXTERNAL, waiting for a secret) refresh the metrics."""
