"""
The intake's routes against a real `lading api` process: batches end to end, jobs (200 with
Retry-After, 303 when settled), every refusal with its status and problem type, and the
cross-tenant matrix (another namespace's token gets 404 on every route).
"""

from __future__ import annotations

import io
import json
from typing import Any

import aiohttp
import asyncpg

from lading.db import jobs, registry
from lading.ids import JobId, TenantName
from tests.integration.api.conftest import Answer, ApiProcess, Tenant, call, document, make_tenant

SPEC = {
    "schema": "invoice.v1",
    "inferencePoolRef": {"name": "builtin", "namespace": "lading-system"},
    "documents": [{"key": f"inv-{i}", "text": f"Invoice {i}"} for i in range(5)],
}


async def test_a_batch_is_admitted_reported_paged_and_cancelled(
        api_server: ApiProcess, acme: Tenant, http: aiohttp.ClientSession,
) -> None:
    base = f"{api_server.base_url}/v1/namespaces/acme/batches"
    made = await call(http, "POST", base, tenant=acme, key="b-1", json={"name": "march", "spec": SPEC})
    assert made.status == 202, made.body
    assert made.headers["Location"] == "/v1/namespaces/acme/batches/march"
    assert made.body["jobs"] == 5

    status = await call(http, "GET", api_server.base_url + made.headers["Location"], tenant=acme)
    assert status.status == 200
    assert (status.body["phase"], status.body["total"], status.body["ready"]) == ("Running", 5, 5)
    assert {c["type"]: c["status"] for c in status.body["conditions"]} == {
        "Ready": "False", "Stalled": "False", "Admitted": "True", "Progressing": "True", "Complete": "False",
        "Failed": "False"}
    assert (status.body["queuePosition"], status.body["etaSeconds"]) == (0, None)  # next; nothing measured yet

    keys: list[str] = []
    url = f"{base}/march/results?limit=2"
    while url:
        page = await call(http, "GET", url, tenant=acme)
        assert page.status == 200 and page.headers["Content-Type"].startswith("application/x-ndjson")
        lines = [line for line in page.body.decode().splitlines() if line]
        keys += [json.loads(line)["key"] for line in lines]
        link = page.headers.get("Link")
        url = api_server.base_url + link.split(">")[0].lstrip("<") if link else ""
    assert keys == [f"inv-{i}" for i in range(5)]
    nul = await call(http, "GET", f"{base}/march/results?after=inv-%00", tenant=acme)  # never a key
    assert nul.status == 400 and nul.body["type"].endswith("/bad-request")

    cancelled = await call(http, "DELETE", f"{base}/march", tenant=acme)
    assert cancelled.status == 200
    assert (cancelled.body["cancelled"], cancelled.body["phase"]) == (5, "Failed")
    assert {c["type"]: c["status"] for c in cancelled.body["conditions"]} == {
        "Ready": "False", "Stalled": "True", "Admitted": "True", "Progressing": "False", "Complete": "False",
        "Failed": "True"}
    assert cancelled.body["queuePosition"] is None


async def test_a_job_answers_200_while_it_waits_and_303_once_settled(
        api_server: ApiProcess, acme: Tenant, db: asyncpg.Connection, http: aiohttp.ClientSession,
) -> None:
    made = await call(http, "POST", f"{api_server.base_url}/v1/namespaces/acme/documents", tenant=acme, key="d-1",
                      json=document())
    job_url = api_server.base_url + made.headers["Location"]
    waiting = await call(http, "GET", job_url, tenant=acme)
    assert waiting.status == 200 and waiting.body["state"] == "READY"
    assert int(waiting.headers["Retry-After"]) > 0
    assert await jobs.cancel(db, job_id=JobId(made.body["jobId"]), reason="test")
    settled = await call(http, "GET", job_url, tenant=acme)
    assert settled.status == 303 and settled.headers["Location"] == made.headers["Location"] + "/result"
    result = await call(http, "GET", api_server.base_url + settled.headers["Location"], tenant=acme)
    assert result.status == 200 and (result.body["state"], result.body["result"]) == ("CANCELLED", None)


