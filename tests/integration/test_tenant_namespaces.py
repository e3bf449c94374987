"""
Which tenant a namespace belongs to, in the core (operator, `lading run` and any intake alike):
exactly one TenantQuota must list it. Listed by two, it belongs to neither; a revoked quota's
namespaces belong to nobody, while its queued jobs stay and finish.
"""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest

from lading import applying
from lading.db import registry
from lading.ids import TenantName
from lading.models import manifests, specs
from tests.support import factories


def quota(name: str, namespaces: list[str]) -> specs.TenantQuota:
    return specs.TenantQuota.model_validate({
        "apiVersion": specs.API_VERSION, "kind": "TenantQuota", "metadata": {"name": name},
        "spec": {"namespaces": namespaces},
    })  # fmt: skip


def batch(namespace: str, name: str, *, documents: int = 3) -> specs.ExtractionBatch:
    return specs.ExtractionBatch.model_validate({
        "apiVersion": specs.API_VERSION, "kind": "ExtractionBatch",
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}"},
        "spec": {
            "schema": "invoice.v1", "inferencePoolRef": {"name": "builtin", "namespace": "lading-system"},
            "documents": [{"key": f"inv-{i}", "text": f"Invoice {i} total 10.00 EUR"} for i in range(documents)],
        },
    })  # fmt: skip


async def _pool(conn: asyncpg.Connection) -> None:
    await registry.upsert_pool(conn, name=factories.POOL, provider="builtin", model="lading-builtin", spec={})


async def test_a_namespace_listed_by_two_quotas_belongs_to_neither(db: asyncpg.Connection) -> None:
    await _pool(db)
    await applying.apply_tenant_quota(db, quota("acme", ["acme", "shared"]))
    await applying.apply_tenant_quota(db, quota("globex", ["globex", "shared"]))

    assert await registry.tenant_for_namespace(db, namespace="shared") is None
    assert await registry.tenants_for_namespace(db, namespace="shared") == ["acme", "globex"]
    assert await registry.tenant_for_namespace(db, namespace="acme") == "acme", "the rest of each quota stands"
    assert await registry.tenant_namespace_conflicts(db, tenant=TenantName("acme")) == [
        registry.NamespaceConflict(namespace="shared", other=TenantName("globex"))
    ]
    with pytest.raises(applying.AdmissionRejected) as caught:
        await applying.admit_batch(db, batch("shared", "march"))
    assert caught.value.reason == "NoTenantQuota"
    assert "listed by TenantQuotas acme, globex" in str(caught.value)
    assert await db.fetchval("SELECT count(*) FROM batches") == 0

    # The conflict resolved: the namespace is acme's again.
    await applying.apply_tenant_quota(db, quota("globex", ["globex"]))
    assert await registry.tenant_namespace_conflicts(db, tenant=TenantName("acme")) == []
    admitted = await applying.admit_batch(db, batch("shared", "march"))
    assert admitted.tenant == "acme"


async def test_a_revoked_quota_admits_nothing_new_and_its_queued_jobs_stay(db: asyncpg.Connection) -> None:
    await _pool(db)
    await applying.apply_tenant_quota(db, quota("acme", ["acme", "acme-eu"]))
    admitted = await applying.admit_batch(db, batch("acme", "before", documents=4))
    assert admitted.tenant == "acme"

    assert await registry.revoke_tenant(db, name=TenantName("acme")) == ["acme", "acme-eu"]
    assert await registry.revoke_tenant(db, name=TenantName("nobody")) is None
    for namespace in ("acme", "acme-eu"):
        assert await registry.tenant_for_namespace(db, namespace=namespace) is None
    with pytest.raises(applying.AdmissionRejected) as caught:
        await applying.admit_batch(db, batch("acme", "after"))
    assert caught.value.reason == "NoTenantQuota" and "not covered by any TenantQuota" in str(caught.value)
    states = await db.fetch("SELECT tenant, state FROM extraction_jobs")
    assert [(r["tenant"], r["state"]) for r in states] == [("acme", "READY")] * 4, "queued jobs stay"

    # Applying the quota again gives the namespaces back.
    await applying.apply_tenant_quota(db, quota("acme", ["acme"]))
    assert await registry.tenant_for_namespace(db, namespace="acme") == "acme"


async def test_lading_run_reports_a_namespace_another_stored_quota_lists(db: asyncpg.Connection) -> None:
    """`lading run` applies manifests through the same core: a quota stored earlier that lists the
    namespace too makes the batch inadmissible, and the error names both quotas."""
    await _pool(db)
    await applying.apply_tenant_quota(db, quota("globex", ["acme"]))
    text = """
apiVersion: lading.dev/v1alpha1
kind: TenantQuota
metadata: {name: acme}
spec: {namespaces: [acme]}
---
apiVersion: lading.dev/v1alpha1
kind: InferencePool
metadata: {name: builtin, namespace: lading-system}
spec: {provider: builtin}
---
apiVersion: lading.dev/v1alpha1
kind: ExtractionBatch
metadata: {name: march, namespace: acme}
spec:
  schema: invoice.v1
  inferencePoolRef: {name: builtin, namespace: lading-system}
  documents: [{key: inv-1, text: "Invoice 1 total 10.00 EUR"}]
"""
    loaded = manifests.load_text(text, source="run.yaml")
    with pytest.raises(applying.AdmissionRejected) as caught:
        await applying.apply_manifests(db, loaded)
    assert "namespace acme is listed by TenantQuotas acme, globex" in str(caught.value)
    rows: list[Any] = await db.fetch("SELECT name, namespaces FROM tenants ORDER BY name")
    assert [(r["name"], r["namespaces"]) for r in rows] == [("globex", ["acme"])], "all or nothing"
