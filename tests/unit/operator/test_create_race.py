"""An object someone creates between the operator's read and its write is not taken over: a missing
object is created with a plain create (409 for theirs), never applied blind (an apply would adopt it).
Against a real HTTP server that answers as an API server does in that race."""

from __future__ import annotations

from typing import Any

import aiohttp.web
import kopf
import pytest
from lading_operator import kube, mirroring, runtime, settings
from lading_operator.pool_steps import owned


class Racing:
    """GET: 404 the first time (not there yet), then the object someone else created; POST: 409."""

    def __init__(self, theirs: dict[str, Any]) -> None:
        self.theirs = theirs
        self.gets = 0
        self.methods: list[str] = []

    async def handle(self, request: aiohttp.web.Request) -> aiohttp.web.Response:
        self.methods.append(request.method)
        if request.method == "GET":
            self.gets += 1
            if self.gets == 1:
                return aiohttp.web.json_response({"kind": "Status", "code": 404}, status=404)
            return aiohttp.web.json_response(self.theirs)
        if request.method == "POST":
            return aiohttp.web.json_response({"kind": "Status", "code": 409, "reason": "AlreadyExists"}, status=409)
        return aiohttp.web.json_response({"kind": "Status", "code": 500}, status=500)


async def _runtime(theirs: dict[str, Any]) -> tuple[Racing, aiohttp.web.AppRunner, str]:
    racing = Racing(theirs)
    app = aiohttp.web.Application()
    app.router.add_route("*", "/{tail:.*}", racing.handle)
    runner = aiohttp.web.AppRunner(app)
    await runner.setup()
    await aiohttp.web.TCPSite(runner, "127.0.0.1", 0).start()
    return racing, runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


def _rt(api: kube.Client) -> runtime.Runtime:
    config = settings.OperatorSettings(database_url="postgresql://x/y", pool_namespaces=("lading-system",))
    return runtime.Runtime(settings=config, db=None, api=api, cluster=api.cluster)


async def test_a_deployment_created_by_someone_else_meanwhile_is_not_owned_and_not_applied() -> None:
    theirs = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "p-worker", "namespace": "ns"}}
    racing, runner, url = await _runtime(theirs)
    try:
        async with kube.Client(kube.for_server(url)) as api:
            body = kopf.Body({"metadata": {"namespace": "ns", "name": "p", "uid": "pool-uid"}, "spec": {}})
            ours = owned.Owned("apps/v1", "deployments", {
                "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "p-worker", "namespace": "ns"},
                "spec": {"template": {"spec": {"containers": [{"name": "w", "image": "lading:1"}]}}},
            })  # fmt: skip
            with pytest.raises(owned.NotOwned):
                await owned.ensure(_rt(api), body, ours)
    finally:
        await runner.cleanup()
    assert racing.methods == ["GET", "POST", "GET"], "no PATCH (apply) was sent"


async def test_a_secret_created_by_someone_else_meanwhile_is_left_alone() -> None:
    theirs = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "lading-endpoint-acme.erp"},
              "data": {"secret": "dGhlaXJz"}}  # fmt: skip
    racing, runner, url = await _runtime(theirs)
    try:
        async with kube.Client(kube.for_server(url)) as api:
            source = mirroring.Source(endpoint="acme/erp", data="b3Vycw==", digest="0" * 64)
            assert await mirroring.ensure(_rt(api), source, "lading-system") is False
    finally:
        await runner.cleanup()
    assert racing.methods == ["GET", "POST", "GET"], "no PATCH (apply) was sent"
