"""Finding the cluster (`lading operator --kubeconfig`, in-cluster): kubernetes_asyncio's loaders through
`lading_operator.kube`, against real servers: the emulator, and a TLS server whose CA a kubeconfig
names by a relative path. Also the client's retries (429/503 with Retry-After)."""

from __future__ import annotations

import asyncio
import base64
import datetime
import json
import pathlib
import shutil
import ssl
import subprocess
import sys
from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiohttp.web
import kopf
import pytest
from kubernetes_asyncio.config import incluster_config
from lading_operator import conditions, kube, mirroring, runtime, settings

from tests.support import kube_emulator


def _write(path: pathlib.Path, config: Mapping[str, object]) -> str:
    path.write_text(json.dumps(config))
    return str(path)


def _kubeconfig(cluster: dict[str, Any], user: dict[str, Any], namespace: str = "lading-system") -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Config", "current-context": "prod",
        "contexts": [{"name": "dev", "context": {"cluster": "dev", "user": "dev"}},
                     {"name": "prod", "context": {"cluster": "prod", "user": "ops", "namespace": namespace}}],
        "clusters": [{"name": "dev", "cluster": {"server": "https://dev.example:6443"}},
                     {"name": "prod", "cluster": cluster}],
        "users": [{"name": "dev", "user": {}}, {"name": "ops", "user": user}],
    }  # fmt: skip


async def test_the_current_context_picks_cluster_user_and_namespace(tmp_path: pathlib.Path) -> None:
    config = _kubeconfig({"server": "https://prod.example:6443", "certificate-authority-data": "Q0E="},
                         {"token": "t0ken"})  # fmt: skip
    cluster = await kube.load(_write(tmp_path / "config", config))
    info = await cluster.connection_info()
    assert info.server == "https://prod.example:6443"
    assert (info.scheme, info.token) == ("Bearer", "t0ken")
    assert info.ca_path is not None and pathlib.Path(str(info.ca_path)).read_bytes() == b"CA"  # noqa: ASYNC240
    assert info.default_namespace == "lading-system"


async def test_a_missing_or_unusable_kubeconfig_is_a_clear_error(tmp_path: pathlib.Path) -> None:
    with pytest.raises(kopf.LoginError, match="cannot read kubeconfig"):
        await kube.load(str(tmp_path / "absent"))
    broken = {"current-context": "x", "contexts": [{"name": "x", "context": {"cluster": "gone", "user": "u"}}],
              "clusters": [], "users": []}  # fmt: skip
    with pytest.raises(kopf.LoginError, match="unusable"):
        await kube.load(_write(tmp_path / "broken", broken))


# --- Exec plugins, against the emulator.

PLUGIN = """
import datetime, json, pathlib, sys
counter = pathlib.Path(sys.argv[1])
n = int(counter.read_text()) + 1 if counter.exists() else 1
counter.write_text(str(n))
lifetime = float(sys.argv[2]) if n == 1 or sys.argv[3:] != ["first"] else 3600.0
expires = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=lifetime)
status = {"token": f"from-plugin-{n}", "expirationTimestamp": expires.strftime("%Y-%m-%dT%H:%M:%SZ")}
print(json.dumps({"apiVersion": "client.authentication.k8s.io/v1beta1", "kind": "ExecCredential", "status": status}))
"""


def _exec_kubeconfig(tmp_path: pathlib.Path, server: str, *, lifetime_s: float, first_only: bool = False) -> str:
    """A kubeconfig whose exec plugin prints `from-plugin-<run>` valid `lifetime_s` (the first run only
    with `first_only`; later ones an hour)."""
    script = tmp_path / "plugin.py"
    script.write_text(PLUGIN)
    args = [str(script), str(tmp_path / "runs"), str(lifetime_s), *(["first"] if first_only else [])]
    user = {"exec": {"apiVersion": "client.authentication.k8s.io/v1beta1", "command": sys.executable,
                     "args": args}}  # fmt: skip
    return _write(tmp_path / "config", _kubeconfig({"server": server}, user))


def _authorizations(emulator: kube_emulator.KubeEmulator) -> list[str]:
    return [str(r.headers.get("Authorization")) for r in emulator._requests if r.resource is not None]