async def test_every_refusal_has_its_status_and_problem_type(
        api_server: ApiProcess, db: asyncpg.Connection, http: aiohttp.ClientSession,
) -> None:
    acme = await make_tenant(db, "acme", max_queued_jobs=1, spec={"allowedPools": ["lading-system/builtin"]})
    url = f"{api_server.base_url}/v1/namespaces/acme/documents"

    def problem(answer: Answer, status: int, kind: str) -> None:
        assert answer.status == status, answer.body
        assert answer.headers["Content-Type"] == "application/problem+json"
        assert answer.body["type"] == f"https://lading.dev/problems/{kind}"

    problem(await call(http, "POST", url, key="k", json=document()), 401, "unauthorized")
    problem(await call(http, "POST", url, tenant=acme, json=document()), 400, "idempotency-key-missing")
    big = b'"' + b"x" * 2_000_000 + b'"'
    problem(await call(http, "POST", url, tenant=acme, key="k", data=io.BytesIO(big),
                       headers={"Content-Type": "application/json", "Content-Length": str(len(big))}), 413, "too-large")
    problem(await call(http, "POST", url, tenant=acme, key="k", data=io.BytesIO(big),  # chunked: caught while read
                       headers={"Content-Type": "application/json"}), 413, "too-large")
    problem(await call(http, "POST", url, tenant=acme, key="k", headers={"Content-Type": "text/plain"}), 415,
            "unsupported-media-type")
    bad_json = await call(http, "POST", url, tenant=acme, key="k", headers={"Content-Type": "application/json"})
    problem(bad_json, 400, "bad-request")
    invalid = await call(http, "POST", url, tenant=acme, key="k",
                         json={"key": "../x", "text": "t", "priority": "urgent", "color": "red"})
    problem(invalid, 422, "invalid-request")
    assert {e["pointer"] for e in invalid.body["errors"]} >= {"/key", "/priority", "/color", "/inferencePoolRef"}
    not_allowed = await call(http, "POST", url, tenant=acme, key="k", json=document(inferencePoolRef="other/pool"))
    problem(not_allowed, 422, "not-admitted")
    assert not_allowed.body["errors"][0]["pointer"] == "/inferencePoolRef"
    assert not_allowed.body["reason"] == "PoolNotAllowed"
    assert (await call(http, "POST", url, tenant=acme, key="k", json=document())).status == 202
    full = await call(http, "POST", url, tenant=acme, key="k2", json=document(key="inv-2"))
    problem(full, 429, "quota-exceeded")
    assert 1 <= int(full.headers["Retry-After"]) <= 3600
    problem(await call(http, "GET", f"{api_server.base_url}/v1/jobs/abc", tenant=acme), 404, "not-found")
    problem(await call(http, "PUT", url, tenant=acme), 405, "method-not-allowed")


async def test_the_retry_after_of_a_full_queue_follows_the_tenants_drain_rate(
        api_server: ApiProcess, db: asyncpg.Connection, http: aiohttp.ClientSession,
) -> None:
    acme = await make_tenant(db, "acme", max_queued_jobs=10)
    url = f"{api_server.base_url}/v1/namespaces/acme/documents"
    made = [await call(http, "POST", url, tenant=acme, key=f"k{i}", json=document(key=f"inv-{i}")) for i in range(12)]
    assert [a.status for a in made] == [202] * 10 + [429] * 2
    idle = int(made[-1].headers["Retry-After"])
    assert idle == 3600  # nothing drained in the window: the longest wait
    for answer in made[:6]:  # six jobs leave the queue: a drain rate of 6 per 300 s
        assert await jobs.cancel(db, job_id=JobId(answer.body["jobId"]), reason="test")
    for i in range(6):
        assert (await call(http, "POST", url, tenant=acme, key=f"m{i}", json=document(key=f"more-{i}"))).status == 202
    draining = await call(http, "POST", url, tenant=acme, key="last", json=document(key="last"))
    assert draining.status == 429
    assert int(draining.headers["Retry-After"]) == 50  # one more job at 6 jobs / 300 s


