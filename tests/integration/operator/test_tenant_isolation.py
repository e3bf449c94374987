"""
Tenants sharing an installation cannot see or spend each other's things (the real operator, emulated
API, real PostgreSQL): pools live only in the platform namespaces, a tenant's namespace never holds
another tenant's signing secret, and a TenantQuota's namespaces are revoked when it is deleted or
when another quota lists them too.
"""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import asyncpg
from lading_operator import kube

from tests.integration.operator import conftest
from tests.support import kube_emulator, waiting

BATCHES = "lading.dev/v1alpha1/extractionbatches"
POOLS = "lading.dev/v1alpha1/inferencepools"
QUOTAS = "lading.dev/v1alpha1/tenantquotas"
DEPLOYMENTS = "apps/v1/deployments"
SECRETS = "v1/secrets"
PLATFORM = "lading-system"
SECRET_A = "whsec_tenantA_Zk3q9X2vLr8PwQ0aYb7NcM4dEe1F"
SECRET_B = "whsec_tenantB_Hj6t5R1uKs0OiW9lXg2VfC8nBm3D"


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _condition(obj: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in obj.get("status", {}).get("conditions", []) if c["type"] == type_), {})


def _reason(type_: str, reason: str) -> Any:
    return lambda o: _condition(o, type_).get("reason") == reason


def _projected(worker: dict[str, Any]) -> dict[str, str]:
    """Projected signing secrets of a worker Deployment: file name -> Secret name."""
    volumes = worker["spec"]["template"]["spec"].get("volumes", [])
    sources = [s["secret"] for v in volumes if v["name"] == "endpoint-secrets" for s in v["projected"]["sources"]]
    return {item["path"]: source["name"] for source in sources for item in source["items"]}


def _stale_mirror(namespace: str, endpoint: str, value: str) -> dict[str, Any]:
    """A mirror as an operator that mirrored into every pool namespace left it."""
    dotted = endpoint.replace("/", ".")
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": f"lading-endpoint-{dotted}", "namespace": namespace,
                         "labels": {"app.kubernetes.io/managed-by": "lading", "lading.dev/endpoint": dotted},
                         "annotations": {"lading.dev/endpoint": endpoint}},
            "data": {"secret": _b64(value)}}  # fmt: skip


async def _secret_and_endpoint(api: kube.Client, namespace: str, value: str) -> None:
    await api.create(kube.path("v1", "secrets", namespace=namespace), {
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "erp-signing", "namespace": namespace},
        "data": {"secret": _b64(value)},
    })  # fmt: skip
    await api.create(kube.path(conftest.GROUP_VERSION, "deliveryendpoints", namespace=namespace), {
        "apiVersion": conftest.GROUP_VERSION, "kind": "DeliveryEndpoint",
        "metadata": {"name": "erp", "namespace": namespace},
        "spec": {"url": f"https://erp.{namespace}.example/hook", "secretRef": {"name": "erp-signing", "key": "secret"}},
    })  # fmt: skip


def _holds(emulator: kube_emulator.KubeEmulator, namespace: str, value: str) -> list[str]:
    """Secrets in `namespace` whose data holds `value` (plain or base64)."""
    found = []
    for name in emulator.names(SECRETS, namespace):
        secret = emulator.stored(SECRETS, namespace, name) or {}
        plain = [str(v) for v in (secret.get("stringData") or {}).values()]
        for encoded in (secret.get("data") or {}).values():
            plain.append(base64.b64decode(str(encoded)).decode("utf-8", "replace"))
        if any(value in text for text in plain):
            found.append(name)
    return found