async def test_an_exec_plugin_supplies_the_token_of_every_call_and_kopfs(tmp_path: pathlib.Path) -> None:
    async with kube_emulator.serving(validate=False) as emulator:
        server = str(emulator.servers[0].url).rstrip("/")
        cluster = await kube.load(_exec_kubeconfig(tmp_path, server, lifetime_s=3600))
        async with kube.Client(cluster) as api:
            assert await api.get(kube.path("v1", "secrets", namespace="acme", name="none")) is None
            await api.create(kube.path("v1", "secrets", namespace="acme"),
                             {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}})  # fmt: skip
        assert _authorizations(emulator) == ["Bearer from-plugin-1"] * 2
        info = await cluster.connection_info()
        assert info.token == "from-plugin-1" and info.expiration is not None
        assert info.expiration > datetime.datetime.now(datetime.UTC) + datetime.timedelta(minutes=50)


async def test_an_expired_exec_credential_is_renewed_before_the_next_call(tmp_path: pathlib.Path) -> None:
    async with kube_emulator.serving(validate=False) as emulator:
        server = str(emulator.servers[0].url).rstrip("/")
        cluster = await kube.load(_exec_kubeconfig(tmp_path, server, lifetime_s=0))  # expired once printed
        async with kube.Client(cluster) as api:
            for _ in range(2):
                await api.get(kube.path("v1", "secrets", namespace="acme", name="none"))
        assert _authorizations(emulator) == ["Bearer from-plugin-2", "Bearer from-plugin-3"]


async def test_concurrent_calls_renew_an_expired_exec_credential_once(tmp_path: pathlib.Path) -> None:
    async with kube_emulator.serving(validate=False) as emulator:
        server = str(emulator.servers[0].url).rstrip("/")
        cluster = await kube.load(_exec_kubeconfig(tmp_path, server, lifetime_s=0, first_only=True))
        async with kube.Client(cluster) as api:
            path = kube.path("v1", "secrets", namespace="acme", name="none")
            await asyncio.gather(*(api.get(path) for _ in range(5)))
        assert _authorizations(emulator) == ["Bearer from-plugin-2"] * 5
        assert (tmp_path / "runs").read_text() == "2"


# --- TLS: a CA named relative to the kubeconfig, and the in-cluster ServiceAccount.


