"""
The operator's own small Kubernetes client: finding the cluster, and the few calls kopf does
not make for us (status merge patches, the Deployments and Services of a pool, the mirrors of
signing Secrets).

Finding the cluster the standard way: an explicit `--kubeconfig` file, else the in-cluster service
account, else `$KUBECONFIG` / `~/.kube/config`. kopf logs in with the same `ConnectionInfo`
(`app.py` registers a login handler returning it), so both speak to the same API server with the
same credentials.

Writes are JSON merge patches and plain creates: no server-side apply, no PUT (the operator must
work against any conformant API server, and its test emulator supports neither). Every call has
a timeout. Bodies of errors are shortened before they reach an exception; calls on Secrets
(`mirroring` reads signing secrets and writes their mirrors) replace the body with the call and
the Secret's name, so no value can reach an exception.
"""

from __future__ import annotations

import base64
import json
import os
import pathlib
import ssl
import tempfile
from collections.abc import Mapping
from typing import Any

import aiohttp
import kopf
import yaml

REQUEST_TIMEOUT_S = 30.0
"""One API call; the API server answers in milliseconds when healthy."""
ERROR_BODY_CHARS = 300


class KubeError(Exception):
    """An API call failed; `status` is the HTTP status (0: no answer)."""

    def __init__(self, *, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


def connection_info(kubeconfig: str | None) -> kopf.ConnectionInfo:
    """The cluster and credentials: `kubeconfig` if given, else in-cluster, else `$KUBECONFIG`."""
    settings = kopf.OperatorSettings()
    if kubeconfig is None:
        found = kopf.login_with_service_account(settings=settings) or kopf.login_with_kubeconfig(settings=settings)
        if found is None:
            raise kopf.LoginError(
                "no cluster found: not in a pod, no $KUBECONFIG, no ~/.kube/config; pass --kubeconfig"
            )
        return found
    path = pathlib.Path(kubeconfig).expanduser()
    try:
        config = yaml.safe_load(path.read_text()) or {}
    except OSError as exc:
        raise kopf.LoginError(f"cannot read kubeconfig {path}: {exc.strerror}") from None
    current = config.get("current-context")
    if not current:
        raise kopf.LoginError(f"kubeconfig {path} has no current-context")
    by_name = {
        section: {item["name"]: item.get(section.rstrip("s")) or {} for item in config.get(section, [])}
        for section in ("contexts", "clusters", "users")
    }
    context = by_name["contexts"].get(current)
    if context is None or context.get("cluster") not in by_name["clusters"]:
        raise kopf.LoginError(f"kubeconfig {path}: context {current!r} or its cluster is not defined")
    cluster = by_name["clusters"][context["cluster"]]
    user = by_name["users"].get(context.get("user"), {})
    return kopf.ConnectionInfo(
        server=cluster["server"],
        ca_path=cluster.get("certificate-authority"),
        ca_data=cluster.get("certificate-authority-data"),
        insecure=cluster.get("insecure-skip-tls-verify"),
        certificate_path=user.get("client-certificate"),
        certificate_data=user.get("client-certificate-data"),
        private_key_path=user.get("client-key"),
        private_key_data=user.get("client-key-data"),
        username=user.get("username"),
        password=user.get("password"),
        token=user.get("token"),
        default_namespace=context.get("namespace"),
    )


def _ssl_context(info: kopf.ConnectionInfo) -> ssl.SSLContext | bool:
    if not info.server.startswith("https://"):
        return False
    if info.insecure:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    elif info.ca_data:
        data = info.ca_data if isinstance(info.ca_data, bytes) else info.ca_data.encode()
        context = ssl.create_default_context(cadata=base64.b64decode(data).decode())
    else:
        context = ssl.create_default_context(cafile=os.fspath(info.ca_path) if info.ca_path else None)
    if info.certificate_path or info.certificate_data:
        with tempfile.TemporaryDirectory() as tmp:
            cert = _material(info.certificate_path, info.certificate_data, pathlib.Path(tmp) / "cert.pem")
            key = _material(info.private_key_path, info.private_key_data, pathlib.Path(tmp) / "key.pem")
            context.load_cert_chain(cert, key)
    return context


def _material(path: Any, data: str | bytes | None, target: pathlib.Path) -> str:
    if path:
        return str(os.fspath(path))
    raw = data if isinstance(data, bytes) else (data or "").encode()
    target.write_bytes(base64.b64decode(raw))
    target.chmod(0o600)
    return str(target)


class Client:
    """JSON over HTTP to the API server. Use as `async with Client(info) as client:`."""

    def __init__(self, info: kopf.ConnectionInfo) -> None:
        self._info = info
        self._base = info.server.rstrip("/")
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Client:
        headers = {"Accept": "application/json"}
        if self._info.token:
            headers["Authorization"] = f"{self._info.scheme or 'Bearer'} {self._info.token}"
        auth = None
        if self._info.username and self._info.password:
            auth = aiohttp.BasicAuth(self._info.username, self._info.password)
        self._session = aiohttp.ClientSession(
            headers=headers,
            auth=auth,
            timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S),
            connector=aiohttp.TCPConnector(ssl=_ssl_context(self._info), limit=32),
        )
        return self

    async def __aexit__(self, *_: object) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _call(self, method: str, path: str, *, body: Any = None, content_type: str | None = None) -> Any:
        assert self._session is not None, "use the client inside `async with`"
        headers = {"Content-Type": content_type} if content_type else {}
        try:
            async with self._session.request(method, self._base + path, json=body, headers=headers) as response:
                text = await response.text()
                if response.status >= 400:
                    raise KubeError(status=response.status, message=f"{method} {path}: {text[:ERROR_BODY_CHARS]}")
                return json.loads(text) if text else None
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise KubeError(status=0, message=f"{method} {path}: {type(exc).__name__}") from None

    async def get(self, path: str) -> dict[str, Any] | None:
        """The object at `path`, or None when it does not exist."""
        try:
            result = await self._call("GET", path)
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise
        return dict(result) if isinstance(result, Mapping) else None

    async def create(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return dict(await self._call("POST", path, body=dict(body)))

    async def merge_patch(self, path: str, body: Mapping[str, Any]) -> dict[str, Any] | None:
        """Merge-patch the object; None when it does not exist (any more)."""
        try:
            result = await self._call("PATCH", path, body=dict(body), content_type="application/merge-patch+json")
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise
        return dict(result) if isinstance(result, Mapping) else None

    async def delete(self, path: str) -> bool:
        try:
            await self._call("DELETE", path)
        except KubeError as exc:
            if exc.status == 404:
                return False
            raise
        return True


def path(
    api_version: str, plural: str, *, namespace: str | None, name: str | None = None, sub: str | None = None
) -> str:
    """The REST path of a collection or object, e.g. ('apps/v1', 'deployments', namespace='a', name='w')."""
    root = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    parts = [root]
    if namespace is not None:
        parts.append(f"namespaces/{namespace}")
    parts.append(plural)
    if name is not None:
        parts.append(name)
    if sub is not None:
        parts.append(sub)
    return "/".join(parts)
