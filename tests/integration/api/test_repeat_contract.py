"""
The repeat contract of an Idempotency-Key (seed 001's table, one test per row), against a real
`lading api` process and PostgreSQL.
"""

from __future__ import annotations

import asyncio

import aiohttp
import asyncpg
import pytest

from lading.db import api_tokens
from tests.integration.api.conftest import ApiProcess, Tenant, call, document

BATCH_SPEC = {
    "schema": "invoice.v1",
    "inferencePoolRef": {"name": "builtin", "namespace": "lading-system"},
    "documents": [{"key": "a", "text": "Invoice A"}, {"key": "b", "text": "Invoice B"}],
}


async def jobs_of(db: asyncpg.Connection, namespace: str) -> int:
    return int(await db.fetchval(
        "SELECT count(*) FROM extraction_jobs j JOIN batches b ON b.id = j.batch_id WHERE b.namespace = $1", namespace
    ))  # fmt: skip


@pytest.mark.parametrize("row", [
    "same key, same request: the first answer again, nothing new",
    "same key, other request: refused, nothing changed",
    "other key, same business intent (the batch's name): the same batch, nothing new",
    "other key, a distinct intent: accepted as new",
    "same key after the token was revoked, or with another tenant's token: refused before the stored answer",
])  # fmt: skip
async def test_repeat_contract(
        row: str, api_server: ApiProcess, acme: Tenant, globex: Tenant, db: asyncpg.Connection,
        http: aiohttp.ClientSession,
) -> None:
    docs = f"{api_server.base_url}/v1/namespaces/acme/documents"
    batches = f"{api_server.base_url}/v1/namespaces/acme/batches"
    first = await call(http, "POST", docs, tenant=acme, key="k-1", json=document())
    assert first.status == 202, first.body
    assert first.headers["Location"] == f"/v1/jobs/{first.body['jobId']}"
    assert "Idempotency-Replayed" not in first.headers

    if row.startswith("same key, same request"):
        # Field order and an omitted default (priority normal) do not make the request different.
        again = await call(http, "POST", docs, tenant=acme, key="k-1",
                           json={"priority": "normal", **dict(reversed(document().items()))})
        assert (again.status, again.headers["Location"], again.body) == (202, first.headers["Location"], first.body)
        assert again.headers["Idempotency-Replayed"] == "true"
        assert await jobs_of(db, "acme") == 1
    elif row.startswith("same key, other request"):
        other = await call(http, "POST", docs, tenant=acme, key="k-1", json=document(text="Invoice 0001, changed"))
        assert other.status == 422
        assert other.body["type"].endswith("/idempotency-key-reused")
        assert await jobs_of(db, "acme") == 1
        again = await call(http, "POST", docs, tenant=acme, key="k-1", json=document())
        assert again.status == 202 and again.headers["Location"] == first.headers["Location"]
    elif row.startswith("other key, same business intent"):
        march = {"name": "march", "spec": BATCH_SPEC}
        made = await call(http, "POST", batches, tenant=acme, key="b-1", json=march)
        assert made.status == 202, made.body
        replanned = await call(http, "POST", batches, tenant=acme, key="b-2", json=march)
        assert replanned.status == 202 and replanned.headers["Location"] == made.headers["Location"]
        assert replanned.headers["Idempotency-Replayed"] == "true"
        assert replanned.body["batchId"] == made.body["batchId"]
        changed = {**BATCH_SPEC, "documents": [{"key": "a", "text": "Invoice A, changed"}]}
        conflict = await call(http, "POST", batches, tenant=acme, key="b-3", json={"name": "march", "spec": changed})
        assert conflict.status == 409 and conflict.body["type"].endswith("/batch-exists")
        assert await jobs_of(db, "acme") == 1 + 2
    elif row.startswith("other key, a distinct intent"):
        second = await call(http, "POST", docs, tenant=acme, key="k-2", json=document(key="inv-0002"))
        assert second.status == 202 and second.headers["Location"] != first.headers["Location"]
        assert await jobs_of(db, "acme") == 2
    else:
        elsewhere = await call(http, "POST", docs.replace("/acme/", "/globex/"), tenant=globex, key="k-1",
                               json=document())
        assert elsewhere.status == 202 and elsewhere.headers["Location"] != first.headers["Location"]
        intruder = await call(http, "POST", docs, tenant=globex, key="k-1", json=document())
        assert intruder.status == 404 and "Location" not in intruder.headers
        await api_tokens.revoke(db, name="acme-token")
        # A valid token's lookup is reused for up to ApiSettings.token_cache_s (1 s): refused within that.
        deadline = asyncio.get_running_loop().time() + 5
        while (revoked := await call(http, "POST", docs, tenant=acme, key="k-1", json=document())).status != 401:
            assert revoked.status == 202 and asyncio.get_running_loop().time() < deadline, revoked
            await asyncio.sleep(0.05)
        assert "Location" not in revoked.headers
        assert await jobs_of(db, "acme") == 1


async def test_fifty_concurrent_posts_with_one_key_make_one_job(
        api_server: ApiProcess, acme: Tenant, db: asyncpg.Connection, http: aiohttp.ClientSession,
) -> None:
    url = f"{api_server.base_url}/v1/namespaces/acme/documents"
    answers = await asyncio.gather(*(call(http, "POST", url, tenant=acme, key="same", json=document())
                                     for _ in range(50)))  # fmt: skip
    statuses = sorted({a.status for a in answers})
    assert set(statuses) <= {202, 409}, statuses
    locations = {a.headers["Location"] for a in answers if a.status == 202}
    assert len(locations) == 1
    assert sum(1 for a in answers if a.status == 202 and "Idempotency-Replayed" not in a.headers) == 1
    assert all(a.body["type"].endswith("/request-in-progress") for a in answers if a.status == 409)
    assert await jobs_of(db, "acme") == 1
    assert await db.fetchval("SELECT count(*) FROM api_requests") == 1
