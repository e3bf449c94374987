"""
The Kubernetes objects an InferencePool owns, rendered as plain dicts (applied whole with
server-side apply by pool_steps/owned.py).

    InferencePool ns/qwen (provider vllm)
      ├── Deployment  ns/qwen-vllm       vLLM OpenAI server, `vllm serve MODEL ...`, port 8000
      ├── Service     ns/qwen-vllm       ClusterIP 8000 -> the vLLM pods; workers call
      │                                  http://qwen-vllm.ns.svc:8000/v1 (`vllm_endpoint_url`)
      ├── Deployment  ns/qwen-worker     `lading worker --pool ns/qwen`, sized by the scaler
      └── ScaledObject ns/qwen-worker    only with workers.scaling: keda (KEDA sizes the workers)
          TriggerAuthentication ns/qwen-worker   the ScaledObject's PostgreSQL connection

Every function here is pure: a spec (and the operator's configuration) in, a dict out, no API calls,
no clock, no randomness. The same pool always renders the same bytes, so the hash of a rendering
(`drift.applied_hash`, stamped on the applied object) says whether a live object was applied from it.

Owned, and what that means for the apply:
- every object carries an ownerReference to its InferencePool (controller, blockOwnerDeletion): the
  garbage collector deletes them with the pool;
- labels `app.kubernetes.io/{name,instance,component,managed-by}` and `lading.dev/pool`;
- the pod template, selector, ports and every field we render are ours (field manager
  `lading-operator`): a `kubectl edit` of them is reverted, and a field we stop rendering is removed;
  fields we do not render (defaults the API server adds, annotations other controllers add) are left
  alone;
- a Deployment's `spec.replicas` belongs to the scaler, not to the template (`replicas=None`). With
  `scaling: keda`, KEDA owns the worker replicas and the operator never writes them.

Names are deterministic DNS-1035 labels of at most 63 characters (`<pool>-vllm`, `<pool>-worker`),
shortened with a hash suffix when the pool's name is long, so two long pool names never collide.

Secrets: rendered objects only ever *reference* Secrets (`secretKeyRef`, projected Secret volumes,
KEDA `secretTargetRef`); no value is ever read or written here.

The worker pod runs `lading worker --pool NAMESPACE/NAME --concurrency N --processes P --http 0.0.0.0:8080`
(P worker processes share the pod's N attempts; `worker_processes`) with:
    DATABASE_URL               secretKeyRef OperatorConfig.database_secret
    LADING_PROVIDER_API_KEY    secretKeyRef spec.endpoint.apiKeySecretRef (external pools with a key)
    LADING_PROVIDER_URL        the vLLM Service's URL (vllm pools), see vllm_endpoint_url
    LADING_AMQP_URL            secretKeyRef OperatorConfig.amqp_url_secret (optional)
    LADING_EGRESS_ALLOW        OperatorConfig.egress_allow, comma-separated (optional)
    LADING_ENDPOINT_SECRETS_DIR /etc/lading/endpoint-secrets, a projected Secret volume holding one
                               file `<namespace>.<name>` per DeliveryEndpoint (OperatorConfig.endpoint_secrets)
    ... and OperatorConfig.extra_env after them
plus the cleaner's flags that are set (WORKER_CLEANER_FLAGS), one
`--document-root` per OperatorConfig.document_roots, the extra volumes and mounts, image pull secrets,
node selector, tolerations, labels and annotations of OperatorConfig (`lading operator --worker-*`),
and probes on /healthz (liveness) and /readyz (readiness) of that port; /metrics is scraped there.
A worker run by hand is the same command with the same variables.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Mapping
from typing import Any

from lading.db import queries
from lading.delivery import egress
from lading.delivery import secrets as delivery_secrets
from lading.models import specs

VLLM_PORT = 8000
"""The port `vllm serve` listens on, in the pod and on the Service."""
WORKER_HTTP_PORT_DEFAULT = 8080
"""The worker's /metrics, /healthz and /readyz."""
WORKER_COMMAND_DEFAULT: tuple[str, ...] = ("lading", "worker")
"""The console script of the Lading image; `python -m lading_worker` works too."""
WORKER_IMAGE_DEFAULT = "ghcr.io/lading-dev/lading:0.1.0"
"""Pinned like the vLLM image: a new image is a deliberate rollout."""
WORKER_GRACE_S_DEFAULT = 20
"""The worker's own drain period (`--grace`, lading.settings.WorkerProcessSettings.shutdown_grace_s)."""
WORKER_PROCESSES_MAX = 64
WORKER_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
"""Worker processes per pod, at most (`lading worker --processes`); each holds its own connections."""
WORKER_TERMINATION_EXTRA_S = 10
"""Kubernetes' grace period is the worker's drain plus this, so SIGKILL never cuts a drain short."""
VLLM_STARTUP_BUDGET_S = 1800
"""Time a vLLM pod gets to download and load its model before the startup probe gives up: half an
hour covers a 70B download on a slow link; after it, the pod is restarted (and says so in events)."""
VLLM_CACHE_MOUNT = "/models"
"""Where the model cache volume is mounted; HF_HOME points below it."""
ENDPOINT_SECRETS_MOUNT = "/etc/lading/endpoint-secrets"
"""Where the projected signing-secret volume is mounted in the worker."""
GPU_RESOURCE = "nvidia.com/gpu"
GPU_TOLERATION_DEFAULT: dict[str, str] = {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}
"""The taint GPU node pools usually carry (GKE, EKS, the NVIDIA GPU operator)."""
NAME_MAX = 63
"""DNS-1035 label: a Service name must be one, and Deployment names are kept to it as well."""
ENDPOINT_SECRETS_MAX = 256
"""Signing secrets projected into one worker pod (one per DeliveryEndpoint the pool delivers to)."""
FIELD_MANAGER = "lading-operator"
"""The field manager of the operator's writes: server-side apply of owned objects (kube.py)."""
WORKER_RESERVED_VOLUMES = frozenset({"tmp", "endpoint-secrets"})
"""Volume names the worker pod renders itself; an extra volume may not take them."""

