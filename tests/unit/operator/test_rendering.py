"""Objects rendered for an InferencePool: valid against Kubernetes' own schemas, owned, wired, secret-free; drift."""

from __future__ import annotations

import argparse
import copy
import json
import re
from collections.abc import Iterator
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
from lading_operator import drift, rendering
from lading_worker import main as worker_main

from lading.delivery import egress
from lading.delivery import secrets as delivery_secrets
from lading.models import specs

K8S_VERSIONS = ("1.35.0", "1.37.0")
"""The oldest and newest Kubernetes versions kubernetes-validate ships strict schemas for here."""
UID = "0f6b1c3e-6a0e-4a8a-9d3c-0000000000aa"

CONFIG = rendering.OperatorConfig(
    worker_image="registry.example/lading:1.2.3",
    database_secret=rendering.SecretKeySelector(name="lading-db", key="url"),
    amqp_url_secret=rendering.SecretKeySelector(name="lading-amqp", key="url"),
    egress_allow=("10.20.0.0/16", "192.168.7.0/24"),
    endpoint_secrets=(
        rendering.EndpointSecret(endpoint="acme/erp", secret_name="lading-endpoint-acme-erp", key="secret"),
        rendering.EndpointSecret(endpoint="beta/sap", secret_name="lading-endpoint-beta-sap", key="secret"),
    ),
    labels={"team": "platform"},
    keda_prometheus_url="http://prometheus.monitoring.svc:9090",
)


def inference_pool(
        spec: dict[str, Any],
        *,
        name: str = "qwen",
        namespace: str = "lading-system",
) -> specs.InferencePool:
    return specs.InferencePool.model_validate({"metadata": {"name": name, "namespace": namespace}, "spec": spec})


VLLM_FULL = inference_pool({
    "provider": "vllm",
    "model": "Qwen/Qwen2.5-7B-Instruct",
    "vllm": {
        "image": "vllm/vllm-openai:v0.9.1",
        "gpus": 2,
        "engineArgs": {"maxNumSeqs": 128, "maxNumBatchedTokens": 8192, "maxModelLen": 16384,
                       "gpuMemoryUtilization": 0.85},
        "hfTokenSecretRef": {"name": "hf", "key": "token"},
        "replicas": 2,
        "shmSize": "16Gi",
        "modelCache": {"claimName": "hf-cache"},
        "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
        "tolerations": [{"key": "gpu", "operator": "Equal", "value": "h100", "effect": "NoSchedule"}],
    },
    "workers": {"minReplicas": 0, "maxReplicas": 10, "concurrency": 16},
})
VLLM_DEFAULTS = inference_pool({"provider": "vllm", "model": "Qwen/Qwen2.5-7B-Instruct"}, name="small")
EXTERNAL = inference_pool({
    "provider": "openai-compatible",
    "model": "gpt-4o-mini",
    "endpoint": {"url": "https://api.example.com/v1", "apiKeySecretRef": {"name": "openai", "key": "apiKey"}},
}, name="openai")
EXTERNAL_NO_KEY = inference_pool({
    "provider": "openai-compatible", "model": "m", "endpoint": {"url": "http://10.0.0.5:8000/v1"},
}, name="local")
BUILTIN = inference_pool({"provider": "builtin"}, name="demo")
POOLS = [VLLM_FULL, VLLM_DEFAULTS, EXTERNAL, EXTERNAL_NO_KEY, BUILTIN]


