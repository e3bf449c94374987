"""An InferencePool's objects and status as its spec changes over time: what it no longer renders is
pruned, what is not its own is never adopted, removed settings leave the Deployment, stale status
fields go, and an equivalent quantity is not drift."""

from __future__ import annotations

from typing import Any

import asyncpg
from kmock._internal import enums
from lading_operator import kube

from tests.integration.operator import conftest
from tests.support import kube_emulator, waiting

DEPLOYMENTS = "apps/v1/deployments"
SERVICES = "v1/services"
SCALED_OBJECTS = "keda.sh/v1alpha1/scaledobjects"
TRIGGER_AUTHS = "keda.sh/v1alpha1/triggerauthentications"
POOLS = "lading.dev/v1alpha1/inferencepools"
NS = "lading-system"
MODEL = "Qwen/Qwen2.5-7B-Instruct"


def _pool_path(name: str) -> str:
    return kube.path(conftest.GROUP_VERSION, "inferencepools", namespace=NS, name=name)


def _condition(obj: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in obj.get("status", {}).get("conditions", []) if c["type"] == type_), {})


async def _gone(emulator: kube_emulator.KubeEmulator, resource: str, name: str) -> None:
    async def absent() -> bool:
        return emulator.stored(resource, NS, name) is None

    await waiting.until(absent, timeout_s=20)


async def test_objects_the_pool_no_longer_renders_are_pruned(
    emulator: kube_emulator.KubeEmulator, api: kube.Client, db: asyncpg.Connection, operator: Any
) -> None:
    await conftest.create_pool(api, NS, "gpu", provider="vllm", model=MODEL, vllm={"nodeSelector": {"gpu": "h100"}})
    await conftest.create_pool(api, NS, "keda", workers={"scaling": "keda"})
    engine = await kube_emulator.wait_for(emulator, DEPLOYMENTS, NS, "gpu-vllm", lambda o: True)
    assert engine["spec"]["template"]["spec"]["nodeSelector"] == {"gpu": "h100"}
    await kube_emulator.wait_for(emulator, SERVICES, NS, "gpu-vllm", lambda o: True)
    await kube_emulator.wait_for(emulator, SCALED_OBJECTS, NS, "keda-worker", lambda o: True)
    await kube_emulator.wait_for(emulator, TRIGGER_AUTHS, NS, "keda-worker", lambda o: True)

    # Removing the node selector removes it from the Deployment (not only stops setting it).
    await api.merge_patch(_pool_path("gpu"), {"spec": {"vllm": {"nodeSelector": None}}})
    await kube_emulator.wait_for(
        emulator, DEPLOYMENTS, NS, "gpu-vllm", lambda o: "nodeSelector" not in o["spec"]["template"]["spec"]
    )

    # vllm -> an external provider: the GPU Deployment and its Service go, the workers stay.
    await api.merge_patch(_pool_path("gpu"), {"spec": {
        "provider": "openai-compatible", "vllm": None, "endpoint": {"url": "http://model.example:8000/v1"},
    }})  # fmt: skip
    await _gone(emulator, DEPLOYMENTS, "gpu-vllm")
    await _gone(emulator, SERVICES, "gpu-vllm")
    # keda -> builtin: no ScaledObject left to fight the builtin scaler.
    await api.merge_patch(_pool_path("keda"), {"spec": {"workers": {"scaling": "builtin"}}})
    await _gone(emulator, SCALED_OBJECTS, "keda-worker")
    await _gone(emulator, TRIGGER_AUTHS, "keda-worker")
    for name in ("gpu-worker", "keda-worker"):
        assert emulator.stored(DEPLOYMENTS, NS, name) is not None