WORKER_CLEANER_FLAGS: tuple[str, ...] = (
    "--cleaner-interval",
    "--cleaner-batch",
    "--cleaner-max-batches",
    "--retain-published-events-hours",
    "--retain-inbox-hours",
    "--retain-quarantine-hours",
    "--retain-delivered-hours",
    "--retain-stale-completions-hours",
    "--retain-limiter-hours",
    "--retain-idempotency-keys-hours",
    "--retain-gpu-intervals-hours",
)
"""The `lading worker` flags of its cleaner (retentions in hours, the pace of its rounds) that the
operator passes on (`OperatorConfig.worker_cleaner`). Only flags given are rendered: the worker keeps
its own defaults, and a worker Deployment changes only when a retention is changed. The worker
checks the values (e.g. the inbox's dedup floor) and refuses to start on a bad one."""

API_VERSION = specs.API_VERSION
KIND = specs.InferencePool.KIND

COMPONENT_VLLM = "vllm"
COMPONENT_WORKER = "worker"

LABEL_NAME = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_POOL = "lading.dev/pool"


@dataclasses.dataclass(frozen=True)
class SecretKeySelector:
    """One key of a Secret in the pool's namespace (rendered as `secretKeyRef`)."""

    name: str
    key: str


@dataclasses.dataclass(frozen=True)
class EndpointSecret:
    """A DeliveryEndpoint's signing secret, projected into the worker pod as `<namespace>.<name>`.

    The Secret must live in the pool's namespace (a pod can mount only its own namespace's Secrets):
    an endpoint of the pool's namespace is projected from its own Secret; for the others, the operator
    mirrors the signing secret there before rendering (`mirroring`: `lading-endpoint-<namespace>.<name>`).
    """

    endpoint: str
    """The DeliveryEndpoint as 'namespace/name'."""
    secret_name: str
    """Name of the Secret in the pool's namespace."""
    key: str
    """Key of that Secret holding the signing secret(s), one per line."""

    @property
    def file_name(self) -> str:
        namespace, _, name = self.endpoint.partition("/")
        return f"{namespace}.{name}"


