"""The operator records the GPU time of a vLLM pool priced by the GPU hour (docs/cost.md): each time it
observes the vLLM Deployment, a sample of its ready replicas and GPUs per replica, which the GPU-time
allocator integrates; a pool priced per token, or unpriced, records none."""

from __future__ import annotations

from typing import Any

import asyncpg
from lading_operator import kube

from tests.integration.operator import conftest
from tests.support import kube_emulator, waiting

DEPLOYMENTS = "apps/v1/deployments"
MODEL = "Qwen/Qwen2.5-7B-Instruct"


async def test_the_operator_samples_the_ready_replicas_of_a_gpu_priced_vllm_pool(
    emulator: kube_emulator.KubeEmulator, api: kube.Client, db: asyncpg.Connection, operator: Any
) -> None:
    await conftest.create_pool(
        api, "gpu", "qwen", provider="vllm", model=MODEL, vllm={"gpus": 2},
        pricing={"currency": "EUR", "gpuHourPrice": "2.50"},
    )  # fmt: skip
    await conftest.create_pool(
        api, "gpu", "tokens", provider="vllm", model=MODEL,
        pricing={"currency": "EUR", "inputPerMillionTokens": "0.1", "outputPerMillionTokens": "0.2"},
    )  # fmt: skip
    await kube_emulator.wait_for(emulator, DEPLOYMENTS, "gpu", "qwen-vllm", lambda o: True)
    # No kubelet here: the test plays the Deployment controller and reports three ready replicas.
    engine = kube.path("apps/v1", "deployments", namespace="gpu", name="qwen-vllm")
    await api.merge_patch(engine + "/status", {"status": {"readyReplicas": 3, "replicas": 3}})

    async def sampled() -> bool:
        return bool(await db.fetchval(
            "SELECT count(*) FROM pool_gpu_samples WHERE pool = 'gpu/qwen' AND ready_replicas = 3 AND gpus = 2"
        ))  # fmt: skip

    await waiting.until(sampled, timeout_s=30)
    await kube_emulator.wait_for(emulator, DEPLOYMENTS, "gpu", "tokens-vllm", lambda o: True)
    assert await db.fetchval("SELECT count(*) FROM pool_gpu_samples WHERE pool <> 'gpu/qwen'") == 0
