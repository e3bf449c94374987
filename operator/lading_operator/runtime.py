"""
What every handler of one operator process shares: the database pool, the API client, the
settings, and the wake-ups that make the reconcilers event-driven.

Wake-ups. Each ExtractionBatch and InferencePool has one long-lived reconcile loop (a kopf
daemon) that sleeps on an `asyncio.Event` with a timeout. The event is set by:
- a watch event of the object itself that changed what the loop acts on (its generation, i.e. its
  spec; its deletion): a kopf `on.event` handler, no API call, no persistence;
- room appearing in the tenant's quota (a batch of the tenant settled, was deleted, or shrank its
  queue; the TenantQuota changed) for batches waiting in the quota queue (`waiting`);
- a TenantQuota or InferencePool appearing, for batches waiting on a missing one;
- a change of an object a pool owns (drift), for that pool.
The timeout is only a safety net, so nothing polls tightly.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
from typing import Any

import asyncpg

from lading.ids import TenantName
from lading_operator import kube, settings

logger = logging.getLogger("lading.operator")

ObjectKey = tuple[str, str, str]
"""(kind, namespace or '', name)."""

ANY_TENANT = TenantName("")
"""Waiting key of batches that wait for something other than room (a TenantQuota or pool to exist)."""


BUDGET_SNAPSHOT_MAX_AGE_S = 5.0
"""How long a tenant's counted queue may be reused before admission counts again."""


@dataclasses.dataclass
class TenantBudget:
    """What this operator knows of a tenant's queue, so admissions can run concurrently and still
    never overshoot maxQueuedJobs together.

    `known_queued` is an upper bound: a count from the database plus every job admitted here since
    (jobs that finished since only make the true number smaller). `reserved` is the jobs of
    admissions running now. A batch may start admitting concurrently while
    known_queued + reserved + its jobs <= maxQueuedJobs; otherwise it counts again and, if still no
    room, waits for the running admissions to finish and lets the core decide (its own quota check
    runs in every admission anyway).
    """

    lock: asyncio.Lock = dataclasses.field(default_factory=asyncio.Lock)
    known_queued: int | None = None
    counted_at: float = 0.0
    reserved: int = 0
    idle: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.idle.set()

    def reserve(self, jobs: int) -> None:
        self.reserved += jobs
        self.idle.clear()

    def release(self, jobs: int, *, admitted: bool) -> None:
        self.reserved -= jobs
        if admitted and self.known_queued is not None:
            self.known_queued += jobs
        if self.reserved == 0:
            self.idle.set()


@dataclasses.dataclass
class Runtime:
    settings: settings.OperatorSettings
    db: asyncpg.Pool
    api: kube.Client
    cluster: kube.Cluster
    has_deliveries: bool = False
    wakeups: dict[ObjectKey, asyncio.Event] = dataclasses.field(default_factory=dict)
    tokens: dict[ObjectKey, Any] = dataclasses.field(default_factory=dict)
    waiting: dict[TenantName, set[ObjectKey]] = dataclasses.field(default_factory=lambda: collections.defaultdict(set))
    budgets: dict[TenantName, TenantBudget] = dataclasses.field(
        default_factory=lambda: collections.defaultdict(TenantBudget)
    )
    endpoint_secrets: dict[str, Any] = dataclasses.field(default_factory=dict)
    """DeliveryEndpoint 'namespace/name' -> rendering.EndpointSecret (names only, never values)."""
    mirrored: dict[tuple[str, str], str] = dataclasses.field(default_factory=dict)
    """(pool namespace, DeliveryEndpoint 'namespace/name') -> sha256 of the signing secret mirrored there
    (mirroring.py; a digest, never a value)."""
    owned: dict[ObjectKey, dict[str, Any]] = dataclasses.field(default_factory=dict)
    """(plural, namespace, name) -> the latest body of a Deployment or Service Lading manages, from kopf's
    watch and from the operator's own writes (`remember`): what a pool step reads instead of a GET."""
    manifest_downloads: asyncio.Semaphore = dataclasses.field(init=False)
    """Permits to read a batch's document manifest (settings.max_concurrent_manifests)."""

    def __post_init__(self) -> None:
        self.manifest_downloads = asyncio.Semaphore(self.settings.max_concurrent_manifests)

    def remember(self, plural: str, body: Any) -> None:
        """Keep `body` as the latest of its object, unless a newer one is already kept (resourceVersion)."""
        meta = body.get("metadata") or {}
        key = (plural, str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        kept = self.owned.get(key)
        kept_version = (kept or {}).get("metadata", {}).get("resourceVersion")
        if kept is not None and _newer(kept_version, meta.get("resourceVersion")):
            return
        self.owned[key] = dict(body)

    def forget(self, plural: str, namespace: str, name: str) -> None:
        self.owned.pop((plural, namespace, name), None)

    def wakeup(self, key: ObjectKey) -> asyncio.Event:
        return self.wakeups.setdefault(key, asyncio.Event())

    def wake_on_change(self, key: ObjectKey, token: Any) -> None:
        """Wake `key` when `token` (what the object's reconciler acts on: generation, ...) changed.

        The reconciler's own status writes also arrive as watch events; they do not change the
        token, so they do not wake it again."""
        if self.tokens.get(key) != token:
            self.tokens[key] = token
            self.wake(key)

    def wake(self, key: ObjectKey) -> None:
        event = self.wakeups.get(key)
        if event is not None:
            event.set()

    def wake_namespace(self, kind: str, namespace: str) -> None:
        """Wake every loop of `kind` in `namespace` (e.g. pools, when an endpoint's signing Secret changed)."""
        for key in list(self.wakeups):
            if key[0] == kind and key[1] == namespace:
                self.wake(key)

    def wake_kind(self, kind: str) -> None:
        """Wake every loop of `kind` (e.g. pools of all namespaces, when an endpoint's mirrors changed)."""
        for key in list(self.wakeups):
            if key[0] == kind:
                self.wake(key)

    def wait_in_queue(self, key: ObjectKey, tenant: TenantName) -> None:
        for keys in self.waiting.values():
            keys.discard(key)
        self.waiting[tenant].add(key)

    def leave_queue(self, key: ObjectKey) -> None:
        for keys in self.waiting.values():
            keys.discard(key)

    def room_in(self, tenant: TenantName) -> None:
        """Room appeared in `tenant`'s quota: wake the batches waiting for it."""
        for key in list(self.waiting.get(tenant, ())):
            self.wake(key)

    def something_appeared(self) -> None:
        """A TenantQuota or pool appeared or changed: wake every waiting batch (each re-checks)."""
        for keys in list(self.waiting.values()):
            for key in list(keys):
                self.wake(key)


def _newer(kept: Any, incoming: Any) -> bool:
    """Whether the kept resourceVersion is newer than the incoming one. resourceVersions are opaque; the
    API server's are etcd revisions (integers), compared as such; anything else counts as not newer."""
    return str(kept).isdigit() and str(incoming).isdigit() and int(kept) > int(incoming)
