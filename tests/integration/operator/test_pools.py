"""InferencePool reconciler: owned objects rendered and kept in shape, the scaler's decisions applied."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import asyncpg
from lading_operator import kube, pools

from tests.integration.operator import conftest
from tests.support import kube_emulator, vllm_stub

DEPLOYMENTS = "apps/v1/deployments"
SERVICES = "v1/services"
POOLS = "lading.dev/v1alpha1/inferencepools"
BATCHES = "lading.dev/v1alpha1/extractionbatches"
MODEL = "Qwen/Qwen2.5-7B-Instruct"


def _owned_by(obj: dict[str, Any], pool: dict[str, Any]) -> bool:
    refs = obj["metadata"].get("ownerReferences") or []
    return any(r["kind"] == "InferencePool" and r["uid"] == pool["metadata"]["uid"] and r["controller"] for r in refs)


def _condition(obj: dict[str, Any], type_: str) -> dict[str, Any]:
    return next(c for c in obj.get("status", {}).get("conditions", []) if c["type"] == type_)


async def test_vllm_pool_renders_owned_objects_and_corrects_drift(
    emulator: kube_emulator.KubeEmulator, api: kube.Client, db: asyncpg.Connection, operator: Any
) -> None:
    pool = await conftest.create_pool(api, "lading-system", "qwen", provider="vllm", model=MODEL)

    engine = await kube_emulator.wait_for(emulator, DEPLOYMENTS, "lading-system", "qwen-vllm", lambda o: True)
    service = await kube_emulator.wait_for(emulator, SERVICES, "lading-system", "qwen-vllm", lambda o: True)
    worker = await kube_emulator.wait_for(emulator, DEPLOYMENTS, "lading-system", "qwen-worker", lambda o: True)
    for obj in (engine, service, worker):
        assert _owned_by(obj, pool), obj["metadata"]
    container = worker["spec"]["template"]["spec"]["containers"][0]
    assert "--pool" in container["args"] and "lading-system/qwen" in container["args"]
    assert any(e["name"] == "DATABASE_URL" and "secretKeyRef" in e["valueFrom"] for e in container["env"])
    assert await db.fetchval("SELECT provider FROM pools WHERE name = 'lading-system/qwen'") == "vllm"

    status = await kube_emulator.wait_for(
        emulator, POOLS, "lading-system", "qwen", lambda o: "endpoint" in o.get("status", {})
    )
    assert status["status"]["endpoint"] == "http://qwen-vllm.lading-system.svc:8000/v1"
    # No vLLM replica is ready (nothing runs pods here): starting while the engine is wanted, or scaled
    # to zero once the idle pool's scaler has said so (Ready=True, kstatus Current); which one the first
    # status shows depends on whether the scaler has run yet.
    ready = _condition(status, "Ready")
    assert (ready["status"], ready["reason"]) in {("False", "EngineStarting"), ("True", "ScaledToZero")}, ready
    assert ready["message"].startswith("0/"), ready
    # kstatus: Reconciling while the engine is starting (InProgress), not once scaled to zero as asked.
    reconciling = _condition(status, "Reconciling")
    starting = ready["reason"] == "EngineStarting"
    assert (reconciling["status"], reconciling["reason"]) == (
        ("True", "EngineStarting") if starting else ("False", "Reconciled")
    ), reconciling

    # Drift: someone edits the worker's image and deletes the Service.
    worker_path = kube.path("apps/v1", "deployments", namespace="lading-system", name="qwen-worker")
    edited = {"spec": {"template": {"spec": {"containers": [{**container, "image": "evil/image:latest"}]}}}}
    await api.merge_patch(worker_path, edited)
    assert await api.delete(kube.path("v1", "services", namespace="lading-system", name="qwen-vllm"))

    await kube_emulator.wait_for(
        emulator, DEPLOYMENTS, "lading-system", "qwen-worker",
        lambda o: o["spec"]["template"]["spec"]["containers"][0]["image"] == container["image"],
    )  # fmt: skip
    recreated = await kube_emulator.wait_for(emulator, SERVICES, "lading-system", "qwen-vllm", lambda o: True)
    assert _owned_by(recreated, pool)


async def test_scaler_decisions_from_vllm_metrics_are_applied_to_the_worker_deployment(
    emulator: kube_emulator.KubeEmulator, api: kube.Client, db: asyncpg.Connection, operator_factory: Any
) -> None:
    # The stub listens on loopback: the annotation is honoured only with the override and an allowance.
    with operator_factory(vllm_metrics_override=True, egress_allow=("127.0.0.0/8",)) as handle:
        await asyncio.get_running_loop().run_in_executor(None, handle.ready.wait, 30)
        await _scaler_decisions_from_vllm_metrics(emulator, api)


async def _scaler_decisions_from_vllm_metrics(emulator: kube_emulator.KubeEmulator, api: kube.Client) -> None:
    async with vllm_stub.running() as stub:
        stub.set_load(running=2, waiting=0, kv_cache=0.2)
        body = conftest.pool_body(
            "acme", "qwen", provider="vllm", model=MODEL,
            workers={"minReplicas": 0, "maxReplicas": 6, "concurrency": 4, "targetOldestAgeSeconds": 1},
        )  # fmt: skip
        body["metadata"]["annotations"] = {pools.METRICS_URL_ANNOTATION: stub.metrics_url}
        await api.create(kube.path(conftest.GROUP_VERSION, "inferencepools", namespace="acme"), body)
        engine_path = kube.path("apps/v1", "deployments", namespace="acme", name="qwen-vllm")
        await kube_emulator.wait_for(emulator, DEPLOYMENTS, "acme", "qwen-vllm", lambda o: True)
        # No kubelet here: the test plays the Deployment controller and reports one ready replica.
        await api.merge_patch(engine_path + "/status", {"status": {"readyReplicas": 1, "replicas": 1}})

        await conftest.create_quota(api, "acme", ["acme"])
        await conftest.create_batch(api, "acme", "backlog", documents=40, inferencePoolRef={"name": "qwen"})
        await kube_emulator.wait_for(
            emulator, BATCHES, "acme", "backlog", lambda o: o.get("status", {}).get("phase") == "Running"
        )

        scaled = await kube_emulator.wait_for(
            emulator, DEPLOYMENTS, "acme", "qwen-worker", lambda o: (o["spec"].get("replicas") or 0) >= 2
        )
        pool = await kube_emulator.wait_for(
            emulator, POOLS, "acme", "qwen",
            lambda o: o.get("status", {}).get("desiredWorkers") == scaled["spec"]["replicas"],
        )  # fmt: skip
        assert "backlog 40" in pool["status"]["scalingReason"], pool["status"]
        assert pool["status"]["readyReplicas"] == 1
        assert pool["status"]["headroom"] is not None and float(pool["status"]["headroom"]) > 0
        assert stub.scrapes > 0

        # The model server starts queueing: no headroom, and the status says so.
        stub.set_load(running=256, waiting=30, kv_cache=0.95)
        await kube_emulator.wait_for(
            emulator, POOLS, "acme", "qwen", lambda o: o.get("status", {}).get("headroom") == "0.00"
        )


async def test_worker_pods_get_the_signing_secrets_of_ready_endpoints_by_reference(
    emulator: kube_emulator.KubeEmulator, api: kube.Client, db: asyncpg.Connection, operator: Any
) -> None:
    await conftest.create_pool(api, "acme", "builtin")
    await kube_emulator.wait_for(emulator, DEPLOYMENTS, "acme", "builtin-worker", lambda o: True)
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "erp-signing", "namespace": "acme"},
              "stringData": {"secret": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}}  # fmt: skip
    await api.create(kube.path("v1", "secrets", namespace="acme"), secret)
    endpoint = {
        "apiVersion": conftest.GROUP_VERSION, "kind": "DeliveryEndpoint",
        "metadata": {"name": "erp", "namespace": "acme"},
        "spec": {"url": "https://erp.acme.example/hook", "secretRef": {"name": "erp-signing", "key": "secret"}},
    }  # fmt: skip
    await api.create(kube.path(conftest.GROUP_VERSION, "deliveryendpoints", namespace="acme"), endpoint)

    def projects_the_secret(worker: dict[str, Any]) -> bool:
        return "erp-signing" in json.dumps(worker["spec"]["template"]["spec"].get("volumes", []))

    worker = await kube_emulator.wait_for(emulator, DEPLOYMENTS, "acme", "builtin-worker", projects_the_secret)
    text = json.dumps(worker)
    assert "acme.erp" in text, "the file is named <namespace>.<name>"
    assert "whsec_" not in text, "the value itself is never copied"
    env = {e["name"]: e for e in worker["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["LADING_ENDPOINT_SECRETS_DIR"]["value"] == "/etc/lading/endpoint-secrets"
