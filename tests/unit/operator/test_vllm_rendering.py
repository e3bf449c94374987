"""The vLLM Deployment from spec.vllm: requests, extra arguments, env, runtime and priority classes, node
affinity, a digest-pinned image; what the operator renders itself cannot be overridden."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pydantic
import pytest
from lading_operator import rendering

from lading.models import specs

UID = "00000000-0000-0000-0000-000000000002"
DIGEST = "sha256:" + "0f" * 32
AFFINITY = {"nodeAffinity": {
    "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-L40S"]}]},
    ]},
    "preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 50, "preference": {"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In",
                                                            "values": ["eu-west-1a"]}]}},
    ],
}}  # fmt: skip
VLLM = {
    "image": f"vllm/vllm-openai@{DIGEST}",
    "resources": {"cpu": "7500m", "memory": "48Gi", "ephemeralStorage": "20Gi"},
    "extraArgs": ["--enable-prefix-caching", "--kv-cache-dtype", "fp8"],
    "env": [{"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"},
            {"name": "S3_KEY", "valueFrom": {"secretKeyRef": {"name": "models", "key": "key"}}}],
    "runtimeClassName": "nvidia",
    "priorityClassName": "gpu-serving",
    "affinity": AFFINITY,
    "modelCache": {"claimName": "qwen-model-cache"},
}  # fmt: skip


def _pool(vllm: dict[str, Any]) -> specs.InferencePool:
    return specs.InferencePool.model_validate({
        "metadata": {"name": "qwen", "namespace": "lading-system"},
        "spec": {"provider": "vllm", "model": "Qwen/Qwen2.5-7B-Instruct", "vllm": vllm},
    })  # fmt: skip


@pytest.fixture(scope="module")
def deployment() -> dict[str, Any]:
    rendered = rendering.vllm_deployment(_pool(VLLM), uid=UID)
    kubernetes_validate.validate(rendered, kubernetes_validate.latest_version(), strict=True)
    return rendered


def test_requests_besides_the_gpus(deployment: dict[str, Any]) -> None:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["resources"] == {
        "limits": {"nvidia.com/gpu": "1"},
        "requests": {"cpu": "7500m", "memory": "48Gi", "ephemeral-storage": "20Gi"},
    }
    plain = rendering.vllm_deployment(_pool({}), uid=UID)["spec"]["template"]["spec"]["containers"][0]
    assert plain["resources"] == {"limits": {"nvidia.com/gpu": "1"}}, "no requests unless asked for"


def test_extra_args_follow_the_rendered_ones_and_env_adds_values_and_secret_keys(deployment: dict[str, Any]) -> None:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["args"][-3:] == ["--enable-prefix-caching", "--kv-cache-dtype", "fp8"]
    assert container["args"][container["args"].index("--port") + 1] == "8000"
    env = {variable["name"]: variable for variable in container["env"]}
    assert env["VLLM_LOGGING_LEVEL"] == {"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"}
    assert env["S3_KEY"]["valueFrom"] == {"secretKeyRef": {"name": "models", "key": "key"}}
    assert env["HF_HOME"]["value"] == "/models/huggingface", "the operator's own stay"


def test_pod_runtime_priority_affinity_cache_and_a_digest_pinned_image(deployment: dict[str, Any]) -> None:
    pod = deployment["spec"]["template"]["spec"]
    assert pod["runtimeClassName"] == "nvidia" and pod["priorityClassName"] == "gpu-serving"
    assert pod["affinity"] == AFFINITY
    assert {"name": "model-cache", "persistentVolumeClaim": {"claimName": "qwen-model-cache"}} in pod["volumes"]
    assert pod["containers"][0]["image"] == f"vllm/vllm-openai@{DIGEST}"
    plain = rendering.vllm_deployment(_pool({}), uid=UID)["spec"]["template"]["spec"]
    assert not {"runtimeClassName", "priorityClassName", "affinity"} & set(plain)


def test_the_default_image_is_a_pinned_current_vllm_release() -> None:
    image = rendering.vllm_deployment(_pool({}), uid=UID)["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == specs.VLLM_IMAGE_DEFAULT == "vllm/vllm-openai:v0.19.1"


@pytest.mark.parametrize(
    ("vllm", "message"),
    [
        ({"extraArgs": ["--port=9000"]}, "--port is rendered by the operator"),
        ({"extraArgs": ["--served-model-name", "x"]}, "--served-model-name is rendered by the operator"),
        ({"env": [{"name": "HF_TOKEN", "value": "hf_x"}]}, "HF_TOKEN is rendered by the operator"),
        ({"env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]}, "A is given twice"),
        ({"env": [{"name": "A"}]}, "give exactly one of value and valueFrom"),
        ({"resources": {"cpu": "8 cores"}}, "String should match pattern"),
        ({"affinity": {"podAffinity": {}}}, "Extra inputs are not permitted"),
    ],
)
def test_what_the_operator_renders_itself_cannot_be_overridden_and_bad_values_are_named(
    vllm: dict[str, Any], message: str
) -> None:
    with pytest.raises(pydantic.ValidationError, match=message):
        _pool(vllm)
