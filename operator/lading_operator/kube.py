"""
The operator's Kubernetes client: finding the cluster through `kubernetes_asyncio`, and the calls
kopf does not make for us (status merge patches, server-side apply of the objects a pool owns and of
signing-Secret mirrors, reads, lists and deletions of those).

Finding the cluster, the standard way, with kubernetes_asyncio's own loaders: an explicit
`--kubeconfig` file (`config.load_kube_config`: exec and auth-provider plugins, token files,
certificate paths relative to the kubeconfig), else the in-cluster service account
(`config.load_incluster_config`, when `$KUBERNETES_SERVICE_HOST` is set), else `$KUBECONFIG` /
`~/.kube/config`. Credentials that expire are the library's to renew: the in-cluster loader re-reads
the ServiceAccount token file once a minute (bound tokens rotate), and an exec plugin runs again once
the ExecCredential it printed expires. After a 401 the credentials are loaded again and the call is
retried once.

kopf logs in with the same server and credentials: `Cluster.connection_info()` builds kopf's
`ConnectionInfo` from the loaded `Configuration` (app.py's login handler returns it; kopf asks again
after a 401 or once an exec credential's expiry has passed, so it gets the renewed token).

Calls (`Client`):
- owned objects are written with server-side apply (`apply`: PATCH with
  `application/apply-patch+yaml`, `fieldManager=lading-operator`, `force=true`): the whole desired
  object every time, so a field we stop rendering is removed by the API server;
- status is a JSON merge patch on the status subresource (`merge_patch_unread`: the answer, the whole
  object, is not decoded), as are the scaler's replica counts (`merge_patch`; they are not part of the
  applied object: see pool_steps/owned.py);
- 429, and 503 with `Retry-After`, are retried after the server's `Retry-After` (bounded by
  `RETRY_AFTER_MAX_S`, at most `RETRY_ATTEMPTS` tries). kopf's own calls (watches, its
  annotations and finalizers, events) retry 429 and 5xx with its `networking.error_backoffs`,
  waiting at least a 429's Retry-After.
Every call has a timeout. Bodies of errors are shortened before they reach an exception; calls on
Secrets (`mirroring` reads signing secrets and applies their mirrors) replace the body with the call
and the Secret's name, so no value can reach an exception.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import json
import logging
import os
import pathlib
import urllib.parse
from collections.abc import Mapping
from typing import Any

import aiohttp
import kopf
import orjson
from kubernetes_asyncio import client as k8s_client
from kubernetes_asyncio import config as k8s_config
from kubernetes_asyncio.config import incluster_config

from lading_operator import rendering

logger = logging.getLogger("lading.operator.kube")

REQUEST_TIMEOUT_S = 30.0
"""One API call; the API server answers in milliseconds when healthy."""
ERROR_BODY_CHARS = 300
FIELD_MANAGER = rendering.FIELD_MANAGER
"""The field manager of every write (server-side apply and merge patches)."""
APPLY_CONTENT_TYPE = "application/apply-patch+yaml"
RETRY_ATTEMPTS = 5
"""Tries of one call answered 429 (or 503 with Retry-After)."""
RETRY_AFTER_MAX_S = 10.0
"""The longest wait one Retry-After may impose; a longer one is cut to this."""
RETRY_DEFAULT_S = 1.0
"""The wait after a 429 without Retry-After."""
EXPIRED = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
"""An exec credential's expiry that makes kubernetes_asyncio's loader run the plugin again."""
NAMESPACE_FILE = pathlib.Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


class KubeError(Exception):
    """An API call failed; `status` is the HTTP status (0: no answer)."""

    def __init__(self, *, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


@dataclasses.dataclass
class Cluster:
    """A loaded cluster: kubernetes_asyncio's `Configuration` and what renews its credentials."""

    configuration: k8s_client.Configuration
    default_namespace: str | None = None
    loader: Any = None
    """kubernetes_asyncio's KubeConfigLoader when loaded from a kubeconfig."""
    in_cluster: Any = None
    """kubernetes_asyncio's InClusterConfigLoader when loaded in a pod."""
    _renewing: asyncio.Lock = dataclasses.field(default_factory=asyncio.Lock, repr=False)
    """One renewal at a time: concurrent calls that find the credential expired run the plugin once."""

    def __post_init__(self) -> None:
        if self.loader is not None and self._exec_plugin():
            self.configuration.refresh_api_key_hook = self._renew_exec_credential

    def _exec_plugin(self) -> bool:
        user = getattr(self.loader, "_user", None)
        return user is not None and "exec" in user

    async def _renew_exec_credential(self, configuration: k8s_client.Configuration, *_: Any) -> None:
        """Run the exec plugin again once the credential it printed has expired."""
        if not _expired(getattr(self.loader, "exec_plugin_expiry", None), unset=False):
            return
        async with self._renewing:
            if _expired(getattr(self.loader, "exec_plugin_expiry", None), unset=False):  # not renewed meanwhile
                await self._reload()

    async def refresh(self) -> None:
        """Load the credentials again (after a 401, or an expired exec credential)."""
        async with self._renewing:
            await self._reload()

    async def _reload(self) -> None:
        if self.loader is not None:
            exec_plugin = self._exec_plugin()
            if exec_plugin:  # the loader runs the plugin again only once the expiry it holds has passed
                self.loader.exec_plugin_expiry = EXPIRED
            await self.loader.load_and_set(self.configuration)
            if exec_plugin:
                if getattr(self.loader, "exec_plugin_expiry", None) is EXPIRED:  # the plugin gave no expiry
                    del self.loader.exec_plugin_expiry
                self.configuration.refresh_api_key_hook = self._renew_exec_credential
        elif self.in_cluster is not None:
            self.in_cluster.load_and_set(self.configuration)  # reads the token file again, now

    @property
    def expiration(self) -> datetime.datetime | None:
        """When the current credential expires (exec plugins that say so), else None."""
        expiry = getattr(self.loader, "exec_plugin_expiry", None) if self.loader is not None else None
        return expiry if isinstance(expiry, datetime.datetime) else None

    async def connection_info(self) -> kopf.ConnectionInfo:
        """kopf's view of the same server and credentials (renewed first where they expired)."""
        config = self.configuration
        authorization = await config.get_api_key_with_prefix("BearerToken")
        scheme, token = [*str(authorization).split(" ", 1), ""][:2] if authorization else (None, None)
        https = str(config.host).startswith("https://")
        return kopf.ConnectionInfo(
            server=str(config.host),
            ca_path=config.ssl_ca_cert if https else None,
            insecure=(not config.verify_ssl) if https else None,
            certificate_path=config.cert_file if https else None,
            private_key_path=config.key_file if https else None,
            scheme=scheme or None,
            token=token or None,
            default_namespace=self.default_namespace,
            expiration=self.expiration,
        )