def rendered(pool: specs.InferencePool, config: rendering.OperatorConfig = CONFIG) -> Iterator[dict[str, Any]]:
    """Every core object the operator renders for `pool`."""
    if pool.spec.provider == "vllm":
        yield rendering.vllm_deployment(pool, uid=UID, config=config)
        yield rendering.vllm_service(pool, uid=UID, config=config)
    yield rendering.worker_deployment(pool, uid=UID, config=config, replicas=3)


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    containers: list[dict[str, Any]] = deployment["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def env_of(deployment: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {item["name"]: item for item in container(deployment)["env"]}


# --- schemas


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("pool", POOLS, ids=lambda p: f"{p.spec.provider}-{p.name}")
def test_every_object_validates_against_the_kubernetes_schema(pool: specs.InferencePool, version: str) -> None:
    for obj in rendered(pool):
        kubernetes_validate.validate(obj, version, strict=True)


def test_keda_mode_worker_deployment_validates_without_replicas() -> None:
    deployment = rendering.worker_deployment(EXTERNAL, uid=UID, config=CONFIG, replicas=None)
    assert "replicas" not in deployment["spec"]
    kubernetes_validate.validate(deployment, K8S_VERSIONS[-1], strict=True)


def test_schema_validation_catches_a_broken_object() -> None:
    """The check above can fail: a misspelt field is refused."""
    broken = rendering.vllm_deployment(VLLM_FULL, uid=UID, config=CONFIG)
    container(broken)["readinesProbe"] = container(broken).pop("readinessProbe")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSIONS[-1], strict=True)


# --- ownership, names, labels


@pytest.mark.parametrize("pool", POOLS, ids=lambda p: p.name)
def test_every_object_is_owned_by_the_pool_and_labelled(pool: specs.InferencePool) -> None:
    for obj in rendered(pool):
        meta = obj["metadata"]
        assert meta["namespace"] == pool.namespace
        assert meta["ownerReferences"] == [{
            "apiVersion": "lading.dev/v1alpha1", "kind": "InferencePool", "name": pool.name, "uid": UID,
            "controller": True, "blockOwnerDeletion": True,
        }]
        component = "vllm" if meta["name"].endswith("-vllm") else "worker"
        assert meta["labels"] == {
            "team": "platform",
            "app.kubernetes.io/name": "lading",
            "app.kubernetes.io/instance": pool.name,
            "app.kubernetes.io/component": component,
            "app.kubernetes.io/managed-by": "lading",
            "lading.dev/pool": pool.name,
        }
        if obj["kind"] == "Deployment":
            selector = obj["spec"]["selector"]["matchLabels"]
            assert selector.items() <= obj["spec"]["template"]["metadata"]["labels"].items()
            assert "team" not in selector  # selectors are immutable: operator config must not move them


def test_names_are_deterministic_dns_labels() -> None:
    assert rendering.object_name(VLLM_FULL, "vllm") == "qwen-vllm"
    assert rendering.object_name(VLLM_FULL, "worker") == "qwen-worker"
    dotted = inference_pool({"provider": "builtin"}, name="7b.instruct")
    assert rendering.object_name(dotted, "worker") == "p-7b-instruct-worker"
    long_a = inference_pool({"provider": "builtin"}, name="a" * 70 + "-one")
    long_b = inference_pool({"provider": "builtin"}, name="a" * 70 + "-two")
    name_a, name_b = rendering.object_name(long_a, "worker"), rendering.object_name(long_b, "worker")
    assert len(name_a) <= 63 and len(name_b) <= 63 and name_a != name_b
    assert name_a == rendering.object_name(long_a, "worker")
    for pool in (dotted, long_a):
        label = rendering.label_value(pool.name)
        assert len(label) <= 63
        for obj in rendered(pool):
            kubernetes_validate.validate(obj, K8S_VERSIONS[-1], strict=True)


def test_pool_without_namespace_is_refused() -> None:
    pool = specs.InferencePool.model_validate({"metadata": {"name": "x"}, "spec": {"provider": "builtin"}})
    with pytest.raises(ValueError, match="has no namespace"):
        rendering.worker_deployment(pool, uid=UID, config=CONFIG, replicas=1)


def test_vllm_objects_are_refused_for_other_providers() -> None:
    with pytest.raises(ValueError, match="not vllm"):
        rendering.vllm_deployment(EXTERNAL, uid=UID, config=CONFIG)


# --- vLLM


