"""From a vLLM server's /metrics to the worker Deployment's replicas: scrape, headroom, decision, rendering."""

from __future__ import annotations

import datetime as dt
from typing import Any

import aiohttp
import kubernetes_validate  # type: ignore[import-untyped]
import pytest
from lading_operator import headroom, rendering, scaling

from lading.models import specs
from tests.support import vllm_stub

NOW = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)
POOL = specs.InferencePool.model_validate({
    "metadata": {"name": "qwen", "namespace": "lading-system"},
    "spec": {
        "provider": "vllm",
        "model": "Qwen/Qwen2.5-7B-Instruct",
        "vllm": {"engineArgs": {"maxNumSeqs": 256}},
        "limits": {"requestsPerMinute": 60_000, "tokensPerMinute": 100_000_000, "maxConcurrency": 1000},
        "workers": {"maxReplicas": 20, "concurrency": 32, "scaleDownStabilizationSeconds": 0},
    },
})


async def scaled(stub: vllm_stub.VllmStub, *, current: int, backlog: int, timeout_s: float = 2.0) -> dict[str, Any]:
    """One operator tick: scrape the stub, decide, render the worker Deployment with the decision."""
    async with aiohttp.ClientSession() as session:
        load = await headroom.scrape_vllm(session, stub.metrics_url, timeout_s=timeout_s)
    room = headroom.vllm_headroom(load, max_num_seqs=256)
    decision, _ = scaling.decide(
        POOL.spec,
        scaling.Signals(now=NOW, current_replicas=current, eligible_backlog=backlog, oldest_eligible_age_s=90,
                        mean_latency_s=10.0, mean_tokens_per_attempt=1500.0, headroom=room),
        scaling.ScaleState(),
    )
    deployment = rendering.worker_deployment(POOL, uid="uid-1", config=rendering.OperatorConfig(),
                                             replicas=decision.replicas)
    kubernetes_validate.validate(deployment, "1.37.0", strict=True)
    return {"replicas": deployment["spec"]["replicas"], "reason": decision.reason, "headroom": room.render()}


async def test_an_idle_engine_lets_the_workers_scale_up() -> None:
    async with vllm_stub.running() as stub:
        stub.set_load(running=0, waiting=0, kv_cache=0.02)
        result = await scaled(stub, current=0, backlog=3200)
    # 3200 jobs in 120 s at 10 s each = 267 calls = 9 workers of 32.
    assert result == {"replicas": 9, "headroom": "0.98",
                      "reason": "backlog 3200, oldest 90s ≤ target 120s: scale up 0→9"}


async def test_a_queueing_engine_holds_the_workers() -> None:
    async with vllm_stub.running() as stub:
        stub.set_load(running=256, waiting=5, kv_cache=0.7)
        result = await scaled(stub, current=3, backlog=3200)
    assert result["replicas"] == 3
    assert result["headroom"] == "0.00"
    assert result["reason"].endswith("hold 3, no headroom (vLLM: 5 requests waiting, KV cache 70%)")


async def test_a_full_kv_cache_holds_the_workers() -> None:
    async with vllm_stub.running() as stub:
        stub.mode = "legacy"
        stub.set_load(running=40, waiting=0, kv_cache=0.93)
        result = await scaled(stub, current=2, backlog=3200)
    assert result["replicas"] == 2
    assert "no headroom (vLLM: KV cache 93% used)" in result["reason"]


async def test_partial_headroom_limits_the_step() -> None:
    async with vllm_stub.running() as stub:
        stub.set_load(running=192, waiting=0, kv_cache=0.3)
        result = await scaled(stub, current=3, backlog=3200)
    # 3 workers fill 75% of 256 sequences: 4 would fill them all.
    assert result["replicas"] == 4
    assert result["reason"].endswith("scale up 3→4, headroom 0.25 allows 4")


@pytest.mark.parametrize("mode", ["garbage", "status-500", "hang"])
async def test_an_unreadable_engine_is_unknown_headroom_and_demand_decides(mode: str) -> None:
    async with vllm_stub.running() as stub:
        stub.mode = mode
        result = await scaled(stub, current=1, backlog=3200, timeout_s=0.3)
    assert result == {"replicas": 9, "headroom": None,
                      "reason": "backlog 3200, oldest 90s ≤ target 120s: scale up 1→9"}