def _expired(expiry: Any, *, unset: bool = True) -> bool:
    """Whether a credential expiring at `expiry` is (about to be) expired; `unset`: what no expiry means."""
    if not isinstance(expiry, datetime.datetime):
        return unset
    now = datetime.datetime.now(tz=expiry.tzinfo or datetime.UTC)
    return now >= expiry - datetime.timedelta(seconds=10)


def _new_configuration() -> k8s_client.Configuration:
    # Not Configuration(): the library may copy a process-wide default into it; each operator
    # (tests run several in one process) has its own.
    configuration: k8s_client.Configuration = type.__call__(k8s_client.Configuration)
    return configuration


async def load(kubeconfig: str | None) -> Cluster:
    """The cluster and credentials: `kubeconfig` if given, else in-cluster, else `$KUBECONFIG`."""
    refused: kopf.LoginError | None = None
    if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        try:
            return in_cluster()
        except kopf.LoginError as exc:  # a pod without a ServiceAccount token: a kubeconfig may still do
            refused = exc
    if kubeconfig is None:
        kubeconfig = os.environ.get("KUBECONFIG") or KUBE_CONFIG_DEFAULT
        what = "not in a pod, and no $KUBECONFIG or ~/.kube/config"
    else:
        what = f"cannot read kubeconfig {kubeconfig}"
    files = _existing(kubeconfig)
    if not files:
        raise refused or kopf.LoginError(f"no cluster found: {what}; pass --kubeconfig")
    configuration = _new_configuration()
    try:
        loader = await k8s_config.load_kube_config(
            config_file=files, client_configuration=configuration, persist_config=False
        )
    except (k8s_config.ConfigException, KeyError, TypeError, AssertionError, OSError) as exc:
        raise kopf.LoginError(f"kubeconfig {kubeconfig} unusable: {type(exc).__name__}: {exc}") from None
    context = loader.current_context or {}
    namespace = (context.get("context") or {}).get("namespace") if isinstance(context, Mapping) else None
    return Cluster(configuration=configuration, default_namespace=namespace, loader=loader)