async def test_the_retry_after_of_a_queue_over_its_byte_limit_follows_the_bytes_drained(
        api_server: ApiProcess, db: asyncpg.Connection, http: aiohttp.ClientSession,
) -> None:
    acme = await make_tenant(db, "acme", max_queued_jobs=None, spec={"maxQueuedBytes": 1000})
    url = f"{api_server.base_url}/v1/namespaces/acme/documents"
    text = "x" * 100
    made = [await call(http, "POST", url, tenant=acme, key=f"k{i}", json=document(key=f"inv-{i}", text=text))
            for i in range(11)]  # fmt: skip
    assert [a.status for a in made] == [202] * 10 + [429]
    assert int(made[-1].headers["Retry-After"]) == 3600  # nothing drained in the window: the longest wait
    for answer in made[:6]:  # 600 bytes leave the queue: a drain rate of 600 bytes per 300 s
        assert await jobs.cancel(db, job_id=JobId(answer.body["jobId"]), reason="test")
    for i in range(6):
        more = await call(http, "POST", url, tenant=acme, key=f"m{i}", json=document(key=f"more-{i}", text=text))
        assert more.status == 202
    # The quota shrinks under a full queue: 600 bytes over the new limit, at 2 bytes per second.
    await registry.upsert_tenant(db, name=TenantName("acme"), namespaces=["acme"], weight=1, max_queued_jobs=None,
                                 max_in_flight=None, spec={"maxQueuedBytes": 400})  # fmt: skip
    over = await call(http, "POST", url, tenant=acme, key="last", json=document(key="last", text=text))
    assert over.status == 429 and over.body["type"] == "https://lading.dev/problems/quota-exceeded", over.body
    assert int(over.headers["Retry-After"]) == 300


ROUTES = [
    ("POST", "/v1/namespaces/acme/documents"), ("POST", "/v1/namespaces/acme/batches"),
    ("GET", "/v1/namespaces/acme/batches/march"), ("DELETE", "/v1/namespaces/acme/batches/march"),
    ("GET", "/v1/namespaces/acme/batches/march/results"), ("GET", "/v1/jobs/{job}"),
    ("GET", "/v1/jobs/{job}/result"),
]  # fmt: skip
"""Every route that needs a token, at an object of namespace acme."""


async def test_another_namespaces_token_gets_404_on_every_route(
        api_server: ApiProcess, acme: Tenant, globex: Tenant, http: aiohttp.ClientSession,
) -> None:
    base = api_server.base_url
    batch = await call(http, "POST", f"{base}/v1/namespaces/acme/batches", tenant=acme, key="b",
                       json={"name": "march", "spec": SPEC})
    job = await call(http, "POST", f"{base}/v1/namespaces/acme/documents", tenant=acme, key="d", json=document())
    assert (batch.status, job.status) == (202, 202)
    for method, path in ROUTES:
        url = base + path.format(job=job.body["jobId"])
        body = document() if path.endswith("documents") else {"name": "march", "spec": SPEC}
        post: dict[str, Any] = {"key": "d", "json": body} if method == "POST" else {}
        theirs = await call(http, method, url, tenant=globex, **post)
        missing = await call(http, method, base + path.replace("march", "april").format(job=999999), tenant=globex,
                             **post)
        assert (theirs.status, missing.status) == (404, 404), (method, path)
        # The same answer for what exists elsewhere and what does not exist: nothing to learn from.
        assert (theirs.body["type"], theirs.body["title"]) == (missing.body["type"], missing.body["title"])
    still = await call(http, "GET", f"{base}/v1/namespaces/acme/batches/march", tenant=acme)
    assert still.status == 200 and still.body["cancelled"] == 0
    assert (await call(http, "GET", f"{base}/v1/jobs/{job.body['jobId']}", tenant=acme)).status == 200
