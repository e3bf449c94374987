"""
Kubernetes ServiceAccount tokens for the intake: a bearer token that is not one of Lading's
(`lading_...`) is asked about with a TokenReview (who is it?) and, for each namespace it acts in, a
SubjectAccessReview (may it `create extractionbatches.lading.dev` there?). Allowed means exactly
what a Lading token for that namespace allows; anything else answers 404 like an unknown object.

Answers are kept `cache_s` seconds per (token digest, namespace), so a busy client costs the API
server two requests per namespace per `cache_s`, not two per request; a revoked ServiceAccount token
or a removed RoleBinding takes effect within that time. The token itself is never logged or kept:
the cache is keyed by its SHA-256.

The API server, its CA and the intake's own token come from the pod (in-cluster: the service
account's files and $KUBERNETES_SERVICE_HOST) or from `lading api --kubernetes-api URL
--kubernetes-token-file F --kubernetes-ca-file F`. The intake's ServiceAccount needs `create` on
`tokenreviews.authentication.k8s.io` and `subjectaccessreviews.authorization.k8s.io` (the chart's
`api.kubernetesAuth` grants them).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import pathlib
import ssl
import time
from typing import Any, Final

import aiohttp

logger = logging.getLogger("lading.api.kube_auth")

SERVICE_ACCOUNT_DIR: Final = pathlib.Path("/var/run/secrets/kubernetes.io/serviceaccount")
GROUP: Final = "lading.dev"
RESOURCE: Final = "extractionbatches"
VERB: Final = "create"


@dataclasses.dataclass(frozen=True)
class KubeSettings:
    api_url: str
    token_file: pathlib.Path
    ca_file: pathlib.Path | None
    cache_s: float = 10.0
    timeout_s: float = 5.0

    @classmethod
    def in_cluster(cls) -> KubeSettings:
        host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        if not host:
            raise ValueError("not in a cluster ($KUBERNETES_SERVICE_HOST is unset): give --kubernetes-api")
        host = f"[{host}]" if ":" in host else host
        return cls(f"https://{host}:{port}", SERVICE_ACCOUNT_DIR / "token", SERVICE_ACCOUNT_DIR / "ca.crt")


@dataclasses.dataclass(frozen=True)
class User:
    """Who a reviewed token belongs to (the TokenReview's answer)."""

    username: str
    uid: str
    groups: tuple[str, ...]


class KubeReviewer:
    """TokenReview and SubjectAccessReview against the API server, with a short cache."""

    def __init__(self, settings: KubeSettings) -> None:
        self.settings = settings
        self._users: dict[str, tuple[float, User | None]] = {}
        self._allowed: dict[tuple[str, str], tuple[float, bool]] = {}
        self._session: aiohttp.ClientSession | None = None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def user(self, token: str) -> User | None:
        """The token's user when the API server authenticates it; None otherwise."""
        key = hashlib.sha256(token.encode("utf-8", "surrogateescape")).hexdigest()
        cached = self._users.get(key)
        if cached is not None and cached[0] > time.monotonic():
            return cached[1]
        answer = await self._post("/apis/authentication.k8s.io/v1/tokenreviews", {
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token},
        })  # fmt: skip
        status = answer.get("status") or {}
        found = None
        if status.get("authenticated") is True:
            info = status.get("user") or {}
            found = User(str(info.get("username", "")), str(info.get("uid", "")), tuple(info.get("groups") or ()))
        self._remember(self._users, key, found)
        return found

    async def may_submit(self, token: str, user: User, namespace: str) -> bool:
        """Whether `user` may create ExtractionBatches in `namespace`."""
        key = (hashlib.sha256(token.encode("utf-8", "surrogateescape")).hexdigest(), namespace)
        cached = self._allowed.get(key)
        if cached is not None and cached[0] > time.monotonic():
            return cached[1]
        answer = await self._post("/apis/authorization.k8s.io/v1/subjectaccessreviews", {
            "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": {"user": user.username, "uid": user.uid, "groups": list(user.groups),
                     "resourceAttributes": {"namespace": namespace, "verb": VERB, "group": GROUP,
                                            "resource": RESOURCE}},
        })  # fmt: skip
        allowed = (answer.get("status") or {}).get("allowed") is True
        self._remember(self._allowed, key, allowed)
        return allowed

    def _remember(self, cache: dict[Any, tuple[float, Any]], key: Any, value: Any) -> None:
        if len(cache) > 10_000:  # bounded: a flood of distinct tokens cannot grow it for ever
            cache.clear()
        cache[key] = (time.monotonic() + self.settings.cache_s, value)

    async def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        if self._session is None:
            context = None
            if self.settings.api_url.startswith("https://"):
                context = ssl.create_default_context(
                    cafile=str(self.settings.ca_file) if self.settings.ca_file is not None else None
                )
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=context if context is not None else False),
                timeout=aiohttp.ClientTimeout(total=self.settings.timeout_s),
            )
        # Read on every call: the kubelet rotates a projected ServiceAccount token.
        own = self.settings.token_file.read_text(encoding="utf-8").strip()
        async with self._session.post(self.settings.api_url + path, json=body,
                                      headers={"Authorization": f"Bearer {own}"}) as response:
            if response.status >= 300:
                # Type and status only: the body may echo the token under review.
                logger.warning("Kubernetes review %s answered %d", path.rsplit("/", 1)[-1], response.status)
                return {}
            answer: dict[str, Any] = await response.json()
            return answer