KUBE_CONFIG_DEFAULT = "~/.kube/config"


def _existing(kubeconfig: str) -> str:
    """The files of a kubeconfig path list (`$KUBECONFIG` style) that exist, joined again ('' if none)."""
    paths = [pathlib.Path(p).expanduser() for p in kubeconfig.split(os.pathsep) if p]
    return os.pathsep.join(str(p) for p in paths if p.is_file())


def in_cluster(
    *,
    token_file: str = incluster_config.SERVICE_TOKEN_FILENAME,
    ca_file: str = incluster_config.SERVICE_CERT_FILENAME,
    environ: Mapping[str, str] | None = None,
) -> Cluster:
    """The pod's ServiceAccount (`$KUBERNETES_SERVICE_HOST`/`_PORT`, token and CA files), loaded by
    kubernetes_asyncio's in-cluster loader: it re-reads the token file once a minute."""
    configuration = _new_configuration()
    loader = incluster_config.InClusterConfigLoader(
        token_filename=token_file, cert_filename=ca_file, environ=dict(os.environ if environ is None else environ)
    )
    try:
        loader.load_and_set(configuration)
    except k8s_config.ConfigException as exc:
        raise kopf.LoginError(f"in-cluster service account unusable: {exc}") from None
    namespace = NAMESPACE_FILE.read_text().strip() if NAMESPACE_FILE.is_file() else None
    return Cluster(configuration=configuration, default_namespace=namespace or None, in_cluster=loader)


def for_server(server: str, *, token: str | None = None) -> Cluster:
    """A cluster given by its URL (and a bearer token): for tools and tests on a local API server."""
    configuration = _new_configuration()
    configuration.host = server.rstrip("/")
    if token is not None:
        configuration.api_key["BearerToken"] = f"Bearer {token}"
    return Cluster(configuration=configuration)