async def test_not_adopted_objects_stale_status_fields_and_equivalent_quantities(
    emulator: kube_emulator.KubeEmulator, api: kube.Client, db: asyncpg.Connection, operator: Any
) -> None:
    theirs = {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "taken-worker", "namespace": NS, "labels": {"app.kubernetes.io/managed-by": "lading"}},
        "spec": {"selector": {"matchLabels": {"app": "theirs"}}, "template": {
            "metadata": {"labels": {"app": "theirs"}},
            "spec": {"containers": [{"name": "app", "image": "theirs:1"}]}}},
    }  # fmt: skip
    await api.create(kube.path("apps/v1", "deployments", namespace=NS), theirs)
    await conftest.create_pool(api, NS, "taken")

    pool = await kube_emulator.wait_for(
        emulator, POOLS, NS, "taken", lambda o: _condition(o, "Ready").get("reason") == "ResourceExists"
    )
    assert _condition(pool, "Ready")["status"] == "False"
    assert "deployments/taken-worker" in _condition(pool, "Ready")["message"]
    assert _condition(pool, "Reconciling")["status"] == "False", "only a person can move it on"
    stored = emulator.stored(DEPLOYMENTS, NS, "taken-worker")
    assert stored is not None and not stored["metadata"].get("ownerReferences")
    assert stored["spec"]["template"]["spec"]["containers"][0]["image"] == "theirs:1"

    # Once it is gone, the pool makes its own.
    assert await api.delete(kube.path("apps/v1", "deployments", namespace=NS, name="taken-worker"))
    await kube_emulator.wait_for(
        emulator, DEPLOYMENTS, NS, "taken-worker", lambda o: bool(o["metadata"].get("ownerReferences"))
    )
    await kube_emulator.wait_for(emulator, POOLS, NS, "taken", lambda o: _condition(o, "Ready").get("status") == "True")

    await conftest.create_pool(api, NS, "ext", provider="openai-compatible", model=MODEL,
                               endpoint={"url": "http://model.example:8000/v1"})  # fmt: skip
    worker = await kube_emulator.wait_for(emulator, DEPLOYMENTS, NS, "ext-worker", lambda o: True)
    await kube_emulator.wait_for(emulator, POOLS, NS, "ext", lambda o: "workers" in o.get("status", {}))

    # The API server spells quantities canonically (1Gi may read back as 1024Mi, 100m as 0.1): the same
    # amounts, so the operator applies nothing. The pool's next reconciles (the pause below shows they ran
    # after the respelling) leave the Deployment as it is.
    deployment = kube.path("apps/v1", "deployments", namespace=NS, name="ext-worker")
    container = worker["spec"]["template"]["spec"]["containers"][0]
    resources = container["resources"]
    assert resources["limits"]["memory"] == "1Gi" and resources["requests"]["cpu"] == "100m"
    respelt = {**container, "resources": {"requests": {**resources["requests"], "cpu": "0.1"},
                                          "limits": {**resources["limits"], "memory": "1024Mi"}}}  # fmt: skip
    await api.merge_patch(deployment, {"spec": {"template": {"spec": {"containers": [respelt]}}}})
    since = emulator.count()

    # The provider refused the key: workers pause the pool; status says until when. Then it is over.
    await db.execute("UPDATE pools SET paused_until = now() + interval '1 hour', paused_reason = 'HTTP 401' "
                     "WHERE name = 'lading-system/ext'")  # fmt: skip
    await kube_emulator.wait_for(emulator, POOLS, NS, "ext", lambda o: "pausedUntil" in o.get("status", {}))
    await db.execute("UPDATE pools SET paused_until = NULL WHERE name = 'lading-system/ext'")
    pool = await kube_emulator.wait_for(emulator, POOLS, NS, "ext", lambda o: "pausedUntil" not in o["status"])
    assert _condition(pool, "Paused")["status"] == "False"

    applies = [r for r in list(emulator._requests)[since:]
               if r.name == "ext-worker" and "apply-patch" in r.headers.get("Content-Type", "")]  # fmt: skip
    assert applies == [], "an equivalent quantity is not drift"
    # The pool read its worker Deployment from what the watch said, not with a GET.
    reads = [r for r in list(emulator._requests)[since:] if r.name == "ext-worker" and r.method == enums.method.GET]
    assert reads == []
    stored = emulator.stored(DEPLOYMENTS, NS, "ext-worker")
    assert stored is not None
    assert stored["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["memory"] == "1024Mi"

    # A real edit (an annotation we render) is applied back; the apply sends the rendering whole.
    edit = {"spec": {"template": {"metadata": {"annotations": {"prometheus.io/port": "1"}}}}}
    await api.merge_patch(deployment, edit)
    fixed = await kube_emulator.wait_for(
        emulator, DEPLOYMENTS, NS, "ext-worker",
        lambda o: o["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"] != "1",
    )  # fmt: skip
    assert fixed["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["memory"] == "1Gi"
    managers = [(m["manager"], m["operation"]) for m in fixed["metadata"]["managedFields"]]
    assert ("lading-operator", "Apply") in managers