@dataclasses.dataclass(frozen=True)
class OperatorConfig:
    """What the operator knows that an InferencePool does not: images, Secrets, cluster policy."""

    worker_image: str = WORKER_IMAGE_DEFAULT
    """Image of the worker Deployment (the Lading image)."""
    worker_command: tuple[str, ...] = WORKER_COMMAND_DEFAULT
    """Command of the worker container; the arguments (`--pool ...`) are rendered."""
    database_secret: SecretKeySelector = SecretKeySelector(name="lading-database", key="url")
    """Secret key holding the PostgreSQL URL, in every pool's namespace (the Helm chart creates it)."""
    amqp_url_secret: SecretKeySelector | None = None
    """Secret key holding the RabbitMQ URL (LADING_AMQP_URL). None: the worker runs without a broker."""
    egress_allow: tuple[str, ...] = ()
    """Address ranges (CIDRs, e.g. an in-cluster ERP's 10.20.0.0/16) that deliveries and document fetches may
    reach although private addresses are refused by default (LADING_EGRESS_ALLOW). Empty: unset."""
    endpoint_secrets: tuple[EndpointSecret, ...] = ()
    """Signing secrets projected into the worker pod. Empty: no volume, no LADING_ENDPOINT_SECRETS_DIR."""
    worker_http_port: int = WORKER_HTTP_PORT_DEFAULT
    """Port of the worker's /metrics, /healthz and /readyz."""
    worker_grace_s: int = WORKER_GRACE_S_DEFAULT
    """The worker's drain period (`--grace`)."""
    worker_resources: Mapping[str, Mapping[str, str]] = dataclasses.field(
        default_factory=lambda: {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}}
    )
    """Worker container resources. The worker waits on the model; it needs little CPU."""
    worker_log_level: str = "INFO"
    """The workers' log level (`LADING_LOG_LEVEL`), one of WORKER_LOG_LEVELS. INFO: a line per commit group
    and per attempt that did not end well (docs/operations.md); the CLI's own default, WARNING, hides them."""
    worker_processes: int | None = None
    """Worker processes per worker pod (`lading worker --processes`; a Python process computes on one core),
    sharing the pod's `--concurrency`. None: the whole CPUs of the worker container's CPU limit (else of its
    request), at least 1 (`worker_process_count`): a pod with a 2-CPU limit runs 2, the default 100m runs 1."""
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """Extra labels on every rendered object and pod (e.g. a team or cost centre)."""
    keda_database_secret: SecretKeySelector | None = None
    """Secret key with the PostgreSQL connection string KEDA's postgresql scaler uses (a read-only role
    is enough). None: database_secret."""
    keda_prometheus_url: str | None = None
    """Prometheus that scrapes the vLLM pods, for KEDA's headroom trigger. None: no headroom trigger."""
    image_pull_secrets: tuple[str, ...] = ()
    """Secrets (in each pool's namespace) the worker pods pull their image with."""
    annotations: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """Extra annotations on the worker Deployment and its pods (e.g. a service mesh's opt-out)."""
    node_selector: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """Node labels worker pods must run on (workers need no GPU: keep them off GPU nodes)."""
    tolerations: tuple[Mapping[str, Any], ...] = ()
    """Tolerations of the worker pods (Kubernetes `Toleration` objects)."""
    extra_env: tuple[Mapping[str, Any], ...] = ()
    """More environment variables of the worker container (Kubernetes `EnvVar` objects), after the
    rendered ones; a name the operator renders itself is refused."""
    volumes: tuple[Mapping[str, Any], ...] = ()
    """More volumes of the worker pod (Kubernetes `Volume` objects), e.g. a document share."""
    volume_mounts: tuple[Mapping[str, Any], ...] = ()
    """Mounts of those volumes in the worker container (Kubernetes `VolumeMount` objects)."""
    document_roots: tuple[str, ...] = ()
    """Directories (in the worker container, usually mounts of `volumes`) under which batches of
    namespace NS read `file://` documents from DIR/NS/ (`lading worker --document-root`)."""
    worker_cleaner: Mapping[str, float] = dataclasses.field(default_factory=dict)
    """The workers' cleaner flags that are set, by `lading worker` flag (WORKER_CLEANER_FLAGS), e.g.
    {'--retain-delivered-hours': 2160}. Empty: the worker's defaults (docs/operations.md)."""

    def __post_init__(self) -> None:
        """Refuse a configuration that would render objects the API server rejects, naming the setting."""
        if not self.worker_command:
            raise ValueError("worker_command must not be empty")
        if not re.fullmatch(specs.IMAGE_PATTERN, self.worker_image) or len(self.worker_image) > 512:
            raise ValueError(f"worker_image {self.worker_image!r} is not an image reference")
        if not 1 <= self.worker_http_port <= 65535:
            raise ValueError(f"worker_http_port {self.worker_http_port} is not a TCP port")
        if not 0 <= self.worker_grace_s <= 3600:
            raise ValueError(f"worker_grace_s {self.worker_grace_s} must be between 0 and 3600")
        if self.worker_log_level not in WORKER_LOG_LEVELS:
            levels = ", ".join(WORKER_LOG_LEVELS)
            raise ValueError(f"worker_log_level {self.worker_log_level!r} must be one of {levels}")
        if self.worker_processes is not None and not 1 <= self.worker_processes <= WORKER_PROCESSES_MAX:
            raise ValueError(f"worker_processes {self.worker_processes} must be between 1 and {WORKER_PROCESSES_MAX}")
        worker_process_count(self)  # a CPU quantity that does not parse is named here, not in a pod
        for key, value in (*self.labels.items(), *self.node_selector.items()):
            if not re.fullmatch(specs.LABEL_KEY_PATTERN, key) or not re.fullmatch(specs.LABEL_VALUE_PATTERN, value):
                raise ValueError(f"label {key}={value!r} is not a valid Kubernetes label")
        for key in self.annotations:
            if not re.fullmatch(specs.LABEL_KEY_PATTERN, key):
                raise ValueError(f"annotation key {key!r} is not a valid Kubernetes annotation key")
        for name in self.image_pull_secrets:
            if not re.fullmatch(specs.DNS_SUBDOMAIN_PATTERN, name):
                raise ValueError(f"image pull secret {name!r} is not a Secret name")
        if self.egress_allow:
            egress.parse_cidrs(self.egress_allow)  # a ValueError names the bad range before a pod crash-loops on it
        self._check_pod_parts()
        for flag, number in self.worker_cleaner.items():
            if flag not in WORKER_CLEANER_FLAGS or not number > 0:
                raise ValueError(f"worker cleaner {flag} {number!r}: a positive number for one of the flags "
                                 f"{', '.join(WORKER_CLEANER_FLAGS)}")
        for item in self.endpoint_secrets:
            if not re.fullmatch(specs.POOL_KEY_PATTERN, item.endpoint):
                raise ValueError(f"endpoint secret for {item.endpoint!r}: the endpoint must be 'namespace/name'")
            if not re.fullmatch(specs.DNS_SUBDOMAIN_PATTERN, item.secret_name):
                raise ValueError(f"endpoint secret name {item.secret_name!r} is not a Secret name")
            if not re.fullmatch(specs.SECRET_KEY_PATTERN, item.key):
                raise ValueError(f"endpoint secret key {item.key!r} is not a Secret key")
        refs = [self.database_secret, self.amqp_url_secret, self.keda_database_secret]
        for ref in (r for r in refs if r is not None):
            if not re.fullmatch(specs.DNS_SUBDOMAIN_PATTERN, ref.name) or not re.fullmatch(
                specs.SECRET_KEY_PATTERN, ref.key
            ):
                raise ValueError(f"Secret reference {ref.name}/{ref.key} is not a Secret name and key")


    def _check_pod_parts(self) -> None:
        rendered_env = {"DATABASE_URL", "LADING_LOG_FORMAT", "LADING_LOG_LEVEL", "LADING_PROVIDER_API_KEY",
                        "LADING_PROVIDER_URL", "LADING_AMQP_URL", egress.ENV_VAR, delivery_secrets.ENV_VAR}  # fmt: skip
        for kind, items in (("env variable", self.extra_env), ("volume", self.volumes),
                            ("volume mount", self.volume_mounts), ("toleration", self.tolerations)):  # fmt: skip
            for item in items:
                if not isinstance(item, Mapping) or (kind != "toleration" and not item.get("name")):
                    raise ValueError(f"worker {kind} {item!r} is not an object with a name")
        for variable in self.extra_env:
            if variable["name"] in rendered_env:
                raise ValueError(f"worker env variable {variable['name']} is set by the operator; not overridable")
        volume_names = [volume["name"] for volume in self.volumes]
        for name in volume_names:
            if name in WORKER_RESERVED_VOLUMES or volume_names.count(name) > 1:
                raise ValueError(f"worker volume name {name!r} is taken (the operator's own, or given twice)")
        for mount in self.volume_mounts:
            if mount["name"] not in volume_names or not str(mount.get("mountPath", "")).startswith("/"):
                raise ValueError(f"worker volume mount {mount!r} needs a mountPath and one of volumes {volume_names}")
        for root in self.document_roots:
            if not root.startswith("/"):
                raise ValueError(f"document root {root!r} must be an absolute path in the worker container")


