"""
Every TenantQuota rule is enforced by the core admission (`lading.applying`), for any intake:
allowed pools and priorities, maxQueuedJobs and maxQueuedBytes (inline and manifest batches).
A manifest batch is checked before anything is downloaded, and is read holding no database
connection.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import pathlib
from typing import Any

import asyncpg
import pytest

from lading import applying, metrics
from lading.db import pool as dbpool
from lading.db import registry
from lading.ids import PoolName, TenantName
from lading.models import manifests, specs
from lading.settings import DocumentSettings
from tests.support import fileserver, waiting

LOOPBACK = DocumentSettings(egress_allow=("127.0.0.0/8",))


async def seed(conn: asyncpg.Connection, **quota: Any) -> None:
    """Tenant acme (namespace acme) with the given quota fields (camelCase), and three pools."""
    spec = specs.TenantQuotaSpec.model_validate({"namespaces": ["acme"], **quota})
    await applying.apply_tenant_quota(
        conn,
        specs.TenantQuota.model_validate({
            "apiVersion": "lading.dev/v1alpha1", "kind": "TenantQuota", "metadata": {"name": "acme"},
            "spec": spec.model_dump(mode="json", by_alias=True, exclude_unset=True),
        }),
    )  # fmt: skip
    for pool in ("acme/cheap", "acme/fast", "globex/private-gpu"):
        await registry.upsert_pool(conn, name=PoolName(pool), provider="builtin", model="lading-builtin", spec={})


def batch(
        name: str,
        *,
        pool: str = "acme/cheap",
        priority: str = "normal",
        texts: tuple[str, ...] = ("Invoice 1",),
        manifest_uri: str | None = None,
        namespace: str = "acme",
) -> specs.ExtractionBatch:
    pool_namespace, pool_name = pool.split("/")
    spec: dict[str, Any] = {
        "schema": "invoice.v1",
        "inferencePoolRef": {"name": pool_name, "namespace": pool_namespace},
        "priority": priority,
    }
    if manifest_uri is None:
        spec["documents"] = [{"key": f"doc-{i}", "text": text} for i, text in enumerate(texts)]
    else:
        spec["manifestUri"] = manifest_uri
    return specs.ExtractionBatch.model_validate({
        "apiVersion": "lading.dev/v1alpha1", "kind": "ExtractionBatch",
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}"}, "spec": spec,
    })  # fmt: skip


def manifest(sizes: list[int]) -> bytes:
    """A manifest of documents of the given sizes (admission never reads the documents)."""
    lines = [
        json.dumps({
            "key": f"doc-{i}", "uri": f"file:///data/doc-{i}.txt",
            "sha256": hashlib.sha256(str(i).encode()).hexdigest(), "bytes": size,
        })
        for i, size in enumerate(sizes)
    ]
    return ("\n".join(lines) + "\n").encode()


async def jobs(db: asyncpg.Connection) -> int:
    return int(await db.fetchval("SELECT count(*) FROM extraction_jobs"))


def rejections(reason: str) -> float:
    return float(metrics.ADMISSION_REJECTIONS.labels(reason)._value.get())


async def test_a_pool_the_quota_does_not_allow_is_refused(db: asyncpg.Connection) -> None:
    await seed(db, allowedPools=["acme/cheap"])
    before = rejections("PoolNotAllowed")
    with pytest.raises(applying.AdmissionRejected) as caught:
        await applying.admit_batch(db, batch("foreign", pool="globex/private-gpu", priority="high"))
    assert caught.value.reason == "PoolNotAllowed"
    assert str(caught.value) == (
        "ExtractionBatch acme/foreign: spec.inferencePoolRef: TenantQuota acme does not allow InferencePool "
        "globex/private-gpu (allowedPools: acme/cheap)"
    )
    # A pool that does not exist is refused the same way: a tenant learns nothing of pools it may not use.
    with pytest.raises(applying.AdmissionRejected, match="does not allow InferencePool globex/none"):
        await applying.admit_batch(db, batch("ghost", pool="globex/none"))
    assert rejections("PoolNotAllowed") == before + 2
    assert await jobs(db) == 0
    applied = await applying.admit_batch(db, batch("own", pool="acme/cheap"))
    assert applied.pool == "acme/cheap" and len(applied.result.job_ids) == 1


async def test_a_priority_the_quota_does_not_allow_is_refused(db: asyncpg.Connection) -> None:
    await seed(db, allowedPriorities=["low"])
    with pytest.raises(applying.AdmissionRejected) as caught:
        await applying.admit_batch(db, batch("urgent", priority="high"))
    assert caught.value.reason == "PriorityNotAllowed"
    assert str(caught.value) == (
        "ExtractionBatch acme/urgent: spec.priority: TenantQuota acme does not allow priority high "
        "(allowedPriorities: low)"
    )
    assert await jobs(db) == 0
    assert len((await applying.admit_batch(db, batch("patient", priority="low"))).result.job_ids) == 1


async def test_max_queued_bytes_bounds_inline_batches(db: asyncpg.Connection) -> None:
    await seed(db, maxQueuedBytes=20)
    await applying.admit_batch(db, batch("first", texts=("0123456789", "01234")))  # 15 bytes
    with pytest.raises(applying.AdmissionRejected) as caught:
        await applying.admit_batch(db, batch("second", texts=("€€",)))  # 6 bytes in UTF-8
    assert caught.value.reason == "QuotaExceeded"
    assert str(caught.value) == "tenant acme has 15 bytes queued; 6 more would exceed maxQueuedBytes=20"
    await applying.admit_batch(db, batch("third", texts=("€", "ab")))  # 5 bytes: exactly full
    assert await jobs(db) == 4
    # A re-admission of an accepted batch takes no room.
    again = await applying.admit_batch(db, batch("first", texts=("0123456789", "01234")))
    assert not again.result.created


async def test_max_queued_bytes_bounds_manifest_batches(
        db: asyncpg.Connection, dbpool: asyncpg.Pool, tmp_path: pathlib.Path
) -> None:
    await seed(db, maxQueuedBytes=10_000)
    settings = DocumentSettings(roots=(str(tmp_path),))
    folder = tmp_path / "acme"  # the namespace's own directory under the document root
    folder.mkdir()
    (folder / "small.jsonl").write_bytes(manifest([3000, 3000]))
    (folder / "large.jsonl").write_bytes(manifest([2000, 2000, 1000]))
    applied = await applying.admit_batch(db, batch("small", manifest_uri=(folder / "small.jsonl").as_uri()),
                                         documents=settings)  # fmt: skip
    assert len(applied.result.job_ids) == 2
    with pytest.raises(applying.AdmissionRejected) as caught:
        await applying.admit_batch(db, batch("large", manifest_uri=(folder / "large.jsonl").as_uri()),
                                   documents=settings)  # fmt: skip
    assert caught.value.reason == "QuotaExceeded"
    assert str(caught.value) == "tenant acme has 6000 bytes queued; 5000 more would exceed maxQueuedBytes=10000"
    assert await jobs(db) == 2
    # The same through the pooled path (the operator's).
    with pytest.raises(applying.AdmissionRejected, match="5000 more would exceed maxQueuedBytes=10000"):
        await applying.admit_batch_via_pool(
            dbpool, batch("large", manifest_uri=(folder / "large.jsonl").as_uri()), documents=settings
        )


async def test_a_full_queue_refuses_a_manifest_batch_before_downloading_it(db: asyncpg.Connection) -> None:
    await seed(db, maxQueuedJobs=1)
    await applying.admit_batch(db, batch("first"))
    async with fileserver.running() as server:
        server.files["/m.jsonl"] = manifest([10])
        with pytest.raises(applying.AdmissionRejected) as caught:
            await applying.admit_batch(db, batch("big", manifest_uri=server.url("/m.jsonl")), documents=LOOPBACK)
        assert caught.value.reason == "QuotaExceeded"
        assert str(caught.value) == "tenant acme has 1 queued jobs; maxQueuedJobs=1 leaves no room"
        assert server.requests["/m.jsonl"] == 0


@pytest.mark.parametrize("via_pool", [False, True], ids=["connection", "pool"])
async def test_a_manifest_batch_is_refused_before_anything_is_downloaded(
        db: asyncpg.Connection, dbpool: asyncpg.Pool, via_pool: bool
) -> None:
    await seed(db, allowedPools=["acme/cheap"], allowedPriorities=["low", "normal"])
    cases = [
        (batch("nobody", namespace="globex"), "NoTenantQuota"),
        (batch("foreign", pool="globex/private-gpu"), "PoolNotAllowed"),
        (batch("urgent", priority="high"), "PriorityNotAllowed"),
    ]
    async with fileserver.running() as server:
        server.files["/m.jsonl"] = manifest([10])
        for case, reason in cases:
            by_manifest = batch(
                case.metadata.name, namespace=case.metadata.namespace or "", priority=case.spec.priority,
                pool=f"{case.spec.inference_pool_ref.namespace}/{case.spec.inference_pool_ref.name}",
                manifest_uri=server.url("/m.jsonl"),
            )  # fmt: skip
            with pytest.raises(applying.AdmissionRejected) as caught:
                if via_pool:
                    await applying.admit_batch_via_pool(dbpool, by_manifest, documents=LOOPBACK)
                else:
                    await applying.admit_batch(db, by_manifest, documents=LOOPBACK)
            assert caught.value.reason == reason
        assert server.requests["/m.jsonl"] == 0


async def test_a_stalled_manifest_holds_no_connection_and_downloads_are_bounded(
        db: asyncpg.Connection, database_url: str
) -> None:
    """One connection in the pool: inline batches are admitted while two manifests stall; the
    second manifest waits for the only download permit and is not requested meanwhile."""
    await seed(db)
    one = await dbpool.create_pool(database_url, min_size=1, max_size=1)
    downloads = asyncio.Semaphore(1)
    try:
        async with fileserver.running() as server:
            for path in ("/a.jsonl", "/b.jsonl"):
                server.files[path] = manifest([10, 20])
                server.gates[path] = asyncio.Event()
            first, second = (
                asyncio.create_task(applying.admit_batch_via_pool(
                    one, batch(name, manifest_uri=server.url(f"/{name}.jsonl")), documents=LOOPBACK,
                    downloads=downloads,
                ))
                for name in ("a", "b")
            )  # fmt: skip

            async def requested() -> bool:
                return server.requests["/a.jsonl"] + server.requests["/b.jsonl"] == 1

            await waiting.until(requested, timeout_s=10)
            stalled = "/a.jsonl" if server.requests["/a.jsonl"] else "/b.jsonl"
            other = "/b.jsonl" if stalled == "/a.jsonl" else "/a.jsonl"
            for i in range(3):
                inline = await asyncio.wait_for(
                    applying.admit_batch_via_pool(one, batch(f"inline-{i}"), documents=LOOPBACK), timeout=5
                )
                assert inline.result.created
            assert server.requests[other] == 0 and not first.done() and not second.done()
            server.gates[stalled].set()
            server.gates[other].set()
            applied = await asyncio.wait_for(asyncio.gather(first, second), timeout=10)
            assert [len(a.result.job_ids) for a in applied] == [2, 2]
            assert server.requests == {"/a.jsonl": 1, "/b.jsonl": 1}
    finally:
        await one.close()
    assert await jobs(db) == 7


async def test_lading_run_refuses_what_the_quota_does_not_allow_before_reading_manifests(
        db: asyncpg.Connection,
) -> None:
    async with fileserver.running() as server:
        server.files["/m.jsonl"] = manifest([10])
        text = "\n---\n".join([
            "apiVersion: lading.dev/v1alpha1\nkind: TenantQuota\nmetadata: {name: acme}\n"
            "spec: {namespaces: [acme], allowedPools: [acme/cheap]}",
            "apiVersion: lading.dev/v1alpha1\nkind: InferencePool\nmetadata: {name: cheap, namespace: acme}\n"
            "spec: {provider: builtin}",
            "apiVersion: lading.dev/v1alpha1\nkind: InferencePool\nmetadata: {name: fast, namespace: acme}\n"
            "spec: {provider: builtin}",
            "apiVersion: lading.dev/v1alpha1\nkind: ExtractionBatch\nmetadata: {name: ok, namespace: acme}\n"
            "spec: {schema: invoice.v1, inferencePoolRef: {name: cheap}, documents: [{key: a, text: x}]}",
            "apiVersion: lading.dev/v1alpha1\nkind: ExtractionBatch\nmetadata: {name: big, namespace: acme}\n"
            f"spec: {{schema: invoice.v1, inferencePoolRef: {{name: fast}}, manifestUri: '{server.url('/m.jsonl')}'}}",
        ])  # fmt: skip
        loaded = manifests.load_text(text, source="m.yaml")
        with pytest.raises(applying.AdmissionRejected) as caught:
            await applying.apply_manifests(db, loaded, documents=LOOPBACK)
        assert caught.value.reason == "PoolNotAllowed"
        assert "ExtractionBatch acme/big: spec.inferencePoolRef" in str(caught.value)
        assert server.requests["/m.jsonl"] == 0
    # Nothing applied: not even the quota and pools of the set.
    assert await db.fetchval("SELECT count(*) FROM tenants") == 0
    assert await db.fetchval("SELECT count(*) FROM pools") == 0 and await jobs(db) == 0
    assert await registry.tenant_rules(db, tenant=TenantName("acme")) is None