class Client:
    """JSON over HTTP to the API server through kubernetes_asyncio's `ApiClient`.
    Use as `async with Client(cluster) as client:`."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self._api: k8s_client.ApiClient | None = None

    async def __aenter__(self) -> Client:
        self.cluster.configuration.connection_pool_maxsize = 32
        self._api = k8s_client.ApiClient(configuration=self.cluster.configuration)
        self._api.user_agent = FIELD_MANAGER
        return self

    async def __aexit__(self, *_: object) -> None:
        if self._api is not None:
            await self._api.close()
            self._api = None

    async def _send(
        self, method: str, path: str, *, params: list[tuple[str, str]], body: Any, content_type: str | None
    ) -> tuple[int, Mapping[str, str], bytes]:
        assert self._api is not None, "use the client inside `async with`"
        headers = {"Accept": "application/json"}
        if content_type:
            headers["Content-Type"] = content_type
        elif body is not None:
            headers["Content-Type"] = "application/json"
        try:
            response = await self._api.call_api(
                path, method, query_params=params, header_params=headers, body=body,
                auth_settings=["BearerToken"], _preload_content=False, _request_timeout=REQUEST_TIMEOUT_S,
            )  # fmt: skip
            try:
                data = await response.read()
            finally:
                response.release()
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise KubeError(status=0, message=f"{method} {path}: {type(exc).__name__}") from None
        return int(response.status), response.headers, data

    async def _call(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        content_type: str | None = None,
        params: Mapping[str, str] | None = None,
        decode: bool = True,
    ) -> Any:
        """The decoded answer (None when empty, or when not `decode`d)."""
        base, _, query = path.partition("?")
        query_params = urllib.parse.parse_qsl(query) + list((params or {}).items())
        refreshed = False
        for attempt in range(1, RETRY_ATTEMPTS + 1):
            status, headers, data = await self._send(
                method, base, params=query_params, body=body, content_type=content_type
            )
            if status == 401 and not refreshed:
                refreshed = True
                await self.cluster.refresh()
                continue
            delay = retry_delay(status, headers.get("Retry-After"))
            if delay is not None and attempt < RETRY_ATTEMPTS:
                logger.info("%s %s: HTTP %d, retrying in %.1f s", method, base, status, delay)
                await asyncio.sleep(delay)
                continue
            if status >= 400:
                text = data[: ERROR_BODY_CHARS * 4].decode("utf-8", errors="replace")[:ERROR_BODY_CHARS]
                raise KubeError(status=status, message=f"{method} {base}: {text}")
            return _decoded(data) if data and decode else None
        raise AssertionError("unreachable: the last attempt returns or raises")  # pragma: no cover

    async def get(self, path: str) -> dict[str, Any] | None:
        """The object (or list) at `path`, or None when it does not exist."""
        try:
            result = await self._call("GET", path)
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise
        return dict(result) if isinstance(result, Mapping) else None

    async def create(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return dict(await self._call("POST", path, body=dict(body), params={"fieldManager": FIELD_MANAGER}))

    async def apply(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """Server-side apply of the whole desired object at its `path` (created when missing)."""
        result = await self._call(
            "PATCH", path, body=dict(body), content_type=APPLY_CONTENT_TYPE,
            params={"fieldManager": FIELD_MANAGER, "force": "true"},
        )  # fmt: skip
        return dict(result)

    async def merge_patch(self, path: str, body: Mapping[str, Any]) -> dict[str, Any] | None:
        """Merge-patch the object; None when it does not exist (any more)."""
        try:
            result = await self._call(
                "PATCH", path, body=dict(body), content_type="application/merge-patch+json",
                params={"fieldManager": FIELD_MANAGER},
            )  # fmt: skip
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise
        return dict(result) if isinstance(result, Mapping) else None

    async def merge_patch_unread(self, path: str, body: Mapping[str, Any]) -> bool:
        """`merge_patch` that leaves the answer unread: True when patched, False when the object does not
        exist (any more). For status writes, which the API server answers with the whole object (80 KB
        for a batch of 1,000 inline documents) and whose caller needs nothing from it."""
        try:
            await self._call(
                "PATCH", path, body=dict(body), content_type="application/merge-patch+json",
                params={"fieldManager": FIELD_MANAGER}, decode=False,
            )  # fmt: skip
        except KubeError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    async def delete(self, path: str) -> bool:
        try:
            await self._call("DELETE", path)
        except KubeError as exc:
            if exc.status == 404:
                return False
            raise
        return True


def retry_delay(status: int, retry_after: str | None) -> float | None:
    """How long to wait before trying again (None: do not retry): 429 always, 503 only with a
    Retry-After; the server's Retry-After in seconds, bounded by RETRY_AFTER_MAX_S."""
    if status not in (429, 503):
        return None
    seconds: float | None = None
    if retry_after:
        with contextlib.suppress(ValueError):
            seconds = float(retry_after)
    if seconds is None:
        return RETRY_DEFAULT_S if status == 429 else None
    return min(max(seconds, 0.0), RETRY_AFTER_MAX_S)


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


def _decoded(data: bytes) -> Any:
    """An answer's JSON. orjson first: a batch's status write answers with the whole object (80 KB
    for 1,000 documents). What orjson refuses and the standard library reads (an escaped lone
    surrogate, NaN, 1e400) is read by the standard library, so that no text is refused here that a
    server may send back as it was written."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data)