def test_vllm_deployment_runs_vllm_serve_with_the_engine_arguments() -> None:
    deployment = rendering.vllm_deployment(VLLM_FULL, uid=UID, config=CONFIG)
    c = container(deployment)
    assert c["image"] == "vllm/vllm-openai:v0.9.1"
    assert c["command"] == ["vllm", "serve"]
    assert c["args"] == [
        "Qwen/Qwen2.5-7B-Instruct", "--host", "0.0.0.0", "--port", "8000",
        "--served-model-name", "Qwen/Qwen2.5-7B-Instruct", "--tensor-parallel-size", "2",
        "--gpu-memory-utilization", "0.85", "--max-num-seqs", "128", "--max-num-batched-tokens", "8192",
        "--max-model-len", "16384",
    ]
    assert c["ports"] == [{"name": "http", "containerPort": 8000, "protocol": "TCP"}]
    assert deployment["spec"]["replicas"] == 2
    assert rendering.vllm_deployment(VLLM_FULL, uid=UID, config=CONFIG, replicas=0)["spec"]["replicas"] == 0


def test_vllm_defaults_leave_engine_arguments_to_vllm() -> None:
    args = container(rendering.vllm_deployment(VLLM_DEFAULTS, uid=UID))["args"]
    assert "--max-num-seqs" not in args and "--max-model-len" not in args
    assert args[args.index("--tensor-parallel-size") + 1] == "1"


def test_vllm_pod_gets_gpus_shared_memory_cache_and_probes() -> None:
    deployment = rendering.vllm_deployment(VLLM_FULL, uid=UID, config=CONFIG)
    pod = deployment["spec"]["template"]["spec"]
    c = container(deployment)
    assert c["resources"] == {"limits": {"nvidia.com/gpu": "2"}}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["dshm"] == {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}}
    assert volumes["model-cache"] == {"name": "model-cache", "persistentVolumeClaim": {"claimName": "hf-cache"}}
    assert {m["mountPath"]: m["name"] for m in c["volumeMounts"]} == {"/dev/shm": "dshm", "/models": "model-cache"}
    assert env_of(deployment)["HF_HOME"]["value"] == "/models/huggingface"
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"] == {"path": "/health", "port": "http"}
    assert c["startupProbe"]["periodSeconds"] * c["startupProbe"]["failureThreshold"] >= 1800
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert pod["tolerations"] == [{"key": "gpu", "operator": "Equal", "value": "h100", "effect": "NoSchedule"}]
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}


