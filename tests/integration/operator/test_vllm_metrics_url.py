"""
Where the operator reads a vllm pool's metrics: its own Service, unless the operator runs with
`--allow-vllm-metrics-override`; even then the annotation's URL passes the egress policy. An
ignored or refused URL is never requested, and the pool says why (a Warning Event).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from typing import Any

from lading_operator import headroom, kube

from tests.integration.operator import conftest
from tests.support import kube_emulator, vllm_stub
from tests.support.waiting import until

NAMESPACE = "lading-system"
DEPLOYMENTS = "apps/v1/deployments"
POOLS = "lading.dev/v1alpha1/inferencepools"
SECRET_QUERY = "token=SECRETSIG"


def _events(emulator: kube_emulator.KubeEmulator) -> list[dict[str, Any]]:
    stored = (emulator.stored("v1/events", NAMESPACE, n) for n in emulator.names("v1/events", NAMESPACE))
    return [e for e in stored if e]


async def _annotated_pool(api: kube.Client, emulator: kube_emulator.KubeEmulator, url: str) -> None:
    body = conftest.pool_body(NAMESPACE, "qwen", provider="vllm", model="Qwen/Qwen2.5-7B-Instruct")
    body["metadata"]["annotations"] = {headroom.METRICS_URL_ANNOTATION: url}
    await api.create(kube.path(conftest.GROUP_VERSION, "inferencepools", namespace=NAMESPACE), body)
    await kube_emulator.wait_for(emulator, DEPLOYMENTS, NAMESPACE, "qwen-vllm", lambda o: True)
    engine = kube.path("apps/v1", "deployments", namespace=NAMESPACE, name="qwen-vllm")
    # No kubelet here: the test plays the Deployment controller and reports one ready replica.
    await api.merge_patch(engine + "/status", {"status": {"readyReplicas": 1, "replicas": 1}})


async def _reason_posted(emulator: kube_emulator.KubeEmulator, reason: str) -> dict[str, Any]:
    async def posted() -> bool:
        return any(e.get("reason") == reason for e in _events(emulator))

    await until(posted, timeout_s=20)
    return next(e for e in _events(emulator) if e.get("reason") == reason)


async def _reconciled(emulator: kube_emulator.KubeEmulator) -> None:
    """The reconcile that saw the ready replica (the one that posted the Event, after deciding
    where to scrape) has written its status: any request it made has been made."""
    await kube_emulator.wait_for(
        emulator, POOLS, NAMESPACE, "qwen", lambda o: o.get("status", {}).get("readyReplicas") == 1
    )


OperatorFactory = Callable[..., contextlib.AbstractContextManager[conftest.OperatorThread]]


async def _started(handle: conftest.OperatorThread) -> None:
    await asyncio.get_running_loop().run_in_executor(None, handle.ready.wait, 30)


async def test_without_the_override_flag_the_annotation_is_ignored_and_never_requested(
    emulator: kube_emulator.KubeEmulator, api: kube.Client, db: Any, operator_factory: OperatorFactory
) -> None:
    async with vllm_stub.running() as stub:
        with operator_factory() as handle:
            await _started(handle)
            await _annotated_pool(api, emulator, f"{stub.metrics_url}?{SECRET_QUERY}")
            event = await _reason_posted(emulator, headroom.METRICS_URL_IGNORED)
            await _reconciled(emulator)
        assert stub.scrapes == 0
    assert "--allow-vllm-metrics-override" in event["message"] and event["type"] == "Warning"
    ignored = [e for e in _events(emulator) if e.get("reason") == headroom.METRICS_URL_IGNORED]
    assert len(ignored) == 1, "reported once, not on every scrape"
    pool = emulator.stored(POOLS, NAMESPACE, "qwen")
    assert pool is not None and "SECRETSIG" not in json.dumps([*_events(emulator), pool["status"]])


async def test_with_the_override_a_loopback_url_not_allowed_is_refused_and_never_requested(
    emulator: kube_emulator.KubeEmulator, api: kube.Client, db: Any, operator_factory: OperatorFactory
) -> None:
    async with vllm_stub.running() as stub:
        with operator_factory(vllm_metrics_override=True) as handle:
            await _started(handle)
            await _annotated_pool(api, emulator, f"{stub.metrics_url}?{SECRET_QUERY}")
            event = await _reason_posted(emulator, headroom.METRICS_URL_REFUSED)
            await _reconciled(emulator)
        assert stub.scrapes == 0
    assert "refused: a loopback address" in event["message"], event["message"]
    pool = emulator.stored(POOLS, NAMESPACE, "qwen")
    assert pool is not None and "SECRETSIG" not in json.dumps([*_events(emulator), pool["status"]])


async def test_with_the_override_and_an_allowance_the_annotation_is_scraped(
    emulator: kube_emulator.KubeEmulator, api: kube.Client, db: Any, operator_factory: OperatorFactory
) -> None:
    async with vllm_stub.running() as stub:
        stub.set_load(running=2, waiting=0, kv_cache=0.2)
        with operator_factory(vllm_metrics_override=True, egress_allow=("127.0.0.0/8",)) as handle:
            await _started(handle)
            await _annotated_pool(api, emulator, stub.metrics_url)
            await kube_emulator.wait_for(
                emulator, POOLS, NAMESPACE, "qwen", lambda o: o.get("status", {}).get("headroom") not in (None, "0.00")
            )
        assert stub.scrapes > 0
    assert not [e for e in _events(emulator) if e.get("reason", "").startswith("MetricsUrl")]
