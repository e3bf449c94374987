"""
The operator admits through the core's rules (allowed pools and priorities, queued jobs and bytes),
reads manifests with no database connection held and a bounded number at once, and shows a batch
whose DeliveryEndpoint does not exist. Kubernetes emulator, real kopf, real PostgreSQL, real HTTP.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import asyncpg
import pytest
from lading_operator import batches, kube

from lading.db import deliveries
from tests.integration.operator import conftest
from tests.support import fileserver, kube_emulator, waiting

BATCHES = "lading.dev/v1alpha1/extractionbatches"


def _condition(obj: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((dict(c) for c in obj.get("status", {}).get("conditions", []) if c["type"] == type_), {})


def _admitted_reason(reason: str) -> Callable[[dict[str, Any]], bool]:
    return lambda o: _condition(o, "Admitted").get("reason") == reason


def _running(o: dict[str, Any]) -> bool:
    return o.get("status", {}).get("phase") == "Running"


def _manifest(sizes: list[int]) -> bytes:
    lines = [
        json.dumps({
            "key": f"doc-{i}", "uri": f"https://files.example/doc-{i}.txt",
            "sha256": hashlib.sha256(str(i).encode()).hexdigest(), "bytes": size,
        })
        for i, size in enumerate(sizes)
    ]  # fmt: skip
    return ("\n".join(lines) + "\n").encode()


async def _manifest_batch(api: kube.Client, namespace: str, name: str, uri: str, **spec: Any) -> None:
    body = conftest.batch_body(namespace, name, documents=0, **spec)
    del body["spec"]["documents"]
    body["spec"]["manifestUri"] = uri
    await api.create(conftest.batch_path(namespace), body)


@pytest.fixture
def loopback_manifests(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The operator may read manifests from the test's file server on 127.0.0.1."""
    monkeypatch.setenv("LADING_EGRESS_ALLOW", "127.0.0.0/8")
    batches._documents.cache_clear()
    yield
    batches._documents.cache_clear()


@contextlib.asynccontextmanager
async def _file_server() -> AsyncIterator[fileserver.FileServer]:
    async with fileserver.running() as server:
        try:
            yield server
        finally:
            for gate in server.gates.values():  # never leave a handler waiting at shutdown
                gate.set()


async def test_the_quota_rules_show_as_admitted_false(
    emulator: kube_emulator.KubeEmulator, api: kube.Client, db: asyncpg.Connection, operator: Any,
    loopback_manifests: None,
) -> None:
    await conftest.create_quota(
        api, "acme", ["acme"], allowedPools=["acme/builtin"], allowedPriorities=["low", "normal"], maxQueuedBytes=100
    )
    await conftest.create_pool(api, "acme", "builtin")
    await conftest.create_pool(api, "gpu", "private-gpu")
    await conftest.create_batch(
        api, "acme", "foreign", documents=1, inferencePoolRef={"name": "private-gpu", "namespace": "gpu"}
    )
    await conftest.create_batch(api, "acme", "urgent", documents=1, priority="high")
    foreign = await kube_emulator.wait_for(emulator, BATCHES, "acme", "foreign", _admitted_reason("PoolNotAllowed"))
    assert foreign["status"]["phase"] == "Pending"
    assert _condition(foreign, "Admitted")["status"] == "False"
    assert "TenantQuota acme does not allow InferencePool gpu/private-gpu (allowedPools: acme/builtin)" in (
        _condition(foreign, "Admitted")["message"]
    )
    urgent = await kube_emulator.wait_for(emulator, BATCHES, "acme", "urgent", _admitted_reason("PriorityNotAllowed"))
    assert "does not allow priority high (allowedPriorities: low, normal)" in _condition(urgent, "Admitted")["message"]

    # 2 documents of 33 bytes fit in maxQueuedBytes=100; 2 more do not, inline or by manifest.
    await conftest.create_batch(api, "acme", "fits", documents=2)
    await kube_emulator.wait_for(emulator, BATCHES, "acme", "fits", _running)
    await conftest.create_batch(api, "acme", "more", documents=2)
    more = await kube_emulator.wait_for(emulator, BATCHES, "acme", "more", _admitted_reason("QuotaExceeded"))
    assert "66 more would exceed maxQueuedBytes=100" in _condition(more, "Admitted")["message"]
    async with _file_server() as server:
        server.files["/big.jsonl"] = _manifest([20, 20])
        await _manifest_batch(api, "acme", "big", server.url("/big.jsonl"))
        big = await kube_emulator.wait_for(emulator, BATCHES, "acme", "big", _admitted_reason("QuotaExceeded"))
        assert "40 more would exceed maxQueuedBytes=100" in _condition(big, "Admitted")["message"]
    assert await db.fetchval("SELECT count(*) FROM extraction_jobs") == 2