# --- Names and labels.

_INVALID = re.compile(r"[^a-z0-9-]+")


def _short_hash(text: str, length: int = 8) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:length]


def _bounded(text: str, *, limit: int, seed: str) -> str:
    """`text` if it fits, else a prefix of it plus '-' and a hash of `seed`: distinct seeds stay distinct."""
    if len(text) <= limit:
        return text
    suffix = _short_hash(seed)
    return f"{text[: limit - len(suffix) - 1].rstrip('-.')}-{suffix}"


def object_name(pool: specs.InferencePool, component: str) -> str:
    """`<pool>-<component>` as a DNS-1035 label (starts with a letter, <= 63 characters)."""
    base = _INVALID.sub("-", pool.name.lower()).strip("-")
    if not base or not base[0].isalpha():
        base = f"p-{base}"
    return _bounded(f"{base}-{component}", limit=NAME_MAX, seed=f"{pool.name}/{component}")


def label_value(text: str) -> str:
    """A label value (<= 63, alphanumeric ends) naming `text`; long ones get a hash suffix."""
    value = re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-._")
    return _bounded(value, limit=63, seed=text).strip("-._") or _short_hash(text)


def selector_labels(pool: specs.InferencePool, component: str) -> dict[str, str]:
    """The labels a Deployment selects its pods by; never changes for a given pool (selectors are immutable)."""
    return {
        LABEL_NAME: "lading",
        LABEL_INSTANCE: label_value(pool.name),
        LABEL_COMPONENT: component,
    }


def labels(pool: specs.InferencePool, component: str, config: OperatorConfig | None = None) -> dict[str, str]:
    extra = dict(config.labels) if config is not None else {}
    return {
        **extra,
        **selector_labels(pool, component),
        LABEL_MANAGED_BY: "lading",
        LABEL_POOL: label_value(pool.name),
    }


def owner_reference(pool: specs.InferencePool, *, uid: str) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": pool.name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _namespace(pool: specs.InferencePool) -> str:
    if pool.namespace is None:
        raise ValueError(f"InferencePool {pool.name} has no namespace; owned objects live in the pool's namespace")
    return pool.namespace


def _metadata(
        pool: specs.InferencePool,
        component: str,
        *,
        uid: str,
        config: OperatorConfig | None,
        name: str | None = None,
) -> dict[str, Any]:
    return {
        "name": name or object_name(pool, component),
        "namespace": _namespace(pool),
        "labels": labels(pool, component, config),
        "ownerReferences": [owner_reference(pool, uid=uid)],
    }


def pool_key(pool: specs.InferencePool) -> str:
    """'namespace/name': the pool as the database and `lading worker --pool` name it."""
    return f"{_namespace(pool)}/{pool.name}"


def _secret_env(name: str, ref: SecretKeySelector | specs.SecretKeyRef) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}}


# --- vLLM.