def test_vllm_defaults_scratch_cache_and_the_usual_gpu_toleration() -> None:
    pod = rendering.vllm_deployment(VLLM_DEFAULTS, uid=UID)["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["model-cache"]["emptyDir"] == {"sizeLimit": "100Gi"}
    assert volumes["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "8Gi"}
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert "nodeSelector" not in pod
    assert "HF_TOKEN" not in env_of(rendering.vllm_deployment(VLLM_DEFAULTS, uid=UID))


def test_hf_token_comes_from_its_secret() -> None:
    assert env_of(rendering.vllm_deployment(VLLM_FULL, uid=UID))["HF_TOKEN"] == {
        "name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}},
    }


def test_service_selects_the_vllm_pods_and_names_the_endpoint() -> None:
    service = rendering.vllm_service(VLLM_FULL, uid=UID, config=CONFIG)
    deployment = rendering.vllm_deployment(VLLM_FULL, uid=UID, config=CONFIG)
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert service["spec"]["ports"] == [{"name": "http", "port": 8000, "targetPort": "http", "protocol": "TCP"}]
    assert rendering.vllm_endpoint_url(VLLM_FULL) == "http://qwen-vllm.lading-system.svc:8000/v1"
    assert service["metadata"]["name"] == "qwen-vllm"


# --- workers


def test_worker_runs_lading_worker_for_the_pool() -> None:
    deployment = rendering.worker_deployment(VLLM_FULL, uid=UID, config=CONFIG, replicas=4)
    c = container(deployment)
    assert deployment["spec"]["replicas"] == 4
    assert c["image"] == "registry.example/lading:1.2.3"
    assert [*c["command"], *c["args"]] == [
        "lading", "worker", "--pool", "lading-system/qwen", "--concurrency", "16", "--processes", "1",
        "--http", "0.0.0.0:8080", "--grace", "20",
    ]
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert c["ports"] == [{"name": "http", "containerPort": 8080, "protocol": "TCP"}]
    pod = deployment["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] == 30
    assert pod["automountServiceAccountToken"] is False


def test_worker_command_is_what_the_worker_itself_parses() -> None:
    """The rendered arguments and variable names are the worker's real ones, so a hand-run worker is the same."""
    deployment = rendering.worker_deployment(VLLM_FULL, uid=UID, config=CONFIG, replicas=1)
    c = container(deployment)
    parser = argparse.ArgumentParser()
    worker_main.add_arguments(parser)
    assert c["args"][0] == "worker"
    args = parser.parse_args(c["args"][1:])
    assert (args.pool, args.concurrency, args.http, args.grace) == ("lading-system/qwen", 16, "0.0.0.0:8080", 20.0)
    assert args.processes == 1
    env = env_of(deployment)
    assert {egress.ENV_VAR, delivery_secrets.ENV_VAR} <= set(env)
    external = env_of(rendering.worker_deployment(EXTERNAL, uid=UID, config=CONFIG, replicas=1))
    assert worker_main.API_KEY_ENV in external
    cidrs = egress.parse_cidrs([env[egress.ENV_VAR]["value"]])
    assert [str(n) for n in cidrs] == ["10.20.0.0/16", "192.168.7.0/24"]


@pytest.mark.parametrize(
    ("resources", "processes", "expected"),
    [
        ({"requests": {"cpu": "100m"}}, None, 1),
        ({"requests": {"cpu": "100m"}, "limits": {"cpu": "2"}}, None, 2),
        ({"limits": {"cpu": "2500m", "memory": "2Gi"}}, None, 2),
        ({"requests": {"cpu": 3}}, None, 3),
        ({"limits": {"memory": "1Gi"}}, None, 1),
        ({"limits": {"cpu": "2"}}, 4, 4),
        ({"limits": {"cpu": "64"}}, None, 16),
    ],
)
def test_worker_processes_follow_the_cpu_limit_unless_set(
        resources: dict[str, dict[str, Any]], processes: int | None, expected: int
) -> None:
    """A pod with a 2-CPU limit runs 2 worker processes; never more processes than attempts (concurrency 16)."""
    config = rendering.OperatorConfig(worker_resources=resources, worker_processes=processes)
    args = container(rendering.worker_deployment(VLLM_FULL, uid=UID, config=config, replicas=1))["args"]
    assert args[args.index("--processes") + 1] == str(expected)


@pytest.mark.parametrize(
    ("config", "message"),
    [({"worker_processes": 0}, "worker_processes 0"), ({"worker_resources": {"limits": {"cpu": "two"}}}, "'two'")],
)
def test_bad_worker_processes_are_refused_by_name(config: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        rendering.OperatorConfig(**config)


def test_worker_log_level_is_rendered_and_a_bad_one_refused_by_name() -> None:
    config = rendering.OperatorConfig(worker_log_level="DEBUG")
    assert env_of(rendering.worker_deployment(EXTERNAL_NO_KEY, uid=UID, config=config, replicas=1))[
        "LADING_LOG_LEVEL"]["value"] == "DEBUG"
    with pytest.raises(ValueError, match="worker_log_level 'info' must be one of DEBUG, INFO, WARNING, ERROR"):
        rendering.OperatorConfig(worker_log_level="info")
    with pytest.raises(ValueError, match="LADING_LOG_LEVEL is set by the operator"):
        rendering.OperatorConfig(extra_env=({"name": "LADING_LOG_LEVEL", "value": "DEBUG"},))


def test_a_bad_egress_range_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"'erp\.acme\.example' is not a CIDR"):
        rendering.OperatorConfig(egress_allow=("10.0.0.0/8", "erp.acme.example"))


def test_worker_environment_comes_from_secrets_and_config() -> None:
    env = env_of(rendering.worker_deployment(EXTERNAL, uid=UID, config=CONFIG, replicas=1))
    assert env["DATABASE_URL"]["valueFrom"] == {"secretKeyRef": {"name": "lading-db", "key": "url"}}
    assert env["LADING_PROVIDER_API_KEY"]["valueFrom"] == {"secretKeyRef": {"name": "openai", "key": "apiKey"}}
    assert env["LADING_AMQP_URL"]["valueFrom"] == {"secretKeyRef": {"name": "lading-amqp", "key": "url"}}
    assert env["LADING_EGRESS_ALLOW"]["value"] == "10.20.0.0/16,192.168.7.0/24"
    assert env["LADING_ENDPOINT_SECRETS_DIR"]["value"] == "/etc/lading/endpoint-secrets"


def test_minimal_config_renders_only_the_database_and_the_log_format_and_level() -> None:
    env = env_of(rendering.worker_deployment(EXTERNAL_NO_KEY, uid=UID, config=rendering.OperatorConfig(), replicas=1))
    assert set(env) == {"DATABASE_URL", "LADING_LOG_FORMAT", "LADING_LOG_LEVEL"}
    assert env["LADING_LOG_FORMAT"]["value"] == "json"
    assert env["LADING_LOG_LEVEL"]["value"] == "INFO", "commit-group lines are INFO; the CLI default would hide them"
    assert env["DATABASE_URL"]["valueFrom"] == {"secretKeyRef": {"name": "lading-database", "key": "url"}}


def test_vllm_workers_are_told_where_the_vllm_service_answers() -> None:
    env = env_of(rendering.worker_deployment(VLLM_DEFAULTS, uid=UID, config=CONFIG, replicas=1))
    assert env["LADING_PROVIDER_URL"]["value"] == rendering.vllm_endpoint_url(VLLM_DEFAULTS)
    external = rendering.worker_deployment(EXTERNAL, uid=UID, config=CONFIG, replicas=1)
    assert "LADING_PROVIDER_URL" not in env_of(external)


def test_endpoint_signing_secrets_are_projected_as_namespace_dot_name() -> None:
    deployment = rendering.worker_deployment(EXTERNAL, uid=UID, config=CONFIG, replicas=1)
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes["endpoint-secrets"]["projected"]["sources"] == [
        {"secret": {"name": "lading-endpoint-acme-erp", "items": [{"key": "secret", "path": "acme.erp"}]}},
        {"secret": {"name": "lading-endpoint-beta-sap", "items": [{"key": "secret", "path": "beta.sap"}]}},
    ]
    mounts = {m["name"]: m for m in container(deployment)["volumeMounts"]}
    assert mounts["endpoint-secrets"] == {
        "name": "endpoint-secrets", "mountPath": "/etc/lading/endpoint-secrets", "readOnly": True,
    }


def test_endpoint_secret_order_does_not_change_the_rendering() -> None:
    reversed_config = rendering.OperatorConfig(**{**CONFIG.__dict__, "endpoint_secrets": CONFIG.endpoint_secrets[::-1]})
    assert rendering.worker_deployment(EXTERNAL, uid=UID, config=reversed_config, replicas=1) == (
        rendering.worker_deployment(EXTERNAL, uid=UID, config=CONFIG, replicas=1)
    )


def test_two_secrets_for_one_endpoint_are_refused() -> None:
    config = rendering.OperatorConfig(endpoint_secrets=(
        rendering.EndpointSecret(endpoint="acme/erp", secret_name="a", key="k"),
        rendering.EndpointSecret(endpoint="acme/erp", secret_name="b", key="k"),
    ))
    with pytest.raises(ValueError, match="two signing secrets for DeliveryEndpoint acme/erp"):
        rendering.worker_deployment(EXTERNAL, uid=UID, config=config, replicas=1)


def test_worker_pod_is_locked_down() -> None:
    deployment = rendering.worker_deployment(BUILTIN, uid=UID, config=CONFIG, replicas=1)
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container(deployment)["securityContext"] == {
        "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]},
    }


# --- secrets never inline

SECRETISH = ("TOKEN", "KEY", "PASSWORD", "SECRET", "DATABASE_URL", "AMQP_URL")
PLAIN_ALLOWED = {"LADING_ENDPOINT_SECRETS_DIR"}


def walk(node: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(node, dict):
        for key, value in node.items():
            yield key, value
            yield from walk(value)
    elif isinstance(node, list):
        for item in node:
            yield from walk(item)


@pytest.mark.parametrize("pool", POOLS, ids=lambda p: p.name)
def test_no_secret_value_is_ever_rendered(pool: specs.InferencePool) -> None:
    objects = [*rendered(pool), rendering.keda_scaled_object(pool, uid=UID, config=CONFIG),
               rendering.keda_trigger_authentication(pool, uid=UID, config=CONFIG)]
    for obj in objects:
        keys = {key for key, _ in walk(obj)}
        assert not keys & {"data", "stringData", "password", "connection", "connectionString"}
        for key, value in walk(obj):
            if key == "env":
                for item in value:
                    if any(word in item["name"] for word in SECRETISH) and item["name"] not in PLAIN_ALLOWED:
                        assert set(item) == {"name", "valueFrom"}, item["name"]
                        assert set(item["valueFrom"]) == {"secretKeyRef"}, item["name"]
        text = json.dumps(obj)
        assert "postgresql://" not in text and "amqp://" not in text and "whsec_" not in text


# --- KEDA


def test_keda_scaled_object_expresses_the_scaler_signals() -> None:
    scaled = rendering.keda_scaled_object(VLLM_FULL, uid=UID, config=CONFIG)
    auth = rendering.keda_trigger_authentication(VLLM_FULL, uid=UID, config=CONFIG)
    assert (scaled["apiVersion"], scaled["kind"]) == ("keda.sh/v1alpha1", "ScaledObject")
    assert (auth["apiVersion"], auth["kind"]) == ("keda.sh/v1alpha1", "TriggerAuthentication")
    spec = scaled["spec"]
    assert spec["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "qwen-worker"}
    # maxReplicas 10, but maxConcurrency 32 (the default) fills only 2 workers of 16.
    assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (0, 2)
    assert spec["cooldownPeriod"] == 600
    behavior = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert behavior == {"scaleUp": {"stabilizationWindowSeconds": 0},
                        "scaleDown": {"stabilizationWindowSeconds": 300}}
    triggers = {t["name"]: t for t in spec["triggers"]}
    assert set(triggers) == {"backlog", "oldest-age", "vllm-waiting"}
    for name in ("backlog", "oldest-age"):
        assert triggers[name]["type"] == "postgresql"
        assert triggers[name]["authenticationRef"] == {"name": auth["metadata"]["name"]}
        assert "'lading-system/qwen'" in triggers[name]["metadata"]["query"]
    assert triggers["backlog"]["metadata"]["targetQueryValue"] == "16"
    assert triggers["oldest-age"]["metadata"]["targetQueryValue"] == "120"
    assert triggers["vllm-waiting"]["type"] == "prometheus"
    assert triggers["vllm-waiting"]["metadata"]["serverAddress"] == "http://prometheus.monitoring.svc:9090"
    assert 'namespace="lading-system"' in triggers["vllm-waiting"]["metadata"]["query"]
    # KEDA reads trigger metadata as a map of strings.
    for trigger in spec["triggers"]:
        assert all(isinstance(v, str) for v in trigger["metadata"].values())
    assert auth["spec"] == {"secretTargetRef": [{"parameter": "connection", "name": "lading-db", "key": "url"}]}
    for obj in (scaled, auth):
        assert obj["metadata"]["ownerReferences"][0]["uid"] == UID


def test_keda_without_prometheus_or_for_external_pools_has_no_headroom_trigger() -> None:
    external = rendering.keda_scaled_object(EXTERNAL, uid=UID, config=CONFIG)
    bare = rendering.keda_scaled_object(VLLM_FULL, uid=UID, config=rendering.OperatorConfig())
    for scaled in (external, bare):
        assert [t["type"] for t in scaled["spec"]["triggers"]] == ["postgresql", "postgresql"]


def test_keda_max_replicas_respects_max_concurrency() -> None:
    narrow = inference_pool({"provider": "builtin", "limits": {"maxConcurrency": 64},
                             "workers": {"maxReplicas": 50, "concurrency": 16, "minReplicas": 1}}, name="narrow")
    assert rendering.keda_scaled_object(narrow, uid=UID, config=CONFIG)["spec"]["maxReplicaCount"] == 4


def test_keda_uses_its_own_database_secret_when_given() -> None:
    config = rendering.OperatorConfig(keda_database_secret=rendering.SecretKeySelector(name="keda-ro", key="dsn"))
    auth = rendering.keda_trigger_authentication(BUILTIN, uid=UID, config=config)
    assert auth["spec"]["secretTargetRef"] == [{"parameter": "connection", "name": "keda-ro", "key": "dsn"}]


# --- drift


def as_served(obj: dict[str, Any]) -> dict[str, Any]:
    """`obj` as the API server returns it: defaults filled in, bookkeeping added."""
    live = copy.deepcopy(obj)
    live["metadata"].update({"resourceVersion": "123", "uid": "live-uid", "generation": 2,
                             "creationTimestamp": "2026-03-01T12:00:00Z"})
    live["metadata"]["annotations"] = {**live["metadata"].get("annotations", {}),
                                       "deployment.kubernetes.io/revision": "1"}
    live["status"] = {"replicas": 1, "readyReplicas": 1}
    spec = live["spec"]
    if live["kind"] == "Deployment":
        spec.setdefault("replicas", 1)
        spec.update({"revisionHistoryLimit": 10, "progressDeadlineSeconds": 600})
        spec.setdefault("strategy", {"type": "RollingUpdate",
                                     "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}})
        pod = spec["template"]["spec"]
        pod.update({"restartPolicy": "Always", "dnsPolicy": "ClusterFirst", "schedulerName": "default-scheduler"})
        pod.setdefault("securityContext", {})
        for c in pod["containers"]:
            c.update({"terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File"})
            limits = c.get("resources", {}).get("limits", {})
            c.setdefault("resources", {}).setdefault("requests", {}).update(
                {k: v for k, v in limits.items() if k == "nvidia.com/gpu"}
            )
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                if probe in c:
                    c[probe]["httpGet"]["scheme"] = "HTTP"
                    c[probe]["successThreshold"] = 1
        spec["template"]["metadata"]["creationTimestamp"] = None
    if live["kind"] == "Service":
        spec.update({"clusterIP": "10.96.0.17", "clusterIPs": ["10.96.0.17"], "sessionAffinity": "None",
                     "ipFamilies": ["IPv4"], "ipFamilyPolicy": "SingleStack", "internalTrafficPolicy": "Cluster"})
    return live


def vllm() -> dict[str, Any]:
    return rendering.vllm_deployment(VLLM_FULL, uid=UID, config=CONFIG)


def edited(obj: dict[str, Any], edit: Any) -> dict[str, Any]:
    live = as_served(obj)
    edit(live)
    return live


def _set_image(live: dict[str, Any]) -> None:
    live["spec"]["template"]["spec"]["containers"][0]["image"] = "vllm/vllm-openai:latest"


def _drop_env(live: dict[str, Any]) -> None:
    live["spec"]["template"]["spec"]["containers"][0]["env"].pop()


def _add_label(live: dict[str, Any]) -> None:
    live["metadata"]["labels"]["someone.else/added"] = "yes"


def _change_label(live: dict[str, Any]) -> None:
    live["metadata"]["labels"]["lading.dev/pool"] = "other"


def _drop_owner(live: dict[str, Any]) -> None:
    del live["metadata"]["ownerReferences"]


def _scale(live: dict[str, Any]) -> None:
    live["spec"]["replicas"] = 7


def _gpu(live: dict[str, Any]) -> None:
    live["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "1"


def _drop_shm(live: dict[str, Any]) -> None:
    live["spec"]["template"]["spec"]["volumes"] = live["spec"]["template"]["spec"]["volumes"][1:]


DRIFT_ROWS = [
    ("as served: in shape", lambda live: None, False),
    ("someone else's label: in shape", _add_label, False),
    ("replicas belong to the scaler: in shape", _scale, False),
    ("our label changed", _change_label, True),
    ("owner reference removed", _drop_owner, True),
    ("image", _set_image, True),
    ("env", _drop_env, True),
    ("gpu", _gpu, True),
    ("volumes", _drop_shm, True),
]


@pytest.mark.parametrize(("edit", "drifted"), [row[1:] for row in DRIFT_ROWS], ids=[row[0] for row in DRIFT_ROWS])
def test_drift_of_a_served_object(edit: Any, drifted: bool) -> None:
    assert drift.differs(vllm(), edited(vllm(), edit)) is drifted
    assert drift.up_to_date(vllm(), edited(drift.stamped(vllm()), edit)) is not drifted


def test_a_missing_object_differs() -> None:
    assert drift.differs(vllm(), {})


@pytest.mark.parametrize("pool", POOLS, ids=lambda p: p.name)
def test_every_rendering_is_up_to_date_as_served_and_not_once_tampered(pool: specs.InferencePool) -> None:
    for desired in rendered(pool):
        live = as_served(drift.stamped(desired))
        assert drift.up_to_date(desired, live)
        containers = live["spec"].get("template", {}).get("spec", {}).get("containers")
        if containers:
            containers[0]["image"] = "tampered:1"
        live["metadata"]["labels"]["app.kubernetes.io/component"] = "tampered"
        if live["kind"] == "Service":
            live["spec"]["ports"][0]["port"] = 9999
        assert not drift.up_to_date(desired, live)


def test_service_defaults_are_not_drift() -> None:
    service = rendering.vllm_service(VLLM_FULL, uid=UID, config=CONFIG)
    assert not drift.differs(service, as_served(service))


def test_numbers_read_back_as_other_number_types_are_not_drift() -> None:
    assert not drift.differs({"spec": {"a": 1, "b": [{"c": 2.0}]}}, {"spec": {"a": 1.0, "b": [{"c": 2}]}})
    assert drift.differs({"spec": {"a": True}}, {"spec": {"a": 1}})
    assert drift.differs({"spec": {"a": "1"}}, {"spec": {"a": 1}})


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"worker_image": "not an image"}, "worker_image 'not an image' is not an image reference"),
        ({"worker_command": ()}, "worker_command must not be empty"),
        ({"worker_http_port": 0}, "worker_http_port 0 is not a TCP port"),
        ({"worker_grace_s": -1}, "worker_grace_s -1 must be between 0 and 3600"),
        ({"labels": {"team": "a b"}}, "label team='a b' is not a valid Kubernetes label"),
        ({"endpoint_secrets": (rendering.EndpointSecret("erp", "s", "k"),)}, "must be 'namespace/name'"),
        ({"endpoint_secrets": (rendering.EndpointSecret("a/erp", "S_1", "k"),)}, "'S_1' is not a Secret name"),
        ({"database_secret": rendering.SecretKeySelector("db", "u rl")}, "db/u rl is not a Secret name and key"),
    ],
)
def test_bad_operator_configuration_is_refused_by_name(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        rendering.OperatorConfig(**changes)