async def test_slow_manifests_hold_no_connection_and_are_read_a_few_at_a_time(
    emulator: kube_emulator.KubeEmulator,
    api: kube.Client,
    db: asyncpg.Connection,
    operator_factory: Callable[..., contextlib.AbstractContextManager[conftest.OperatorThread]],
    loopback_manifests: None,
) -> None:
    """Two database connections, three stalled manifests of a tenant and one of a namespace no quota
    covers: inline batches are admitted meanwhile, two manifests are requested (the bound), the one
    without a quota never is; once the server answers, every manifest batch is admitted."""
    await conftest.create_quota(api, "acme", ["acme"])
    await conftest.create_pool(api, "acme", "builtin")
    async with _file_server() as server:
        paths = [f"/m{i}.jsonl" for i in range(3)]
        for path in [*paths, "/orphan.jsonl"]:
            server.files[path] = _manifest([10, 20, 30])
            server.gates[path] = asyncio.Event()
        with operator_factory(db_pool_max=2, max_concurrent_manifests=2) as handle:
            await asyncio.get_running_loop().run_in_executor(None, handle.ready.wait, 30)
            await _manifest_batch(api, "globex", "orphan", server.url("/orphan.jsonl"))
            for i, path in enumerate(paths):
                await _manifest_batch(api, "acme", f"large-{i}", server.url(path))

            async def two_stalled() -> bool:
                return sum(server.requests[p] for p in paths) == 2

            await waiting.until(two_stalled, timeout_s=20)
            await kube_emulator.wait_for(emulator, BATCHES, "globex", "orphan", _admitted_reason("NoTenantQuota"))
            for i in range(3):
                await conftest.create_batch(api, "acme", f"inline-{i}", documents=2)
            for i in range(3):
                await kube_emulator.wait_for(emulator, BATCHES, "acme", f"inline-{i}", _running, timeout_s=20)
            assert sum(server.requests[p] for p in paths) == 2  # still the bound: the third waits for a slot
            assert server.requests["/orphan.jsonl"] == 0

            for path in paths:
                server.gates[path].set()
            for i in range(3):
                large = await kube_emulator.wait_for(emulator, BATCHES, "acme", f"large-{i}", _running, timeout_s=20)
                assert large["status"]["total"] == 3
            assert server.requests["/orphan.jsonl"] == 0
    assert await db.fetchval("SELECT count(*) FROM extraction_jobs") == 3 * 2 + 3 * 3


async def test_a_missing_delivery_endpoint_shows_until_it_appears(
    emulator: kube_emulator.KubeEmulator, api: kube.Client, db: asyncpg.Connection, operator: Any
) -> None:
    await conftest.create_quota(api, "acme", ["acme"])
    await conftest.create_pool(api, "acme", "builtin")
    await conftest.create_batch(api, "acme", "march", documents=3, deliveryEndpointRef={"name": "erp"})
    running = await kube_emulator.wait_for(emulator, BATCHES, "acme", "march", _running)
    assert _condition(running, "Admitted")["status"] == "True"

    def endpoint_not_found(o: dict[str, Any]) -> bool:
        return _condition(o, "Delivered").get("reason") == "EndpointNotFound"

    await kube_emulator.wait_for(emulator, BATCHES, "acme", "march", endpoint_not_found)
    await db.execute("UPDATE extraction_jobs SET state = 'SUCCEEDED', finished_at = clock_timestamp()")
    done = await kube_emulator.wait_for(
        emulator, BATCHES, "acme", "march",
        lambda o: o["status"].get("phase") == "Completed" and endpoint_not_found(o),
    )  # fmt: skip
    delivered = _condition(done, "Delivered")
    assert delivered["status"] == "False"
    assert delivered["message"] == (
        "DeliveryEndpoint acme/erp does not exist; 3 result(s) wait for it (0 of 3 delivered)"
    )
    assert await deliveries.claim(db, endpoints=["acme/erp"], owner="test", limit=10, lease_ttl_s=30) == []

    await api.create(kube.path(conftest.GROUP_VERSION, "deliveryendpoints", namespace="acme"), {
        "apiVersion": conftest.GROUP_VERSION, "kind": "DeliveryEndpoint",
        "metadata": {"name": "erp", "namespace": "acme"},
        "spec": {"url": "https://erp.acme.example/webhooks/lading",
                 "secretRef": {"name": "erp-signing", "key": "secret"}},
    })  # fmt: skip
    cleared = await kube_emulator.wait_for(
        emulator, BATCHES, "acme", "march", lambda o: _condition(o, "Delivered").get("reason") == "DeliveriesPending"
    )
    assert _condition(cleared, "Delivered")["message"] == "0 of 3 results delivered"
    # The deliveries proceed: a dispatcher can claim them now.
    claimed = await deliveries.claim(db, endpoints=["acme/erp"], owner="test", limit=10, lease_ttl_s=30)
    assert len(claimed) == 3
