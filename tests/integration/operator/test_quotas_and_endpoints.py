"""TenantQuota and DeliveryEndpoint mirrors; the pool's Paused condition; KEDA rendering."""

from __future__ import annotations

import base64
import json
import logging
from typing import Any

import asyncpg
import pytest
from lading_operator import kube

from lading.db import registry
from lading.ids import PoolName
from tests.integration.operator import conftest
from tests.support import kube_emulator

ENDPOINTS = "lading.dev/v1alpha1/deliveryendpoints"
QUOTAS = "lading.dev/v1alpha1/tenantquotas"
POOLS = "lading.dev/v1alpha1/inferencepools"
SIGNING_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


def _condition(obj: dict[str, Any], type_: str) -> dict[str, Any]:
    return next(c for c in obj.get("status", {}).get("conditions", []) if c["type"] == type_)


def _endpoint(namespace: str, name: str) -> dict[str, Any]:
    return {
        "apiVersion": conftest.GROUP_VERSION,
        "kind": "DeliveryEndpoint",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "url": "https://erp.acme.example/webhooks/lading",
            "secretRef": {"name": "erp-signing", "key": "secret"},
        },
    }


async def test_tenant_quota_is_mirrored_and_reports_its_use(
    emulator: kube_emulator.KubeEmulator, api: kube.Client, db: asyncpg.Connection, operator: Any
) -> None:
    await conftest.create_quota(api, "acme", ["acme", "acme-eu"], maxQueuedJobs=1000, weight=3)
    await conftest.create_pool(api, "acme", "builtin")
    row = await _wait_row(db, "SELECT namespaces, weight, max_queued_jobs FROM tenants WHERE name = 'acme'")
    assert (row["namespaces"], row["weight"], row["max_queued_jobs"]) == (["acme", "acme-eu"], 3, 1000)
    await conftest.create_batch(
        api, "acme-eu", "b", documents=7, inferencePoolRef={"name": "builtin", "namespace": "acme"}
    )
    quota = await kube_emulator.wait_for(
        emulator, QUOTAS, None, "acme", lambda o: o.get("status", {}).get("queuedJobs") == 7
    )
    assert quota["status"]["queuedBytes"] > 0 and quota["status"]["inFlight"] == 0
    assert _condition(quota, "Ready")["status"] == "True"


async def test_endpoint_needs_its_signing_secret_and_never_shows_its_value(
    emulator: kube_emulator.KubeEmulator,
    api: kube.Client,
    db: asyncpg.Connection,
    operator: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    await api.create(kube.path(conftest.GROUP_VERSION, "deliveryendpoints", namespace="acme"), _endpoint("acme", "erp"))
    missing = await kube_emulator.wait_for(
        emulator, ENDPOINTS, "acme", "erp", lambda o: _condition_or_none(o, "Ready", "SecretMissing")
    )
    assert "erp-signing" in _condition(missing, "Ready")["message"]
    assert await db.fetchval("SELECT url FROM endpoints WHERE name = 'acme/erp'") == (
        "https://erp.acme.example/webhooks/lading"
    )

    # The Secret exists but lacks the key: still missing.
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "erp-signing", "namespace": "acme"},
              "data": {"other": base64.b64encode(b"nope").decode()}}  # fmt: skip
    await api.create(kube.path("v1", "secrets", namespace="acme"), secret)
    await kube_emulator.wait_for(
        emulator, ENDPOINTS, "acme", "erp",
        lambda o: "has no key" in _condition(o, "Ready").get("message", ""),
    )  # fmt: skip
    await api.merge_patch(
        kube.path("v1", "secrets", namespace="acme", name="erp-signing"),
        {"data": {"secret": base64.b64encode(SIGNING_SECRET.encode()).decode()}},
    )
    ready = await kube_emulator.wait_for(
        emulator, ENDPOINTS, "acme", "erp", lambda o: _condition_or_none(o, "Ready", "Registered")
    )
    assert _condition(ready, "Ready")["status"] == "True"

    # The value is nowhere: not in the endpoint, its events, the endpoints table or the logs.
    everything = json.dumps([ready, *(emulator.stored("v1/events", "acme", n) for n in emulator.names("v1/events"))])
    stored = json.dumps([dict(r) for r in await db.fetch("SELECT * FROM endpoints")], default=str)
    for text in (everything, stored, caplog.text):
        assert SIGNING_SECRET not in text
        assert base64.b64encode(SIGNING_SECRET.encode()).decode() not in text