@pytest.fixture
def certificate(tmp_path: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
    """A self-signed certificate for 127.0.0.1 (it is its own CA) and its key."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make a certificate")
    certs = tmp_path / "certs"
    certs.mkdir()
    cert, key = certs / "ca.crt", certs / "ca.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key


class TlsServer:
    """An HTTPS API server that answers any GET with an empty object when the bearer token is accepted."""

    def __init__(self) -> None:
        self.accepted: set[str] = set()
        self.seen: list[str] = []
        self.url = ""

    async def handle(self, request: aiohttp.web.Request) -> aiohttp.web.Response:
        authorization = request.headers.get("Authorization", "")
        self.seen.append(authorization)
        if authorization not in self.accepted:
            return aiohttp.web.json_response({"kind": "Status", "code": 401}, status=401)
        return aiohttp.web.json_response({"kind": "ConfigMap", "metadata": {"name": request.path.rsplit("/", 1)[-1]}})


@pytest.fixture
async def tls_server(certificate: tuple[pathlib.Path, pathlib.Path]) -> AsyncIterator[TlsServer]:
    server = TlsServer()
    app = aiohttp.web.Application()
    app.router.add_get("/{tail:.*}", server.handle)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(*certificate)
    runner = aiohttp.web.AppRunner(app)
    await runner.setup()
    site = aiohttp.web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    port = runner.addresses[0][1]
    server.url = f"https://127.0.0.1:{port}"
    try:
        yield server
    finally:
        await runner.cleanup()


CONFIGMAP = kube.path("v1", "configmaps", namespace="acme", name="settings")


async def test_a_certificate_authority_relative_to_the_kubeconfig_verifies_the_server(
    tmp_path: pathlib.Path, tls_server: TlsServer
) -> None:
    tls_server.accepted.add("Bearer t0ken")
    config = _kubeconfig({"server": tls_server.url, "certificate-authority": "certs/ca.crt"}, {"token": "t0ken"})
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    cluster = await kube.load(_write(tmp_path / "config", config))
    assert cluster.configuration.ssl_ca_cert == str(tmp_path / "certs" / "ca.crt")
    async with kube.Client(cluster) as api:
        assert (await api.get(CONFIGMAP) or {})["metadata"]["name"] == "settings"
    # Without the CA the same server is refused: the relative path was what verified it.
    unverified = _kubeconfig({"server": tls_server.url}, {"token": "t0ken"})
    async with kube.Client(await kube.load(_write(elsewhere / "config", unverified))) as api:
        with pytest.raises(kube.KubeError, match="HTTP 0"):
            await api.get(CONFIGMAP)


async def test_in_cluster_a_rotated_token_file_is_read_again(
    tmp_path: pathlib.Path, tls_server: TlsServer, certificate: tuple[pathlib.Path, pathlib.Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    token = tmp_path / "token"
    token.write_text("first")
    port = tls_server.url.rsplit(":", 1)[1]
    environ = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": port}
    cluster = kube.in_cluster(token_file=str(token), ca_file=str(certificate[0]), environ=environ)
    tls_server.accepted = {"Bearer first", "Bearer second"}
    async with kube.Client(cluster) as api:
        await api.get(CONFIGMAP)
        # The kubelet rotates the bound token: the loader reads the file again once its period passed.
        token.write_text("second")
        monkeypatch.setattr(incluster_config, "TOKEN_REFRESH_PERIOD", datetime.timedelta(0))
        cluster.in_cluster.token_expires_at = datetime.datetime.now()
        await api.get(CONFIGMAP)
        # Rotated again and the old one refused before the period passed: the 401 reads it at once.
        cluster.in_cluster.token_expires_at = datetime.datetime.now() + datetime.timedelta(hours=1)
        token.write_text("third")
        tls_server.accepted = {"Bearer third"}
        await api.get(CONFIGMAP)
    assert tls_server.seen == ["Bearer first", "Bearer second", "Bearer second", "Bearer third"]
    assert (await cluster.connection_info()).token == "third"


# --- Retries.


class Flaky:
    """Answers the first requests with `statuses` (and their Retry-After), then 200."""

    def __init__(self, statuses: list[tuple[int, str | None]]) -> None:
        self.statuses = statuses
        self.times: list[float] = []

    async def handle(self, request: aiohttp.web.Request) -> aiohttp.web.Response:
        self.times.append(asyncio.get_running_loop().time())
        if self.statuses:
            status, retry_after = self.statuses.pop(0)
            headers = {"Retry-After": retry_after} if retry_after is not None else {}
            return aiohttp.web.json_response({"kind": "Status", "code": status}, status=status, headers=headers)
        return aiohttp.web.json_response({"kind": "ConfigMap", "metadata": {"name": "settings"}})


async def _serve(handler: Any) -> tuple[aiohttp.web.AppRunner, str]:
    app = aiohttp.web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    runner = aiohttp.web.AppRunner(app)
    await runner.setup()
    site = aiohttp.web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


async def test_429_and_503_with_retry_after_are_retried_after_the_servers_wait() -> None:
    flaky = Flaky([(429, "1"), (503, "0"), (429, None)])
    runner, url = await _serve(flaky.handle)
    try:
        async with kube.Client(kube.for_server(url)) as api:
            assert await api.get(CONFIGMAP) is not None
        assert len(flaky.times) == 4
        assert flaky.times[1] - flaky.times[0] >= 1.0  # Retry-After: 1
        # A 503 without Retry-After is an error at once (the caller's loop retries with its backoff).
        flaky.statuses = [(503, None)]
        async with kube.Client(kube.for_server(url)) as api:
            with pytest.raises(kube.KubeError, match="HTTP 503"):
                await api.get(CONFIGMAP)
    finally:
        await runner.cleanup()
    assert kube.retry_delay(429, "3600") == kube.RETRY_AFTER_MAX_S
    assert kube.retry_delay(429, "soon") == kube.RETRY_DEFAULT_S
    assert kube.retry_delay(500, "1") is None


def test_paths_of_collections_objects_and_subresources() -> None:
    assert kube.path("v1", "secrets", namespace="acme", name="s") == "/api/v1/namespaces/acme/secrets/s"
    assert kube.path("lading.dev/v1alpha1", "tenantquotas", namespace=None) == "/apis/lading.dev/v1alpha1/tenantquotas"
    assert (
        kube.path("apps/v1", "deployments", namespace="a", name="w", sub="status")
        == "/apis/apps/v1/namespaces/a/deployments/w/status"
    )


def test_a_condition_keeps_its_transition_time_while_its_status_holds() -> None:
    first = conditions.condition(None, type="Ready", value=False, reason="SecretMissing")
    old = [{"type": "Ready", "status": "False", "lastTransitionTime": "2020-01-01T00:00:00Z"}]
    same = conditions.condition(old, type="Ready", value=False, reason="SecretMissing", message="still")
    flipped = conditions.condition(old, type="Ready", value=True, reason="Registered")
    assert same.last_transition_time == "2020-01-01T00:00:00Z"
    assert flipped.last_transition_time != "2020-01-01T00:00:00Z"
    assert first.status == "False" and flipped.status == "True"
    assert not conditions.changed({"a": 1, "b": 2}, {"a": 1, "b": 2})
    assert conditions.changed({"a": 1}, {"a": 2})


def test_a_status_field_that_went_away_is_removed_and_unchanged_ones_are_not_sent() -> None:
    live = {"phase": "Running", "pausedUntil": "2026-01-01T00:00:00Z", "total": 5}
    assert conditions.status_patch(live, {"phase": "Running", "total": 6}) == {"total": 6, "pausedUntil": None}
    assert conditions.changed(live, {"phase": "Running", "total": 5})
    assert conditions.status_patch(live, dict(live)) is None
    assert conditions.status_patch(None, {"phase": "Pending"}) == {"phase": "Pending"}


async def test_an_error_of_a_call_on_a_secret_never_carries_its_value() -> None:
    value = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

    refused = {"POST"}

    async def echo(request: aiohttp.web.Request) -> aiohttp.web.Response:
        if request.method == "GET":
            return aiohttp.web.json_response({"kind": "Status", "code": 404}, status=404)
        if request.method not in refused:
            return aiohttp.web.json_response({"kind": "Secret"}, status=201)
        return aiohttp.web.json_response({"kind": "Status", "code": 422, "message": await request.text()}, status=422)

    runner, url = await _serve(echo)
    try:
        async with kube.Client(kube.for_server(url)) as api:
            config = settings.OperatorSettings(database_url="postgresql://x/y", pool_namespaces=("lading-system",))
            rt = runtime.Runtime(settings=config, db=None, api=api, cluster=api.cluster)
            encoded = base64.b64encode(value.encode()).decode()
            source = mirroring.Source(endpoint="acme/erp", data=encoded, digest="0" * 64)
            # The API server's answer (here: the whole request, value included) is not in the error,
            # whether the create or the apply that follows it is refused.
            for method, call in (("POST", "POST"), ("PATCH", "APPLY")):
                refused.clear()
                refused.add(method)
                with pytest.raises(kube.KubeError) as caught:
                    await mirroring.ensure(rt, source, "lading-system")
                assert str(caught.value) == f"HTTP 422: {call} Secret lading-system/lading-endpoint-acme.erp"
            with pytest.raises(kube.KubeError) as raw:
                await api.apply(kube.path("v1", "secrets", namespace="x", name="y"), {"data": {"k": encoded}})
            assert encoded in str(raw.value), "without mirroring's wrapper the answer would carry it"
    finally:
        await runner.cleanup()


async def test_in_a_pod_without_a_service_account_token_the_kubeconfig_is_used(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    token = pathlib.Path(incluster_config.SERVICE_TOKEN_FILENAME)
    if token.exists():  # noqa: ASYNC240
        pytest.skip("this machine has a ServiceAccount token")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    with pytest.raises(kopf.LoginError, match="in-cluster service account unusable"):
        await kube.load(None)
    config = _kubeconfig({"server": "https://prod.example:6443"}, {"token": "t0ken"})
    monkeypatch.setenv("KUBECONFIG", _write(tmp_path / "config", config))
    cluster = await kube.load(None)
    assert cluster.configuration.host == "https://prod.example:6443"
