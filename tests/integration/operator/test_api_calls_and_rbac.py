"""
Every request the operator makes is one the Helm chart's RBAC allows, and its watches of Deployments
and Services ask only for Lading's objects.

The list of calls is not written by hand: the real operator runs on the emulator through the flows
of every kind (quota, endpoint with a mirrored signing secret, a KEDA-scaled vLLM pool and a builtin
one, a batch admitted, drift corrected, everything deleted through its finalizers), the emulator
records each request, and each (API group, resource, verb) is looked up in the rules `helm template`
renders. A call added to the operator without its grant fails here, not with a 403 on a cluster.
"""

from __future__ import annotations

import base64
from typing import Any

import asyncpg
import pytest
import yaml
from kmock._internal import enums
from lading_operator import kube

from tests.integration.chart import test_chart as chart
from tests.integration.operator import conftest
from tests.support import kube_emulator
from tests.support.waiting import until

DEPLOYMENTS = "apps/v1/deployments"
SERVICES = "v1/services"
BATCHES = "lading.dev/v1alpha1/extractionbatches"
POOLS = "lading.dev/v1alpha1/inferencepools"
ENDPOINTS = "lading.dev/v1alpha1/deliveryendpoints"
QUOTAS = "lading.dev/v1alpha1/tenantquotas"
OWNED_SELECTOR = "app.kubernetes.io/managed-by=lading"
DRIVER_TOKEN = "test-driver"

Call = tuple[str, str, str]
"""(API group, resource or resource/subresource, RBAC verb)."""

_VERBS = {
    enums.action.LIST: "list",
    enums.action.WATCH: "watch",
    enums.action.FETCH: "get",
    enums.action.CREATE: "create",
    enums.action.DELETE: "delete",
}


def calls_since(emulator: kube_emulator.KubeEmulator, since: int) -> dict[Call, Any]:
    """The (group, resource, verb) of every resource request served since the `since`-th, one request each."""
    found: dict[Call, Any] = {}
    for request in list(emulator._requests)[since:]:
        if request.resource is None or request.resource.plural is None or request.action is None:
            continue  # discovery (/api, /apis, /version): open to every authenticated user
        resource = str(request.resource.plural)
        if request.subresource:
            resource = f"{resource}/{request.subresource}"
        if request.action == enums.action.UPDATE:
            verb = "update" if request.method == enums.method.PUT else "patch"
        else:
            verb = _VERBS[request.action]
        if request.headers.get("Authorization") == f"Bearer {DRIVER_TOKEN}":
            continue  # the test's own calls
        found.setdefault((str(request.resource.group or ""), resource, verb), request)
        if "apply-patch" in request.headers.get("Content-Type", ""):  # an apply may create the object
            found.setdefault((str(request.resource.group or ""), resource, "create"), request)
    return found


def granted(*helm_args: str) -> set[Call]:
    """Every (group, resource, verb) the ClusterRoles rendered with these `helm template` arguments grant."""
    result = chart.run_helm("template", "lading", str(chart.CHART), "--namespace", "lading-system", *helm_args)
    assert result.returncode == 0, result.stderr
    rules: set[Call] = set()
    for document in yaml.safe_load_all(result.stdout):
        if document and document["kind"] == "ClusterRole":
            for rule in document["rules"]:
                rules |= {(g, r, v) for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}
    return rules


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