def vllm_endpoint_url(pool: specs.InferencePool) -> str:
    """The OpenAI base URL of the pool's vLLM Service, inside the cluster."""
    return f"http://{object_name(pool, COMPONENT_VLLM)}.{_namespace(pool)}.svc:{VLLM_PORT}/v1"


def _require_vllm(pool: specs.InferencePool) -> tuple[str, specs.VllmSettings]:
    spec = pool.spec
    if spec.provider != "vllm" or spec.model is None:
        raise ValueError(f"InferencePool {pool.display_name} has provider {spec.provider}, not vllm")
    return spec.model, spec.vllm or specs.VllmSettings()


def vllm_args(pool: specs.InferencePool) -> list[str]:
    """`vllm serve` arguments: the model, where to listen, then the engine arguments that are set."""
    model, vllm = _require_vllm(pool)
    engine = vllm.engine_args
    args = [
        model,
        "--host", "0.0.0.0",
        "--port", str(VLLM_PORT),
        "--served-model-name", model,
        "--tensor-parallel-size", str(vllm.gpus),
        "--gpu-memory-utilization", f"{engine.gpu_memory_utilization:g}",
    ]
    if engine.max_num_seqs is not None:
        args += ["--max-num-seqs", str(engine.max_num_seqs)]
    if engine.max_num_batched_tokens is not None:
        args += ["--max-num-batched-tokens", str(engine.max_num_batched_tokens)]
    if engine.max_model_len is not None:
        args += ["--max-model-len", str(engine.max_model_len)]
    return args + list(vllm.extra_args or [])


def _vllm_resources(vllm: specs.VllmSettings) -> dict[str, Any]:
    """GPUs as a limit (an extended resource's request equals it), CPU, memory and ephemeral storage as
    requests when set: no CPU or memory limit, so the engine is never throttled or OOM-killed below the
    node's capacity."""
    requested = {"cpu": vllm.resources.cpu, "memory": vllm.resources.memory,
                 "ephemeral-storage": vllm.resources.ephemeral_storage}  # fmt: skip
    resources: dict[str, Any] = {"limits": {GPU_RESOURCE: str(vllm.gpus)}}
    requests = {name: value for name, value in requested.items() if value is not None}
    if requests:
        resources["requests"] = requests
    return resources


def _toleration(toleration: specs.Toleration) -> dict[str, Any]:
    return toleration.model_dump(by_alias=True, exclude_none=True)


def vllm_deployment(
        pool: specs.InferencePool,
        *,
        uid: str,
        config: OperatorConfig | None = None,
        replicas: int | None = None,
) -> dict[str, Any]:
    """The vLLM Deployment. `replicas` None: spec.vllm.replicas (the scaler passes 0 when idle)."""
    model, vllm = _require_vllm(pool)
    del model
    component = COMPONENT_VLLM
    env: list[dict[str, Any]] = [
        {"name": "HF_HOME", "value": f"{VLLM_CACHE_MOUNT}/huggingface"},
        # No usage reports leave the cluster.
        {"name": "VLLM_NO_USAGE_STATS", "value": "1"},
        {"name": "DO_NOT_TRACK", "value": "1"},
    ]
    if vllm.hf_token_secret_ref is not None:
        env.append(_secret_env("HF_TOKEN", vllm.hf_token_secret_ref))
    for variable in vllm.env or []:
        source = variable.value_from
        env.append(_secret_env(variable.name, source.secret_key_ref) if source is not None
                   else {"name": variable.name, "value": variable.value})  # fmt: skip
    cache_volume: dict[str, Any]
    if vllm.model_cache.claim_name is not None:
        cache_volume = {"name": "model-cache", "persistentVolumeClaim": {"claimName": vllm.model_cache.claim_name}}
    else:
        cache_volume = {"name": "model-cache", "emptyDir": {"sizeLimit": vllm.model_cache.size_limit}}
    probe = {"httpGet": {"path": "/health", "port": "http"}}
    container = {
        "name": "vllm",
        "image": vllm.image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["vllm", "serve"],
        "args": vllm_args(pool),
        "env": env,
        "ports": [{"name": "http", "containerPort": VLLM_PORT, "protocol": "TCP"}],
        "resources": _vllm_resources(vllm),
        "volumeMounts": [
            {"name": "dshm", "mountPath": "/dev/shm"},
            {"name": "model-cache", "mountPath": VLLM_CACHE_MOUNT},
        ],
        "startupProbe": {**probe, "periodSeconds": 10, "timeoutSeconds": 5,
                         "failureThreshold": VLLM_STARTUP_BUDGET_S // 10},
        "readinessProbe": {**probe, "periodSeconds": 5, "timeoutSeconds": 5, "failureThreshold": 3},
        "livenessProbe": {**probe, "periodSeconds": 15, "timeoutSeconds": 10, "failureThreshold": 6},
    }
    pod_spec: dict[str, Any] = {
        "containers": [container],
        "volumes": [
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": vllm.shm_size}},
            cache_volume,
        ],
        "tolerations": (
            [_toleration(t) for t in vllm.tolerations] if vllm.tolerations is not None
            else [dict(GPU_TOLERATION_DEFAULT)]
        ),
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": 30,
    }
    if vllm.node_selector:
        pod_spec["nodeSelector"] = dict(sorted(vllm.node_selector.items()))
    if vllm.affinity is not None:
        pod_spec["affinity"] = vllm.affinity.model_dump(by_alias=True, exclude_none=True)
    if vllm.runtime_class_name is not None:
        pod_spec["runtimeClassName"] = vllm.runtime_class_name
    if vllm.priority_class_name is not None:
        pod_spec["priorityClassName"] = vllm.priority_class_name
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(pool, component, uid=uid, config=config),
        "spec": {
            "replicas": vllm.replicas if replicas is None else replicas,
            "selector": {"matchLabels": selector_labels(pool, component)},
            # No spare GPU is assumed: replace pods one at a time instead of surging.
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}},
            "template": {
                "metadata": {
                    "labels": labels(pool, component, config),
                    # vLLM serves Prometheus metrics on its API port; KEDA's headroom trigger reads them.
                    "annotations": {
                        "prometheus.io/scrape": "true",
                        "prometheus.io/port": str(VLLM_PORT),
                        "prometheus.io/path": "/metrics",
                    },
                },
                "spec": pod_spec,
            },
        },
    }