async def test_a_tenant_namespace_never_holds_another_tenants_signing_secret(
    emulator: kube_emulator.KubeEmulator,
    api: kube.Client,
    db: asyncpg.Connection,
    operator_factory: Any,
) -> None:
    # What an operator that mirrored into every pool namespace left behind: B's secret in A's
    # namespace (A had a pool), A's in B's (whose pool is gone since).
    for namespace, endpoint, value in (("tenant-a", "tenant-b/erp", SECRET_B), ("tenant-b", "tenant-a/erp", SECRET_A)):
        await api.create(kube.path("v1", "secrets", namespace=namespace), _stale_mirror(namespace, endpoint, value))

    with operator_factory(pool_namespaces=(PLATFORM,)) as handle:
        await asyncio.get_running_loop().run_in_executor(None, handle.ready.wait, 30)
        await conftest.create_quota(api, "tenant-a", ["tenant-a"])
        await conftest.create_quota(api, "tenant-b", ["tenant-b"])
        await _secret_and_endpoint(api, "tenant-a", SECRET_A)
        await _secret_and_endpoint(api, "tenant-b", SECRET_B)
        await conftest.create_pool(api, "tenant-a", "own")
        await conftest.create_pool(api, PLATFORM, "shared")

        # The platform pool's workers can sign for both tenants: each endpoint's mirror is projected.
        worker = await kube_emulator.wait_for(
            emulator, DEPLOYMENTS, PLATFORM, "shared-worker", lambda o: len(_projected(o)) == 2
        )
        assert _projected(worker) == {
            "tenant-a.erp": "lading-endpoint-tenant-a.erp", "tenant-b.erp": "lading-endpoint-tenant-b.erp"
        }  # fmt: skip
        for endpoint, value in (("tenant-a.erp", SECRET_A), ("tenant-b.erp", SECRET_B)):
            mirror = emulator.stored(SECRETS, PLATFORM, f"lading-endpoint-{endpoint}")
            assert mirror is not None and mirror["data"] == {"secret": _b64(value)}

        # The pool in A's namespace is refused: nothing runs for it, nothing is mirrored there, no batch can use it.
        refused = await kube_emulator.wait_for(
            emulator, POOLS, "tenant-a", "own", _reason("Ready", "PoolNamespaceNotAllowed")
        )
        assert _condition(refused, "Ready")["status"] == "False"
        assert PLATFORM in _condition(refused, "Ready")["message"]
        assert emulator.names(DEPLOYMENTS, "tenant-a") == [] and emulator.names("v1/services", "tenant-a") == []
        assert await db.fetchval("SELECT count(*) FROM pools WHERE name = 'tenant-a/own'") == 0

        async def swept() -> bool:
            return not _holds(emulator, "tenant-a", SECRET_B) and not _holds(emulator, "tenant-b", SECRET_A)

        await waiting.until(swept, timeout_s=20)
        assert emulator.names(SECRETS, "tenant-a") == ["erp-signing"]
        assert emulator.names(SECRETS, "tenant-b") == ["erp-signing"]

        await conftest.create_batch(api, "tenant-a", "theirs", documents=2, inferencePoolRef={"name": "own"})
        await conftest.create_batch(
            api, "tenant-a", "shared", documents=2, inferencePoolRef={"name": "shared", "namespace": PLATFORM}
        )
        await kube_emulator.wait_for(emulator, BATCHES, "tenant-a", "theirs", _reason("Admitted", "PoolNotFound"))
        await kube_emulator.wait_for(
            emulator, BATCHES, "tenant-a", "shared", lambda o: o.get("status", {}).get("phase") == "Running"
        )
        # Still so after the admissions (several of the endpoints' reconcile intervals later).
        assert not _holds(emulator, "tenant-a", SECRET_B) and not _holds(emulator, "tenant-b", SECRET_A)


async def test_a_pool_outside_the_platform_namespaces_loses_what_an_earlier_operator_rendered(
    emulator: kube_emulator.KubeEmulator,
    api: kube.Client,
    db: asyncpg.Connection,
    operator_factory: Any,
) -> None:
    # An operator that served pools everywhere rendered this one's workers and registered it.
    with operator_factory(pool_namespaces=(PLATFORM, "tenant-a")) as handle:
        await asyncio.get_running_loop().run_in_executor(None, handle.ready.wait, 30)
        await conftest.create_pool(api, "tenant-a", "own")
        await kube_emulator.wait_for(emulator, DEPLOYMENTS, "tenant-a", "own-worker", lambda o: True)
        assert await db.fetchval("SELECT count(*) FROM pools WHERE name = 'tenant-a/own'") == 1

    with operator_factory(pool_namespaces=(PLATFORM,)) as handle:
        await asyncio.get_running_loop().run_in_executor(None, handle.ready.wait, 30)
        await kube_emulator.wait_for(emulator, POOLS, "tenant-a", "own", _reason("Ready", "PoolNamespaceNotAllowed"))

        async def cleaned() -> bool:
            return not emulator.names(DEPLOYMENTS, "tenant-a")

        await waiting.until(cleaned, timeout_s=20)
        assert await db.fetchval("SELECT count(*) FROM pools WHERE name = 'tenant-a/own'") == 0

        def warnings() -> list[str]:
            names = emulator.names("v1/events", "tenant-a")
            events = [emulator.stored("v1/events", "tenant-a", n) or {} for n in names]
            return [e["reason"] for e in events if e.get("reason") == "PoolNamespaceNotAllowed"]

        async def warned() -> bool:  # kopf posts events from a queue of its own, after the status
            return bool(warnings())

        await waiting.until(warned, timeout_s=20)
        assert warnings() == ["PoolNamespaceNotAllowed"], "one warning, not one per reconcile"