async def _exercise_every_kind(emulator: kube_emulator.KubeEmulator, api: kube.Client) -> None:
    await conftest.create_quota(api, "acme", ["acme"])
    await api.create(kube.path("v1", "secrets", namespace="acme"), {
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "erp-signing", "namespace": "acme"},
        "data": {"secret": _b64("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")},
    })  # fmt: skip
    await api.create(kube.path(conftest.GROUP_VERSION, "deliveryendpoints", namespace="acme"), {
        "apiVersion": conftest.GROUP_VERSION, "kind": "DeliveryEndpoint",
        "metadata": {"name": "erp", "namespace": "acme"},
        "spec": {"url": "https://erp.acme.example/hook", "secretRef": {"name": "erp-signing", "key": "secret"}},
    })  # fmt: skip
    await conftest.create_pool(api, "acme", "builtin")
    await conftest.create_pool(
        api, "lading-system", "qwen", provider="vllm", model="Qwen/Qwen2.5-7B-Instruct",
        workers={"scaling": "keda", "maxReplicas": 2},
    )  # fmt: skip
    await conftest.create_batch(api, "acme", "march", documents=3, deliveryEndpointRef={"name": "erp"})

    await kube_emulator.wait_for(emulator, BATCHES, "acme", "march", lambda o: o.get("status", {}).get("total") == 3)
    await kube_emulator.wait_for(emulator, "keda.sh/v1alpha1/triggerauthentications", "lading-system", "qwen-worker",
                                 lambda o: True)  # fmt: skip
    await kube_emulator.wait_for(emulator, "v1/secrets", "lading-system", "lading-endpoint-acme.erp", lambda o: True)

    # Drift: an edited Deployment is patched back, a deleted Service is created again.
    worker = kube.path("apps/v1", "deployments", namespace="acme", name="builtin-worker")
    await api.merge_patch(worker, {"spec": {"template": {"spec": {"terminationGracePeriodSeconds": 1}}}})
    await api.delete(kube.path("v1", "services", namespace="lading-system", name="qwen-vllm"))
    await kube_emulator.wait_for(emulator, SERVICES, "lading-system", "qwen-vllm", lambda o: True)
    await kube_emulator.wait_for(
        emulator, DEPLOYMENTS, "acme", "builtin-worker",
        lambda o: o["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] != 1,
    )  # fmt: skip

    # Everything goes, each through the operator's finalizer or delete handler.
    deletions = [
        (BATCHES, "acme", "march"), (ENDPOINTS, "acme", "erp"), (POOLS, "lading-system", "qwen"),
        (POOLS, "acme", "builtin"), (QUOTAS, None, "acme"),
    ]  # fmt: skip
    for resource, namespace, name in deletions:
        group_version, _, plural = resource.rpartition("/")
        await api.delete(kube.path(group_version, plural, namespace=namespace, name=name))
    for resource, namespace, name in deletions:

        async def gone(resource: str = resource, namespace: str | None = namespace, name: str = name) -> bool:
            return emulator.stored(resource, namespace, name) is None

        try:
            await until(gone, timeout_s=30)
        except TimeoutError:
            left = emulator.stored(resource, namespace, name)
            raise AssertionError(f"{resource} {namespace}/{name} was not deleted: {left}") from None


async def test_every_call_the_operator_makes_is_granted_by_the_charts_rbac(
    emulator: kube_emulator.KubeEmulator, db: asyncpg.Connection, operator: Any
) -> None:
    # The test's own requests carry a token of their own, so they are told apart from the operator's.
    server = str(emulator.servers[0].url).rstrip("/")
    async with kube.Client(kube.for_server(server, token=DRIVER_TOKEN)) as driver:
        await _exercise_every_kind(emulator, driver)
    ours = set(calls_since(emulator, 0))
    assert {("keda.sh", "triggerauthentications", "create"), ("apps", "deployments", "patch"),
            ("", "services", "create"), ("lading.dev", "extractionbatches/status", "patch"),
            ("", "secrets", "delete"), ("lading.dev", "tenantquotas", "patch")} <= ours  # fmt: skip
    assert ("lading.dev", "tenantquotas", "delete") not in ours, "the driver's own calls are not counted"

    with_keda = granted("--set", "rbac.keda=true")
    missing = sorted(call for call in ours if call not in with_keda)
    assert not missing, f"calls the chart's RBAC does not grant: {missing}"
    without_keda = granted()
    assert {call for call in ours if call not in without_keda} == {c for c in ours if c[0] == "keda.sh"}


async def test_deployments_and_services_are_watched_with_the_managed_by_selector(
    emulator: kube_emulator.KubeEmulator, api: kube.Client, db: asyncpg.Connection, operator: Any
) -> None:
    foreign = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "namespace": "acme",
               "labels": {"app.kubernetes.io/managed-by": "Helm"}}, "spec": {}}  # fmt: skip
    await api.create(kube.path("apps/v1", "deployments", namespace="acme"), foreign)
    await conftest.create_pool(api, "acme", "builtin")
    await kube_emulator.wait_for(emulator, DEPLOYMENTS, "acme", "builtin-worker", lambda o: True)

    reads = [
        request for request in emulator._requests
        if request.resource is not None and str(request.resource.plural) in ("deployments", "services")
        and request.action in (enums.action.LIST, enums.action.WATCH) and request.name is None
    ]  # fmt: skip
    assert {str(r.resource.plural) for r in reads if r.resource is not None} == {"deployments", "services"}
    assert {r.params.get("labelSelector") for r in reads} == {OWNED_SELECTOR}

    # What such a watch receives: the emulator filters like the API server does.
    listed = await api.get(kube.path("apps/v1", "deployments", namespace=None) + f"?labelSelector={OWNED_SELECTOR}")
    assert listed is not None and [item["metadata"]["name"] for item in listed["items"]] == ["builtin-worker"]
    everything = await api.get(kube.path("apps/v1", "deployments", namespace=None))
    assert everything is not None and len(everything["items"]) == 2


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("app.kubernetes.io/managed-by=lading", ["ours"]),
        ("app.kubernetes.io/managed-by==lading,lading.dev/pool", ["ours"]),
        ("app.kubernetes.io/managed-by!=lading", ["bare", "theirs"]),
        ("!lading.dev/pool", ["bare", "theirs"]),
    ],
)
async def test_the_emulator_filters_lists_by_label_selector(
    emulator: kube_emulator.KubeEmulator, api: kube.Client, selector: str, expected: list[str]
) -> None:
    labels = {"ours": {"app.kubernetes.io/managed-by": "lading", "lading.dev/pool": "p"},
              "theirs": {"app.kubernetes.io/managed-by": "Helm"}, "bare": {}}  # fmt: skip
    for name, value in labels.items():
        body = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": "a", "labels": value}}
        await api.create(kube.path("v1", "services", namespace="a"), body)
    listed = await api.get(kube.path("v1", "services", namespace="a") + f"?labelSelector={selector}")
    assert listed is not None and sorted(item["metadata"]["name"] for item in listed["items"]) == expected