def vllm_service(pool: specs.InferencePool, *, uid: str, config: OperatorConfig | None = None) -> dict[str, Any]:
    """ClusterIP Service in front of the vLLM pods; its DNS name is `vllm_endpoint_url`."""
    _require_vllm(pool)
    component = COMPONENT_VLLM
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(pool, component, uid=uid, config=config),
        "spec": {
            "type": "ClusterIP",
            "selector": selector_labels(pool, component),
            "ports": [{"name": "http", "port": VLLM_PORT, "targetPort": "http", "protocol": "TCP"}],
        },
    }


# --- Workers.


_CPU_QUANTITY = re.compile(r"(?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?P<milli>m?)")


def cpu_quantity(value: str | float) -> float:
    """A Kubernetes CPU quantity in CPUs: "2" -> 2.0, "1500m" -> 1.5, 0.5 -> 0.5; ValueError otherwise."""
    match = _CPU_QUANTITY.fullmatch(str(value).strip())
    if match is None:
        raise ValueError(f"CPU quantity {value!r} is not a number of CPUs or millicores (e.g. 2, 1.5, 500m)")
    number = float(match["number"])
    return number / 1000 if match["milli"] else number


def worker_process_count(config: OperatorConfig) -> int:
    """`lading worker --processes` of every worker pod: `worker_processes`, else the whole CPUs of the
    container's CPU limit (else of its CPU request), at least 1, at most WORKER_PROCESSES_MAX."""
    if config.worker_processes is not None:
        return config.worker_processes
    for kind in ("limits", "requests"):
        cpu = config.worker_resources.get(kind, {}).get("cpu")
        if cpu is not None:
            return max(1, min(WORKER_PROCESSES_MAX, int(cpu_quantity(cpu))))
    return 1


def worker_args(pool: specs.InferencePool, config: OperatorConfig) -> list[str]:
    # At most one process per attempt: the worker would cap it itself, but the rendering shows what runs.
    processes = min(worker_process_count(config), pool.spec.workers.concurrency)
    args = [
        *config.worker_command[1:],
        "--pool", pool_key(pool),
        "--concurrency", str(pool.spec.workers.concurrency),
        "--processes", str(processes),
        "--http", f"0.0.0.0:{config.worker_http_port}",
        "--grace", str(config.worker_grace_s),
    ]
    for root in config.document_roots:
        args += ["--document-root", root]
    for flag in WORKER_CLEANER_FLAGS:  # a fixed order: the same settings always render the same args
        if flag in config.worker_cleaner:
            args += [flag, f"{config.worker_cleaner[flag]:g}"]
    return args


def _endpoint_secrets(config: OperatorConfig) -> list[EndpointSecret]:
    secrets = sorted(set(config.endpoint_secrets), key=lambda s: (s.file_name, s.secret_name, s.key))
    if len(secrets) > ENDPOINT_SECRETS_MAX:
        raise ValueError(f"{len(secrets)} endpoint secrets for one worker pod; at most {ENDPOINT_SECRETS_MAX}")
    files = [s.file_name for s in secrets]
    if len(set(files)) != len(files):
        duplicate = next(f for f in files if files.count(f) > 1)
        raise ValueError(f"two signing secrets for DeliveryEndpoint {duplicate.replace('.', '/', 1)}")
    return secrets