async def test_endpoint_health_from_the_dispatcher_is_mirrored(
    emulator: kube_emulator.KubeEmulator, api: kube.Client, db: asyncpg.Connection, operator: Any
) -> None:
    has_health = await db.fetchval(
        "SELECT count(*) FROM information_schema.columns "
        "WHERE table_name = 'endpoints' AND column_name = 'auth_failing'"
    )
    if not has_health:
        pytest.skip("the dispatcher's endpoint health columns are not in this schema")
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "erp-signing", "namespace": "acme"},
              "stringData": {"secret": SIGNING_SECRET}}  # fmt: skip
    await api.create(kube.path("v1", "secrets", namespace="acme"), secret)
    await api.create(kube.path(conftest.GROUP_VERSION, "deliveryendpoints", namespace="acme"), _endpoint("acme", "erp"))
    await kube_emulator.wait_for(
        emulator, ENDPOINTS, "acme", "erp", lambda o: _condition_or_none(o, "Ready", "Registered")
    )
    await _wait_row(db, "SELECT 1 FROM endpoints WHERE name = 'acme/erp'")
    updated = await db.execute(
        "UPDATE endpoints SET auth_failing = true, last_auth_status = 401, breaker_state = 'open' "
        "WHERE name = 'acme/erp'"
    )
    assert updated == "UPDATE 1"
    failing = await kube_emulator.wait_for(
        emulator, ENDPOINTS, "acme", "erp", lambda o: _condition_or_none(o, "AuthFailing", "AuthRejected")
    )
    assert failing["status"]["circuit"] == "Open"
    assert _condition(failing, "CircuitOpen")["status"] == "True"
    assert "401" in _condition(failing, "AuthFailing")["message"]


async def test_pool_paused_by_the_provider_shows_paused(
    emulator: kube_emulator.KubeEmulator, api: kube.Client, db: asyncpg.Connection, operator: Any
) -> None:
    await conftest.create_pool(
        api, "acme", "ext", provider="openai-compatible", model="gpt-4o-mini", endpoint={"url": "http://127.0.0.1:9/v1"}
    )
    claiming = await kube_emulator.wait_for(
        emulator, POOLS, "acme", "ext", lambda o: _condition_or_none(o, "Paused", "Claiming")
    )
    assert claiming["status"]["endpoint"] == "http://127.0.0.1:9/v1"
    await registry.pause_pool(db, name=PoolName("acme/ext"), seconds=600, reason="401 from the provider: key refused")
    paused = await kube_emulator.wait_for(
        emulator, POOLS, "acme", "ext", lambda o: _condition_or_none(o, "Paused", "ProviderRefused")
    )
    assert "key refused" in _condition(paused, "Paused")["message"]
    assert "pausedUntil" in paused["status"]
    assert paused["status"]["headroom"] == "0.00"


async def test_keda_scaling_renders_a_scaled_object_and_leaves_replicas_to_keda(
    emulator: kube_emulator.KubeEmulator, api: kube.Client, db: asyncpg.Connection, operator: Any
) -> None:
    pool = await conftest.create_pool(api, "acme", "kq", workers={"scaling": "keda", "maxReplicas": 4})
    scaled = await kube_emulator.wait_for(
        emulator, "keda.sh/v1alpha1/scaledobjects", "acme", "kq-worker", lambda o: True
    )
    assert scaled["spec"]["scaleTargetRef"]["name"] == "kq-worker"
    assert scaled["metadata"]["ownerReferences"][0]["uid"] == pool["metadata"]["uid"]
    auth = await kube_emulator.wait_for(
        emulator, "keda.sh/v1alpha1/triggerauthentications", "acme", "kq-worker", lambda o: True
    )
    assert auth["spec"]["secretTargetRef"][0]["name"] == "lading-database"
    worker = await kube_emulator.wait_for(emulator, "apps/v1/deployments", "acme", "kq-worker", lambda o: True)
    assert "replicas" not in worker["spec"]


def _condition_or_none(obj: dict[str, Any], type_: str, reason: str) -> bool:
    return any(c["type"] == type_ and c["reason"] == reason for c in obj.get("status", {}).get("conditions", []))


async def _wait_row(db: asyncpg.Connection, query: str) -> asyncpg.Record:
    from tests.support.waiting import until

    found: list[asyncpg.Record] = []

    async def present() -> bool:
        row = await db.fetchrow(query)
        if row is not None:
            found.append(row)
        return row is not None

    await until(present, timeout_s=20)
    return found[-1]
