"""The emulator's server-side apply and label-selector watches: the API server behaviour the operator's
apply of owned objects (pool_steps/owned.py, mirroring.py) and its watch of owned Deployments rely on."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
from lading_operator import kube

from tests.support import kube_emulator

NS = "lading-system"
DEPLOYMENT = kube.path("apps/v1", "deployments", namespace=NS, name="w")


def _deployment(**pod: Any) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "w", "namespace": NS, "labels": {"app.kubernetes.io/managed-by": "lading"}},
        "spec": {"selector": {"matchLabels": {"app": "w"}}, "template": {
            "metadata": {"labels": {"app": "w"}},
            "spec": {"containers": [{"name": "w", "image": "lading:1"}], **pod}}},
    }  # fmt: skip


def _managers(obj: dict[str, Any]) -> list[tuple[str, str]]:
    return [(m["manager"], m["operation"]) for m in obj["metadata"].get("managedFields") or []]


async def _raw_patch(server: str, path: str, body: Any, *, manager: str | None, force: bool) -> tuple[int, Any]:
    params = {"force": "true"} if force else {}
    if manager is not None:
        params["fieldManager"] = manager
    async with aiohttp.ClientSession() as session, session.patch(
        server + path, params=params, data=json.dumps(body),
        headers={"Content-Type": "application/apply-patch+yaml"},
    ) as response:  # fmt: skip
        return response.status, await response.json()


async def test_apply_creates_records_its_manager_and_removes_what_it_no_longer_applies() -> None:
    async with kube_emulator.serving(validate=False) as emulator, kube.Client(
        kube.for_server(str(emulator.servers[0].url))
    ) as api:
        created = await api.apply(DEPLOYMENT, _deployment(nodeSelector={"gpu": "h100"}))
        assert _managers(created) == [("lading-operator", "Apply")]
        fields = created["metadata"]["managedFields"][0]["fieldsV1"]
        assert "f:nodeSelector" in fields["f:spec"]["f:template"]["f:spec"]
        version = created["metadata"]["resourceVersion"]

        # The same apply again changes nothing, not even the resourceVersion.
        again = await api.apply(DEPLOYMENT, _deployment(nodeSelector={"gpu": "h100"}))
        assert again["metadata"]["resourceVersion"] == version

        # Someone else adds a key to the node selector and sets the replicas; they are theirs.
        theirs = {"spec": {"replicas": 3, "template": {"spec": {"nodeSelector": {"zone": "a"}}}}}
        await api.merge_patch(DEPLOYMENT, theirs)
        applied = await api.apply(DEPLOYMENT, _deployment())
        pod = applied["spec"]["template"]["spec"]
        assert pod["nodeSelector"] == {"zone": "a"}, "our key is removed, theirs stays"
        assert applied["spec"]["replicas"] == 3

        applied = await api.apply(DEPLOYMENT, _deployment(tolerations=[{"key": "gpu", "operator": "Exists"}]))
        assert applied["spec"]["template"]["spec"]["tolerations"] == [{"key": "gpu", "operator": "Exists"}]
        applied = await api.apply(DEPLOYMENT, _deployment())
        assert "tolerations" not in applied["spec"]["template"]["spec"]
        # A field the applier owned and someone changed since is no longer the applier's: it stays.
        await api.apply(DEPLOYMENT, _deployment(priorityClassName="high"))
        await api.merge_patch(DEPLOYMENT, {"spec": {"template": {"spec": {"priorityClassName": "low"}}}})
        applied = await api.apply(DEPLOYMENT, _deployment())
        assert applied["spec"]["template"]["spec"]["priorityClassName"] == "low"


async def test_apply_without_force_conflicts_with_another_managers_value() -> None:
    async with kube_emulator.serving(validate=False) as emulator:
        server = str(emulator.servers[0].url).rstrip("/")
        status, _ = await _raw_patch(server, DEPLOYMENT, _deployment(), manager="lading-operator", force=True)
        assert status == 201
        status, body = await _raw_patch(server, DEPLOYMENT, _deployment(nodeSelector={"a": "b"}), manager=None,
                                        force=True)  # fmt: skip
        assert status == 400 and "fieldManager" in body["message"]
        theirs = _deployment()
        theirs["spec"]["template"]["spec"]["containers"][0]["image"] = "theirs:2"
        status, body = await _raw_patch(server, DEPLOYMENT, theirs, manager="kubectl", force=False)
        assert status == 409 and "spec.template.spec.containers" in body["message"]
        # The same values are shared without conflict; forced, the field changes hands.
        status, shared = await _raw_patch(server, DEPLOYMENT, _deployment(), manager="kubectl", force=False)
        assert status == 200 and sorted(_managers(shared)) == [("kubectl", "Apply"), ("lading-operator", "Apply")]
        status, taken = await _raw_patch(server, DEPLOYMENT, theirs, manager="kubectl", force=True)
        assert status == 200 and taken["spec"]["template"]["spec"]["containers"][0]["image"] == "theirs:2"


async def test_a_watch_with_a_selector_sees_an_object_leave_and_come_back() -> None:
    async with kube_emulator.serving(validate=False) as emulator, kube.Client(
        kube.for_server(str(emulator.servers[0].url))
    ) as api:
        await api.apply(DEPLOYMENT, _deployment())
        url = str(emulator.servers[0].url).rstrip("/") + kube.path("apps/v1", "deployments", namespace=NS)
        events: list[tuple[str, str | None]] = []
        async with aiohttp.ClientSession() as session, session.get(
            url, params={"watch": "true", "labelSelector": "app.kubernetes.io/managed-by=lading"},
        ) as response:  # fmt: skip

            async def read(count: int) -> None:
                while len(events) < count:
                    line = await response.content.readline()
                    if line.strip():
                        event = json.loads(line)
                        labels = event["object"]["metadata"].get("labels") or {}
                        events.append((event["type"], labels.get("app.kubernetes.io/managed-by")))

            await asyncio.wait_for(read(1), timeout=10)
            await api.merge_patch(DEPLOYMENT, {"metadata": {"labels": {"app.kubernetes.io/managed-by": "helm"}}})
            await api.merge_patch(DEPLOYMENT, {"metadata": {"annotations": {"unseen": "yes"}}})
            await api.merge_patch(DEPLOYMENT, {"metadata": {"labels": {"app.kubernetes.io/managed-by": "lading"}}})
            await api.merge_patch(DEPLOYMENT, {"metadata": {"annotations": {"seen": "yes"}}})
            await asyncio.wait_for(read(4), timeout=10)
        # Leaving the selector is a DELETED (of the object as it is now), coming back an ADDED; changes
        # while outside it are not sent.
        assert events == [("ADDED", "lading"), ("DELETED", "helm"), ("ADDED", "lading"), ("MODIFIED", "lading")]