def worker_deployment(
        pool: specs.InferencePool,
        *,
        uid: str,
        config: OperatorConfig,
        replicas: int | None,
) -> dict[str, Any]:
    """The worker Deployment. `replicas` None leaves `spec.replicas` out (KEDA owns it)."""
    component = COMPONENT_WORKER
    env: list[dict[str, Any]] = [
        _secret_env("DATABASE_URL", config.database_secret),
        {"name": "LADING_LOG_FORMAT", "value": "json"},  # one object per line, with the job's ids
        {"name": "LADING_LOG_LEVEL", "value": config.worker_log_level},
    ]
    endpoint = pool.spec.endpoint
    if endpoint is not None and endpoint.api_key_secret_ref is not None:
        env.append(_secret_env("LADING_PROVIDER_API_KEY", endpoint.api_key_secret_ref))
    if pool.spec.provider == "vllm":
        env.append({"name": "LADING_PROVIDER_URL", "value": vllm_endpoint_url(pool)})
    if config.amqp_url_secret is not None:
        env.append(_secret_env("LADING_AMQP_URL", config.amqp_url_secret))
    if config.egress_allow:
        env.append({"name": egress.ENV_VAR, "value": ",".join(config.egress_allow)})
    volumes: list[dict[str, Any]] = [{"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}}]
    mounts: list[dict[str, Any]] = [{"name": "tmp", "mountPath": "/tmp"}]
    secrets = _endpoint_secrets(config)
    if secrets:
        env.append({"name": delivery_secrets.ENV_VAR, "value": ENDPOINT_SECRETS_MOUNT})
        volumes.append({
            "name": "endpoint-secrets",
            "projected": {
                "defaultMode": 0o440,
                "sources": [
                    {"secret": {"name": s.secret_name, "items": [{"key": s.key, "path": s.file_name}]}}
                    for s in secrets
                ],
            },
        })
        mounts.append({"name": "endpoint-secrets", "mountPath": ENDPOINT_SECRETS_MOUNT, "readOnly": True})
    env += [dict(variable) for variable in config.extra_env]
    volumes += [dict(volume) for volume in config.volumes]
    mounts += [dict(mount) for mount in config.volume_mounts]
    port = config.worker_http_port
    container = {
        "name": "worker",
        "image": config.worker_image,
        "imagePullPolicy": "IfNotPresent",
        "command": [config.worker_command[0]],
        "args": worker_args(pool, config),
        "env": env,
        "ports": [{"name": "http", "containerPort": port, "protocol": "TCP"}],
        "resources": {kind: dict(values) for kind, values in sorted(config.worker_resources.items())},
        "volumeMounts": mounts,
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": "http"}, "periodSeconds": 10,
                          "timeoutSeconds": 5, "failureThreshold": 3},
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": "http"}, "periodSeconds": 5,
                           "timeoutSeconds": 5, "failureThreshold": 2},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
    }
    pod_spec: dict[str, Any] = {}
    if config.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": name} for name in config.image_pull_secrets]
    if config.node_selector:
        pod_spec["nodeSelector"] = dict(sorted(config.node_selector.items()))
    if config.tolerations:
        pod_spec["tolerations"] = [dict(toleration) for toleration in config.tolerations]
    spec: dict[str, Any] = {
        "selector": {"matchLabels": selector_labels(pool, component)},
        "template": {
            "metadata": {
                "labels": labels(pool, component, config),
                "annotations": {
                    **dict(config.annotations),
                    "prometheus.io/scrape": "true",
                    "prometheus.io/port": str(port),
                    "prometheus.io/path": "/metrics",
                },
            },
            "spec": {
                **pod_spec,
                "containers": [container],
                "volumes": volumes,
                "automountServiceAccountToken": False,
                "terminationGracePeriodSeconds": config.worker_grace_s + WORKER_TERMINATION_EXTRA_S,
                "securityContext": {
                    "runAsNonRoot": True,
                    "runAsUser": 65532,
                    "runAsGroup": 65532,
                    "fsGroup": 65532,
                    "seccompProfile": {"type": "RuntimeDefault"},
                },
            },
        },
    }
    if replicas is not None:
        spec = {"replicas": replicas, **spec}
    metadata = _metadata(pool, component, uid=uid, config=config)
    if config.annotations:
        metadata["annotations"] = dict(sorted(config.annotations.items()))
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata,
        "spec": spec,
    }


# --- KEDA.

KEDA_API_VERSION = "keda.sh/v1alpha1"
KEDA_POLLING_INTERVAL_S = 15
"""KEDA's evaluation period: the operator's own scaler runs at the same pace."""
KEDA_HEADROOM_QUERY = (
    'sum(vllm:num_requests_waiting{{namespace="{namespace}",pod=~"{deployment}-.*"}}) '
    "or vector(0)"
)
"""PromQL for the vLLM waiting queue of the pool's pods (the headroom trigger)."""


_ELIGIBLE = queries.fragment("job_eligible")
"""What a claim could take now: the core's one definition (`job_eligible` in lading/db/sql/jobs.sql),
written against alias `j`."""


def _checked_pool_key(pool: specs.InferencePool) -> str:
    # KEDA's postgresql scaler takes no query parameters, so the pool key is a literal in the SQL.
    # It is safe there only because the pattern admits nothing but [a-z0-9.-] and one '/'.
    key = pool_key(pool)
    if not re.fullmatch(specs.POOL_KEY_PATTERN, key):
        raise ValueError(f"pool key {key!r} is not namespace/name")
    return key


