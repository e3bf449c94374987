"""
Kubernetes ServiceAccount tokens (`lading api --kubernetes-auth`): the API server is asked who a
token is (TokenReview) and whether it may `create extractionbatches.lading.dev` in the namespace
(SubjectAccessReview); allowed, it acts there like a Lading token of that namespace, and anywhere
else it gets 404. The API server here is a stub that records every review.
"""

from __future__ import annotations

import pathlib
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import aiohttp.web
import asyncpg
import pytest

from tests.integration.api.conftest import ApiProcess, Tenant, call, document, start_api

SA_TOKEN = "eyJhbGciOiJSUzI1NiJ9.sa-erp-acme.signature"
"""What the stub authenticates: ServiceAccount erp of namespace acme, allowed in acme only."""


class StubApiServer:
    def __init__(self) -> None:
        self.reviews: list[dict[str, Any]] = []
        self.url = ""

    async def token_review(self, request: aiohttp.web.Request) -> aiohttp.web.Response:
        body = await request.json()
        self.reviews.append(body)
        assert request.headers["Authorization"] == "Bearer intake-own-token"
        if body["spec"]["token"] != SA_TOKEN:
            return aiohttp.web.json_response({**body, "status": {"authenticated": False}})
        user = {"username": "system:serviceaccount:acme:erp", "uid": "u-1", "groups": ["system:serviceaccounts"]}
        return aiohttp.web.json_response({**body, "status": {"authenticated": True, "user": user}})

    async def access_review(self, request: aiohttp.web.Request) -> aiohttp.web.Response:
        body = await request.json()
        self.reviews.append(body)
        spec = body["spec"]
        attributes = spec["resourceAttributes"]
        allowed = (spec["user"] == "system:serviceaccount:acme:erp" and attributes["namespace"] == "acme"
                   and (attributes["verb"], attributes["group"], attributes["resource"])
                   == ("create", "lading.dev", "extractionbatches"))  # fmt: skip
        return aiohttp.web.json_response({**body, "status": {"allowed": allowed}})


@pytest.fixture
async def kube() -> AsyncIterator[StubApiServer]:
    stub = StubApiServer()
    app = aiohttp.web.Application()
    app.router.add_post("/apis/authentication.k8s.io/v1/tokenreviews", stub.token_review)
    app.router.add_post("/apis/authorization.k8s.io/v1/subjectaccessreviews", stub.access_review)
    runner = aiohttp.web.AppRunner(app)
    await runner.setup()
    site = aiohttp.web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = next(a for a in runner.addresses if isinstance(a, tuple))[1]
    stub.url = f"http://127.0.0.1:{port}"
    try:
        yield stub
    finally:
        await runner.cleanup()


@pytest.fixture
def kube_api(database_url: str, kube: StubApiServer, tmp_path: pathlib.Path) -> Any:
    token_file = tmp_path / "token"
    token_file.write_text("intake-own-token\n")
    server = start_api(database_url, args=("--kubernetes-auth", "--kubernetes-api", kube.url,
                                           "--kubernetes-token-file", str(token_file)))
    try:
        yield server
    finally:
        server.kill()


async def test_a_service_account_token_acts_where_it_may_create_extractionbatches_and_nowhere_else(
        kube_api: ApiProcess, kube: StubApiServer, acme: Tenant, globex: Tenant, db: asyncpg.Connection,
        http: aiohttp.ClientSession,
) -> None:
    sa = {"Authorization": f"Bearer {SA_TOKEN}"}
    base = kube_api.base_url
    made = await call(http, "POST", f"{base}/v1/namespaces/acme/documents", key="k", json=document(), headers=sa)
    assert made.status == 202, made.body
    assert (await call(http, "GET", base + made.headers["Location"], headers=sa)).status == 200
    theirs = await call(http, "POST", f"{base}/v1/namespaces/globex/documents", tenant=globex, key="g",
                        json=document())
    assert theirs.status == 202
    assert (await call(http, "GET", base + theirs.headers["Location"], headers=sa)).status == 404
    assert (await call(http, "POST", f"{base}/v1/namespaces/globex/documents", key="k2", json=document(),
                       headers=sa)).status == 404
    stranger = await call(http, "GET", f"{base}/v1/namespaces/acme/batches/x",
                          headers={"Authorization": "Bearer some-other-token"})
    assert stranger.status == 401
    kinds = [r["kind"] for r in kube.reviews]
    # One TokenReview per token and one SubjectAccessReview per namespace: answers are cached.
    assert (kinds.count("TokenReview"), kinds.count("SubjectAccessReview")) == (2, 2)
    assert {r["spec"]["resourceAttributes"]["namespace"] for r in kube.reviews if r["kind"] == "SubjectAccessReview"} \
        == {"acme", "globex"}
    # Lading's own tokens never go to the API server.
    assert (await call(http, "GET", base + made.headers["Location"], tenant=acme)).status == 200
    assert [r["kind"] for r in kube.reviews] == kinds
    assert await db.fetchval("SELECT count(*) FROM extraction_jobs") == 2
