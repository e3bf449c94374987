"""
Settings of the operator process, with the reason for each default. `lading operator` builds
them from flags; tests pass them in (with short intervals).
"""

from __future__ import annotations

import dataclasses

from lading_operator import rendering

POOL_NAMESPACE_DEFAULT = "lading-system"
PEERING_NAME_DEFAULT = "lading"
"""The ClusterKopfPeering the replicas share (`lading operator --peering-name`)."""


MAX_CONCURRENT_MANIFESTS_DEFAULT = 4
"""A few manifests at once: enough to keep a link busy, few enough that the spools stay small."""


@dataclasses.dataclass(frozen=True)
class OperatorSettings:
    database_url: str
    kubeconfig: str | None = None
    """None: in-cluster service account, else $KUBECONFIG / ~/.kube/config."""
    namespaces: tuple[str, ...] = ()
    """Namespaces whose batches, pools and endpoints are served; empty: cluster-wide."""
    pool_namespaces: tuple[str, ...] = (POOL_NAMESPACE_DEFAULT,)
    """The platform namespaces where InferencePools may live. A pool anywhere else is refused
    (Ready=False, PoolNamespaceNotAllowed): nothing is rendered for it, no signing secret is mirrored
    there, and it is not registered for batches. Tenants own their namespaces; a pool's namespace
    receives every endpoint's signing secret, so it must be one only the platform team controls.
    Default: `lading-system`, where the chart installs the operator (the chart passes its release
    namespace)."""
    http: tuple[str, int] | None = None
    """Where /metrics, /healthz and /readyz listen; None: not served."""
    standalone: bool = True
    """One operator replica, no kopf peering. False: replicas coordinate through peering objects."""
    peering_name: str = PEERING_NAME_DEFAULT
    """The ClusterKopfPeering replicas coordinate through (with `standalone` False); it must exist."""
    peering_lifetime_s: int = 60
    """How long a replica's peering record stays valid without a refresh: a standby takes over this
    long after the active replica was killed (kopf's default; a clean stop hands over at once)."""
    render: rendering.OperatorConfig = dataclasses.field(default_factory=rendering.OperatorConfig)
    """What the operator renders into pool objects (worker image, database Secret, ...)."""
    vllm_metrics_override: bool = False
    """Honour a pool's `lading.dev/vllm-metrics-url` annotation (`--allow-vllm-metrics-override`).
    Off: the pool's own Service is scraped, so whoever may annotate a pool cannot make the operator
    send requests elsewhere. On: for an operator outside the cluster; the URL is still vetted."""
    egress_allow: tuple[str, ...] = ()
    """CIDRs the operator's own requests (an overriding vLLM metrics URL) may reach although they
    are not global ($LADING_EGRESS_ALLOW, the delivery allow-list)."""

    status_interval_s: float = 60.0
    """A running batch's counts and ages are written at most this often (a change of phase or of a
    condition is written at once): at most one status write per batch per minute, whatever the
    workers do, so API traffic stays bounded by the number of batches, not by the number of jobs."""
    idle_interval_s: float = 300.0
    """A settled, suspended or waiting batch is looked at this often as a safety net; the events that
    matter (its own changes, room in its tenant's quota) wake it at once."""
    quota_interval_s: float = 30.0
    """TenantQuota and DeliveryEndpoint status refresh (usage counts, endpoint health)."""
    pool_interval_s: float = 15.0
    """InferencePool reconcile: drift of owned objects and the scaling decision, like an HPA's period."""
    retry_initial_s: float = 1.0
    """First retry after a database or API error; doubles up to retry_max_s."""
    retry_max_s: float = 60.0
    watch_server_timeout_s: int = 300
    """The API server ends each watch after this long and kopf re-lists: stale watches heal."""
    db_pool_max: int = 10
    """Connections the operator holds; admissions and status reads are short."""
    max_concurrent_manifests: int = MAX_CONCURRENT_MANIFESTS_DEFAULT
    """Document manifests of large batches read at once. A read may take minutes (up to 1 GiB, within
    the manifest timeout) and holds no database connection; the bound keeps the operator's network,
    disk and memory for the rest of its work. A batch beyond it waits, Pending, for a slot."""