async def test_deleting_a_tenant_quota_revokes_it_and_queued_jobs_stay(
    emulator: kube_emulator.KubeEmulator, api: kube.Client, db: asyncpg.Connection, operator: Any
) -> None:
    await conftest.create_quota(api, "acme", ["acme"])
    await conftest.create_pool(api, PLATFORM, "builtin")
    pool = {"name": "builtin", "namespace": PLATFORM}
    await conftest.create_batch(api, "acme", "before", documents=3, inferencePoolRef=pool)
    await kube_emulator.wait_for(
        emulator, BATCHES, "acme", "before", lambda o: o.get("status", {}).get("phase") == "Running"
    )
    quota = await kube_emulator.wait_for(
        emulator, QUOTAS, None, "acme", lambda o: "lading.dev/finalizer" in o["metadata"].get("finalizers", [])
    )
    assert quota is not None

    await api.delete(kube.path(conftest.GROUP_VERSION, "tenantquotas", namespace=None, name="acme"))

    async def gone() -> bool:
        return emulator.stored(QUOTAS, None, "acme") is None

    await waiting.until(gone, timeout_s=20)
    assert await db.fetchval("SELECT namespaces FROM tenants WHERE name = 'acme'") == []
    states = await db.fetch("SELECT state FROM extraction_jobs")
    assert [r["state"] for r in states] == ["READY"] * 3, "jobs already queued stay and finish"

    await conftest.create_batch(api, "acme", "after", documents=2, inferencePoolRef=pool)
    pending = await kube_emulator.wait_for(emulator, BATCHES, "acme", "after", _reason("Admitted", "NoTenantQuota"))
    assert pending["status"]["phase"] == "Pending"
    assert await db.fetchval("SELECT count(*) FROM extraction_jobs") == 3


async def test_a_namespace_listed_by_two_quotas_is_admitted_by_neither(
    emulator: kube_emulator.KubeEmulator, api: kube.Client, db: asyncpg.Connection, operator: Any
) -> None:
    await conftest.create_pool(api, PLATFORM, "builtin")
    await conftest.create_quota(api, "acme", ["acme", "shared"])
    await conftest.create_quota(api, "globex", ["globex", "shared"])
    for name, other in (("acme", "globex"), ("globex", "acme")):
        conflicted = await kube_emulator.wait_for(emulator, QUOTAS, None, name, _reason("Ready", "NamespaceConflict"))
        message = _condition(conflicted, "Ready")["message"]
        assert _condition(conflicted, "Ready")["status"] == "False"
        assert f"namespace shared is also listed by TenantQuota {other}" in message

    pool = {"name": "builtin", "namespace": PLATFORM}
    await conftest.create_batch(api, "shared", "march", documents=2, inferencePoolRef=pool)
    pending = await kube_emulator.wait_for(emulator, BATCHES, "shared", "march", _reason("Admitted", "NoTenantQuota"))
    assert "listed by TenantQuotas acme, globex" in _condition(pending, "Admitted")["message"]
    assert await db.fetchval("SELECT count(*) FROM batches") == 0

    # globex gives the namespace up: it is acme's, both quotas are Ready, the batch is admitted.
    await api.merge_patch(
        kube.path(conftest.GROUP_VERSION, "tenantquotas", namespace=None, name="globex"),
        {"spec": {"namespaces": ["globex"]}},
    )
    for name in ("acme", "globex"):
        await kube_emulator.wait_for(emulator, QUOTAS, None, name, _reason("Ready", "Applied"))
    await kube_emulator.wait_for(
        emulator, BATCHES, "shared", "march", lambda o: o.get("status", {}).get("phase") == "Running"
    )
    assert await db.fetchval("SELECT tenant FROM batches") == "acme"
