"""Signing secrets of tenant DeliveryEndpoints mirrored into the pools' namespace (the real operator, emulated API)."""

from __future__ import annotations

import base64
import hashlib
import json
import logging
from typing import Any

import asyncpg
import pytest
from lading_operator import kube, mirroring

from tests.integration.operator import conftest
from tests.support import kube_emulator, waiting

ENDPOINTS = "lading.dev/v1alpha1/deliveryendpoints"
DEPLOYMENTS = "apps/v1/deployments"
SECRETS = "v1/secrets"
POOL_NAMESPACE = "lading-system"
MIRROR = "lading-endpoint-acme.erp"
FIRST = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
SECOND = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD"


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _projected(worker: dict[str, Any]) -> list[dict[str, Any]]:
    volumes = worker["spec"]["template"]["spec"].get("volumes", [])
    return [s["secret"] for v in volumes if v["name"] == "endpoint-secrets" for s in v["projected"]["sources"]]


async def test_a_tenant_endpoint_secret_is_mirrored_rotated_and_removed_and_its_value_shows_nowhere(
    emulator: kube_emulator.KubeEmulator,
    api: kube.Client,
    db: asyncpg.Connection,
    operator: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    await conftest.create_pool(api, POOL_NAMESPACE, "builtin")
    await kube_emulator.wait_for(emulator, DEPLOYMENTS, POOL_NAMESPACE, "builtin-worker", lambda o: True)
    await _secret_and_endpoint(api, "erp", FIRST)

    # The mirror: same value, one key, labelled and annotated with a digest of the value.
    mirror = await kube_emulator.wait_for(emulator, SECRETS, POOL_NAMESPACE, MIRROR, lambda o: True)
    assert mirror["type"] == "Opaque" and mirror["data"] == {"secret": _b64(FIRST)}
    assert mirror["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "lading", "lading.dev/endpoint": "acme.erp"}
    assert mirror["metadata"]["annotations"] == {
        "lading.dev/endpoint": "acme/erp",
        "lading.dev/secret-sha256": hashlib.sha256(FIRST.encode()).hexdigest(),
    }
    assert emulator.names(SECRETS, "acme") == ["erp-signing"], "nothing is written into the tenant's namespace"

    # The workers in lading-system project the mirror as the file acme.erp.
    worker = await kube_emulator.wait_for(
        emulator, DEPLOYMENTS, POOL_NAMESPACE, "builtin-worker", lambda o: bool(_projected(o))
    )
    assert _projected(worker) == [{"name": MIRROR, "items": [{"key": "secret", "path": "acme.erp"}]}]
    env = {e["name"]: e for e in worker["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["LADING_ENDPOINT_SECRETS_DIR"]["value"] == "/etc/lading/endpoint-secrets"

    # Rotation: a second line, then the old one removed; the mirror follows both steps.
    for value in (f"{SECOND}\n{FIRST}", SECOND):
        await api.merge_patch(
            kube.path("v1", "secrets", namespace="acme", name="erp-signing"), {"data": {"secret": _b64(value)}}
        )
        rotated = await kube_emulator.wait_for(
            emulator, SECRETS, POOL_NAMESPACE, MIRROR, lambda o, v=value: o["data"]["secret"] == _b64(v)
        )
        digest = rotated["metadata"]["annotations"]["lading.dev/secret-sha256"]
        assert digest == hashlib.sha256(value.encode()).hexdigest()
    ready = emulator.stored(ENDPOINTS, "acme", "erp")
    pool = emulator.stored("lading.dev/v1alpha1/inferencepools", POOL_NAMESPACE, "builtin")

    # Deleting the endpoint deletes its mirror and its projection.
    await api.delete(kube.path(conftest.GROUP_VERSION, "deliveryendpoints", namespace="acme", name="erp"))
    await kube_emulator.wait_for(emulator, DEPLOYMENTS, POOL_NAMESPACE, "builtin-worker", lambda o: not _projected(o))
    await _until_gone(emulator, POOL_NAMESPACE, MIRROR)
    assert emulator.stored(SECRETS, "acme", "erp-signing") is not None, "the source Secret is the tenant's"

    # No value, encoded or not, in the endpoint, the pool, any event, or the operator's log.
    events = [emulator.stored("v1/events", ns, n) for ns in ("acme", POOL_NAMESPACE)
              for n in emulator.names("v1/events", ns)]  # fmt: skip
    everything = json.dumps([ready, pool, worker, *events])
    for value in (FIRST, SECOND):
        for text in (everything, caplog.text):
            assert value not in text and _b64(value) not in text
            assert _b64(f"{SECOND}\n{FIRST}") not in text


async def test_mirrors_of_vanished_endpoints_are_swept_and_foreign_secrets_left_alone(
    emulator: kube_emulator.KubeEmulator, api: kube.Client, db: asyncpg.Connection, operator: Any
) -> None:
    secrets = kube.path("v1", "secrets", namespace=POOL_NAMESPACE)
    orphan = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
              "metadata": {"name": "lading-endpoint-acme.gone", "namespace": POOL_NAMESPACE,
                           "labels": {"app.kubernetes.io/managed-by": "lading", "lading.dev/endpoint": "acme.gone"},
                           "annotations": {"lading.dev/endpoint": "acme/gone"}},
              "data": {"secret": _b64(FIRST)}}  # fmt: skip
    await api.create(secrets, orphan)
    foreign = {"apiVersion": "v1", "kind": "Secret",
               "metadata": {"name": "lading-endpoint-acme.other", "namespace": POOL_NAMESPACE},
               "data": {"secret": _b64(SECOND)}}  # fmt: skip
    foreign_stored = await api.create(secrets, foreign)
    await conftest.create_pool(api, POOL_NAMESPACE, "builtin")
    await kube_emulator.wait_for(emulator, DEPLOYMENTS, POOL_NAMESPACE, "builtin-worker", lambda o: True)
    await _until_gone(emulator, POOL_NAMESPACE, "lading-endpoint-acme.gone")
    assert emulator.stored(SECRETS, POOL_NAMESPACE, "lading-endpoint-acme.other") is not None

    # An endpoint whose mirror name is taken by a Secret the operator did not write: never overwritten,
    # not projected. Once `erp` (ready after `other`) is projected, `other` was considered and left out.
    for name, value in (("other", SECOND), ("erp", FIRST)):
        await _secret_and_endpoint(api, name, value)
        await kube_emulator.wait_for(emulator, ENDPOINTS, "acme", name, _registered)
    worker = await kube_emulator.wait_for(
        emulator, DEPLOYMENTS, POOL_NAMESPACE, "builtin-worker", lambda o: bool(_projected(o))
    )
    assert [s["name"] for s in _projected(worker)] == [MIRROR]
    assert emulator.stored(SECRETS, POOL_NAMESPACE, "lading-endpoint-acme.other") == foreign_stored


async def test_mirrors_follow_the_pool_namespaces_and_the_source_secret(
    emulator: kube_emulator.KubeEmulator, api: kube.Client, db: asyncpg.Connection, operator: Any
) -> None:
    for namespace in (POOL_NAMESPACE, "gpu"):
        await conftest.create_pool(api, namespace, "builtin")
    await _secret_and_endpoint(api, "erp", FIRST)
    for namespace in (POOL_NAMESPACE, "gpu"):
        await kube_emulator.wait_for(emulator, DEPLOYMENTS, namespace, "builtin-worker", lambda o: bool(_projected(o)))
        assert emulator.stored(SECRETS, namespace, MIRROR) is not None

    # The last pool of `gpu` goes: its copy of the secret goes too.
    await api.delete(kube.path(conftest.GROUP_VERSION, "inferencepools", namespace="gpu", name="builtin"))
    await _until_gone(emulator, "gpu", MIRROR)
    assert emulator.stored(SECRETS, POOL_NAMESPACE, MIRROR) is not None

    # The source Secret is deleted: the endpoint is not ready, its mirror and projection are gone.
    secret_path = kube.path("v1", "secrets", namespace="acme", name="erp-signing")
    assert await api.delete(secret_path)
    await kube_emulator.wait_for(emulator, DEPLOYMENTS, POOL_NAMESPACE, "builtin-worker", lambda o: not _projected(o))
    await _until_gone(emulator, POOL_NAMESPACE, MIRROR)

    def secret_missing(endpoint: dict[str, Any]) -> bool:
        conditions = endpoint.get("status", {}).get("conditions", [])
        return any(
            c["type"] == "Ready" and (c["status"], c["reason"]) == ("False", "SecretMissing") for c in conditions
        )

    await kube_emulator.wait_for(emulator, ENDPOINTS, "acme", "erp", secret_missing)


def test_mirror_names_are_distinct_dns_subdomains_of_at_most_253_characters() -> None:
    assert mirroring.mirror_name("acme/eu-erp") != mirroring.mirror_name("acme-eu/erp")
    long_a, long_b = "t/" + "a" * 250 + "x", "t/" + "a" * 250 + "y"
    names = {mirroring.mirror_name(long_a), mirroring.mirror_name(long_b)}
    assert len(names) == 2 and all(len(n) <= 253 and n[-1].isalnum() for n in names)
    assert "FIRST" not in repr(mirroring.Source(endpoint="a/b", data="RklSU1Q=", digest="d"))
    assert "RklSU1Q=" not in repr(mirroring.Source(endpoint="a/b", data="RklSU1Q=", digest="d"))


def _registered(endpoint: dict[str, Any]) -> bool:
    return any(
        c["type"] == "Ready" and c["reason"] == "Registered" for c in endpoint.get("status", {}).get("conditions", [])
    )


async def _secret_and_endpoint(api: kube.Client, name: str, value: str) -> None:
    await api.create(kube.path("v1", "secrets", namespace="acme"), {
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": f"{name}-signing", "namespace": "acme"},
        "data": {"secret": _b64(value)},
    })  # fmt: skip
    await api.create(kube.path(conftest.GROUP_VERSION, "deliveryendpoints", namespace="acme"), {
        "apiVersion": conftest.GROUP_VERSION, "kind": "DeliveryEndpoint",
        "metadata": {"name": name, "namespace": "acme"},
        "spec": {"url": f"https://{name}.acme.example/hook", "secretRef": {"name": f"{name}-signing", "key": "secret"}},
    })  # fmt: skip


async def _until_gone(emulator: kube_emulator.KubeEmulator, namespace: str, name: str) -> None:
    async def gone() -> bool:
        return emulator.stored(SECRETS, namespace, name) is None

    await waiting.until(gone, timeout_s=20)