def keda_backlog_query(pool: specs.InferencePool) -> str:
    """Jobs the pool has to run now: running ones plus eligible ones.

    The postgresql trigger divides it by `targetQueryValue` = worker concurrency, so KEDA runs
    ceil((running + eligible) / concurrency) workers: as if every eligible job should start at once.
    (The builtin scaler spreads the backlog over one target age at the observed latency; KEDA sees
    neither.) Two counts, each on its own index, rather than one OR that would read both sets twice.
    """
    key = _checked_pool_key(pool)
    return (
        f"SELECT (SELECT count(*) FROM extraction_jobs WHERE pool = '{key}' AND state = 'RUNNING') + "
        f"(SELECT count(*) FROM extraction_jobs j WHERE j.pool = '{key}' AND {_ELIGIBLE})"
    )


def keda_oldest_age_query(pool: specs.InferencePool) -> str:
    """Seconds the oldest eligible job of the pool has waited (0 when none)."""
    key = _checked_pool_key(pool)
    return (
        "SELECT coalesce(greatest(extract(epoch FROM now() - min(j.available_at)), 0), 0) FROM extraction_jobs j "
        f"WHERE j.pool = '{key}' AND {_ELIGIBLE}"
    )


def keda_trigger_authentication(
        pool: specs.InferencePool,
        *,
        uid: str,
        config: OperatorConfig,
) -> dict[str, Any]:
    """The TriggerAuthentication the ScaledObject's postgresql triggers use: the connection string Secret."""
    secret = config.keda_database_secret or config.database_secret
    return {
        "apiVersion": KEDA_API_VERSION,
        "kind": "TriggerAuthentication",
        "metadata": _metadata(pool, COMPONENT_WORKER, uid=uid, config=config),
        "spec": {"secretTargetRef": [{"parameter": "connection", "name": secret.name, "key": secret.key}]},
    }


def keda_scaled_object(pool: specs.InferencePool, *, uid: str, config: OperatorConfig) -> dict[str, Any]:
    """A KEDA ScaledObject sizing the worker Deployment from the same signals as the builtin scaler.

        builtin signal                          KEDA trigger
        slots = running + eligible backlog      postgresql, keda_backlog_query, target = concurrency
        oldest eligible age vs target           postgresql, keda_oldest_age_query, target = targetOldestAge
        capacity cap (limits)                   maxReplicaCount = min(maxReplicas, capacity workers)
        vLLM headroom (waiting queue)           prometheus, KEDA_HEADROOM_QUERY (only with keda_prometheus_url):
                                                activation only, so a saturated engine does not pull
                                                replicas up by itself
        scale-down stabilisation                advanced.horizontalPodAutoscalerConfig.behavior.scaleDown
        scale to zero after idle                minReplicaCount 0 + cooldownPeriod = idleSeconds
    """
    workers = pool.spec.workers
    auth = object_name(pool, COMPONENT_WORKER)
    concurrency = workers.concurrency
    triggers: list[dict[str, Any]] = [
        {
            "type": "postgresql",
            "name": "backlog",
            "metadata": {
                "query": keda_backlog_query(pool),
                "targetQueryValue": str(concurrency),
                "activationTargetQueryValue": "0",
            },
            "authenticationRef": {"name": auth},
        },
        {
            "type": "postgresql",
            "name": "oldest-age",
            "metadata": {
                "query": keda_oldest_age_query(pool),
                "targetQueryValue": str(workers.target_oldest_age_seconds),
                "activationTargetQueryValue": "0",
            },
            "authenticationRef": {"name": auth},
        },
    ]
    if pool.spec.provider == "vllm" and config.keda_prometheus_url is not None:
        triggers.append({
            "type": "prometheus",
            "name": "vllm-waiting",
            "metadata": {
                "serverAddress": config.keda_prometheus_url,
                "query": KEDA_HEADROOM_QUERY.format(
                    namespace=_namespace(pool), deployment=object_name(pool, COMPONENT_VLLM)
                ),
                # A high target: the queue never adds replicas on its own, it only keeps the
                # ScaledObject active (vLLM busy = not idle) for the idle rule.
                "threshold": str(10**6),
                "activationThreshold": "0",
            },
        })
    return {
        "apiVersion": KEDA_API_VERSION,
        "kind": "ScaledObject",
        "metadata": _metadata(pool, COMPONENT_WORKER, uid=uid, config=config),
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                               "name": object_name(pool, COMPONENT_WORKER)},
            "pollingInterval": KEDA_POLLING_INTERVAL_S,
            "cooldownPeriod": max(workers.idle_seconds, 1),
            "minReplicaCount": workers.min_replicas,
            "maxReplicaCount": _keda_max_replicas(pool),
            "advanced": {
                "horizontalPodAutoscalerConfig": {
                    "behavior": {
                        "scaleUp": {"stabilizationWindowSeconds": 0},
                        "scaleDown": {
                            "stabilizationWindowSeconds": workers.scale_down_stabilization_seconds,
                        },
                    },
                },
            },
            "triggers": triggers,
        },
    }


def _keda_max_replicas(pool: specs.InferencePool) -> int:
    # Concurrency is the one limit KEDA can apply without latency: more workers than
    # maxConcurrency/concurrency would only wait on the limiter.
    workers = pool.spec.workers
    by_concurrency = -(-pool.spec.limits.max_concurrency // workers.concurrency)
    return max(workers.min_replicas, min(workers.max_replicas, max(by_concurrency, 1)))
