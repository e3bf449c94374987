"""
Signing secrets of DeliveryEndpoints, copied into the namespaces where the workers run.

A pod can mount only Secrets of its own namespace, but DeliveryEndpoints live in the tenants'
namespaces (`acme`) and pools in platform namespaces (`lading-system`). A pool's workers deliver the
webhooks of every batch that runs on it, and batches of any tenant may use any pool, so the workers
need the signing secret of every endpoint. So for every DeliveryEndpoint whose signing Secret exists
and has its key, the operator keeps one copy, a *mirror*, in every *allowed pool namespace*
(`OperatorSettings.pool_namespaces`) that has an InferencePool served by this operator (other than
the endpoint's own: there the worker Deployment projects the endpoint's Secret itself):

    Secret lading-system/lading-endpoint-acme.erp      type Opaque
      labels       app.kubernetes.io/managed-by: lading, lading.dev/endpoint: acme.erp
      annotations  lading.dev/endpoint: acme/erp, lading.dev/secret-sha256: <sha256 of the value>
      data         secret: <the source key's value, base64 as in the source's data>

The worker Deployment projects the mirror's key `secret` as the file `acme.erp`. The name is
`lading-endpoint-<namespace>.<name>`: a namespace has no dot, so two endpoints never share one,
and a name past 253 characters is shortened with a hash of the endpoint.

When it is written:
- the endpoint's reconcile (create, spec change, and its timer every `quota_interval_s`) reads the
  source Secret and brings every mirror to it with server-side apply (field manager
  `lading-operator`, kube.py): created when missing, applied again when its value (or the digest
  annotation) differs, so a rotation (a second line, then the old one removed)
  reaches the workers within one interval, and the kubelet then updates the projected file (the
  dispatcher re-reads it by modification time). Unchanged mirrors cost one GET each per interval;
- a pool's reconcile creates the mirrors its namespace still lacks before rendering its workers,
  and projects only mirrors that exist (a projected Secret that is missing keeps a pod from starting);
- when the source Secret disappears or loses its key, and when the endpoint is deleted, its mirrors
  are deleted; so is a mirror in a namespace whose last pool is gone (at the endpoint's next check).
  Cross-namespace ownerReferences do not exist, so mirrors are found by name and labels; a pool's
  loop also deletes, once when it starts, the mirrors in its namespace whose
  DeliveryEndpoint no longer exists (an endpoint deleted while the operator was down).

Where mirrors never go: a namespace that is not an allowed pool namespace. Pool namespaces are the
platform team's; every other namespace may belong to a tenant, and a tenant holding another tenant's
signing secret could forge its webhooks. A pool in such a namespace is refused (pools.py) and gets no
mirror; mirrors found there (written before the namespace stopped being allowed) are deleted: by the
refused pool's loop in its namespace, and, once when the operator starts, in every namespace it can
list (`sweep_outside_pool_namespaces`). A tenant's namespace thus holds only its own Secrets.

A Secret of that name that is not a mirror (no `managed-by: lading` label, or another endpoint's
annotation) is never overwritten or deleted; the endpoint is then not projected there, and a warning
says why. Values are held in memory only for the copy: never logged, never in status, events,
exceptions (errors of calls on Secrets carry the method and the Secret's name, not the API's answer)
or a repr.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
import logging
from typing import Any

from lading.models import specs
from lading_operator import kube, rendering, runtime

logger = logging.getLogger("lading.operator.mirroring")

POOL_KIND = "InferencePool"
NAME_PREFIX = "lading-endpoint-"
SECRET_NAME_MAX = 253
"""A Secret's name is a DNS-1123 subdomain."""
KEY = "secret"
"""The one data key of a mirror."""
LABEL_ENDPOINT = "lading.dev/endpoint"
"""`<namespace>.<name>` as a label value (shortened with a hash past 63 characters)."""
ANNOTATION_ENDPOINT = "lading.dev/endpoint"
"""The endpoint as 'namespace/name', in full."""
ANNOTATION_DIGEST = "lading.dev/secret-sha256"
"""sha256 of the mirrored value (never the value): what the mirror holds, at a glance."""


@dataclasses.dataclass(frozen=True)
class Source:
    """An endpoint's signing secret as read from its Secret; the value never shows in a repr."""

    endpoint: str
    """The DeliveryEndpoint as 'namespace/name'."""
    data: str = dataclasses.field(repr=False)
    """The value, base64 as in a Secret's `data`."""
    digest: str
    """sha256 (hex) of the decoded value."""


def mirror_name(endpoint: str) -> str:
    """`lading-endpoint-<namespace>.<name>`, a DNS-1123 subdomain of at most 253 characters."""
    namespace, _, name = endpoint.partition("/")
    text = f"{NAME_PREFIX}{namespace}.{name}"
    if len(text) <= SECRET_NAME_MAX:
        return text
    suffix = hashlib.sha256(endpoint.encode("utf-8")).hexdigest()[:16]
    return f"{text[: SECRET_NAME_MAX - len(suffix) - 1].rstrip('-.')}-{suffix}"


def _path(namespace: str, name: str | None = None) -> str:
    return kube.path("v1", "secrets", namespace=namespace, name=name)


def allowed(rt: runtime.Runtime, namespace: str) -> bool:
    """Whether `namespace` is a platform namespace where pools (and so mirrors) may live."""
    return namespace in rt.settings.pool_namespaces


def pool_namespaces(rt: runtime.Runtime) -> set[str]:
    """Allowed pool namespaces with an InferencePool whose loop runs in this operator: where mirrors go.

    A refused pool (in any other namespace) has a loop too, to report why; its namespace is not one."""
    return {namespace for kind, namespace, _ in list(rt.wakeups) if kind == POOL_KIND and allowed(rt, namespace)}


async def read_source(rt: runtime.Runtime, endpoint: str, ref: specs.SecretKeyRef) -> Source | str:
    """The endpoint's signing secret, or why its Secret cannot be used (naming Secret and key, never a value)."""
    namespace = endpoint.partition("/")[0]
    secret = await rt.api.get(_path(namespace, ref.name))
    if secret is None:
        return f"Secret {namespace}/{ref.name} does not exist"
    data = secret.get("data") or {}
    plain = secret.get("stringData") or {}  # an API server folds it into data; kept for clients that do not
    if ref.key in data:
        encoded = str(data[ref.key])
    elif ref.key in plain:
        encoded = base64.b64encode(str(plain[ref.key]).encode("utf-8")).decode("ascii")
    else:
        return f"Secret {namespace}/{ref.name} has no key {ref.key!r}"
    try:
        raw = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        return f"Secret {namespace}/{ref.name} key {ref.key!r} is not base64"
    return Source(endpoint=endpoint, data=encoded, digest=hashlib.sha256(raw).hexdigest())


def mirror_body(source: Source, namespace: str) -> dict[str, Any]:
    endpoint_namespace, _, name = source.endpoint.partition("/")
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            "name": mirror_name(source.endpoint),
            "namespace": namespace,
            "labels": {
                rendering.LABEL_MANAGED_BY: "lading",
                LABEL_ENDPOINT: rendering.label_value(f"{endpoint_namespace}.{name}"),
            },
            "annotations": {ANNOTATION_ENDPOINT: source.endpoint, ANNOTATION_DIGEST: source.digest},
        },
        "data": {KEY: source.data},
    }


def _ours(live: dict[str, Any], endpoint: str) -> bool:
    meta = live.get("metadata") or {}
    return (meta.get("labels") or {}).get(rendering.LABEL_MANAGED_BY) == "lading" and (
        meta.get("annotations") or {}
    ).get(ANNOTATION_ENDPOINT) == endpoint


async def _call(what: str, namespace: str, name: str, call: Any) -> Any:
    """Await an API call on a Secret; an error names the call and the Secret, never the API's answer."""
    try:
        return await call
    except kube.KubeError as exc:
        raise kube.KubeError(status=exc.status, message=f"{what} Secret {namespace}/{name}") from None


async def ensure(rt: runtime.Runtime, source: Source, namespace: str) -> bool:
    """Bring the mirror of `source` in `namespace` to it (server-side apply, created when missing);
    False when a foreign Secret holds the name."""
    body = mirror_body(source, namespace)
    name = body["metadata"]["name"]
    live = await _call("GET", namespace, name, rt.api.get(_path(namespace, name)))
    if live is None:  # a plain create first: it fails for a Secret someone made since (an apply would take it)
        try:
            await rt.api.create(_path(namespace), body)
        except kube.KubeError as exc:
            if exc.status != 409:
                raise kube.KubeError(status=exc.status, message=f"POST Secret {namespace}/{name}") from None
            live = await _call("GET", namespace, name, rt.api.get(_path(namespace, name)))
        # Created: applied below all the same, so that its fields are the apply's from the start.
    if live is not None and not _ours(live, source.endpoint):
        logger.warning("Secret %s/%s exists and is not the mirror of DeliveryEndpoint %s: left alone, "
                       "the endpoint is not projected there", namespace, name, source.endpoint)  # fmt: skip
        rt.mirrored.pop((namespace, source.endpoint), None)
        return False
    meta = (live or {}).get("metadata") or {}
    current = live is not None and (
        (live.get("data") or {}).get(KEY) == source.data
        and (meta.get("annotations") or {}).get(ANNOTATION_DIGEST) == source.digest
        and (meta.get("labels") or {}).get(LABEL_ENDPOINT) == body["metadata"]["labels"][LABEL_ENDPOINT]
        and live.get("type") == body["type"]
    )
    if not current:
        await _call("APPLY", namespace, name, rt.api.apply(_path(namespace, name), body))
        logger.info("%s the mirror %s/%s of DeliveryEndpoint %s's signing secret",
                    "mirrored the signing secret into" if live is None else "updated", namespace, name,
                    source.endpoint)  # fmt: skip
    rt.mirrored[(namespace, source.endpoint)] = source.digest
    return True


async def remove(rt: runtime.Runtime, endpoint: str, namespace: str) -> bool:
    """Delete the endpoint's mirror in `namespace` if it is one; True when one was deleted."""
    name = mirror_name(endpoint)
    rt.mirrored.pop((namespace, endpoint), None)
    live = await _call("GET", namespace, name, rt.api.get(_path(namespace, name)))
    if live is None or not _ours(live, endpoint):
        return False
    deleted = bool(await _call("DELETE", namespace, name, rt.api.delete(_path(namespace, name))))
    if deleted:
        logger.info("deleted the mirror %s/%s of DeliveryEndpoint %s's signing secret", namespace, name, endpoint)
    return deleted


async def sync_endpoint(rt: runtime.Runtime, endpoint: str, source: Source | None) -> bool:
    """Mirror `source` into every pool namespace, or (None) delete the endpoint's mirrors.

    Returns whether the namespaces holding a mirror of it changed (pools there must re-render)."""
    own = endpoint.partition("/")[0]
    before = {namespace for namespace, e in rt.mirrored if e == endpoint}
    targets = pool_namespaces(rt) - {own}
    if source is None:
        for namespace in sorted(targets | before):
            await remove(rt, endpoint, namespace)
    else:
        for namespace in sorted(targets):
            await ensure(rt, source, namespace)
        for namespace in sorted(before - targets):  # its last pool is gone: no copy stays behind
            await remove(rt, endpoint, namespace)
    return {namespace for namespace, e in rt.mirrored if e == endpoint} != before


async def forget_endpoint(rt: runtime.Runtime, endpoint: str) -> None:
    """The endpoint was deleted: delete its mirrors; pools re-render without it."""
    await sync_endpoint(rt, endpoint, None)
    rt.wake_kind(POOL_KIND)


async def for_namespace(rt: runtime.Runtime, namespace: str) -> tuple[rendering.EndpointSecret, ...]:
    """What a pool in `namespace` projects: every endpoint with a usable signing secret, its own
    namespace's by the endpoint's Secret, the others by their mirror (created here when missing).

    At most `rendering.ENDPOINT_SECRETS_MAX`, in name order; past it, the rest wait (with a warning).
    Nothing in a namespace that is not an allowed pool namespace."""
    projected: list[rendering.EndpointSecret] = []
    if not allowed(rt, namespace):
        return ()
    for full, direct in sorted(rt.endpoint_secrets.items()):
        if len(projected) == rendering.ENDPOINT_SECRETS_MAX:
            logger.warning("pools in %s: more than %d DeliveryEndpoints have signing secrets; endpoints from %s "
                           "on are not projected", namespace, rendering.ENDPOINT_SECRETS_MAX, full)  # fmt: skip
            break
        if full.partition("/")[0] == namespace:
            projected.append(direct)
            continue
        if (namespace, full) not in rt.mirrored:
            source = await read_source(rt, full, specs.SecretKeyRef(name=direct.secret_name, key=direct.key))
            if isinstance(source, str) or not await ensure(rt, source, namespace):
                continue  # the endpoint's own reconcile reports the problem
        projected.append(rendering.EndpointSecret(endpoint=full, secret_name=mirror_name(full), key=KEY))
    return tuple(projected)


def _mirrors(listed: dict[str, Any] | None) -> list[tuple[str, str]]:
    """(namespace, endpoint) of each mirror in a list of Secrets (Secrets that are not ours are skipped)."""
    found = []
    for item in (listed or {}).get("items") or []:
        meta = item.get("metadata") or {}
        endpoint = str((meta.get("annotations") or {}).get(ANNOTATION_ENDPOINT) or "")
        if str(meta.get("name", "")).startswith(NAME_PREFIX) and "/" in endpoint and _ours(item, endpoint):
            found.append((str(meta.get("namespace") or ""), endpoint))
    return found


_SELECTOR = f"?labelSelector={rendering.LABEL_MANAGED_BY}%3Dlading"


async def sweep(rt: runtime.Runtime, namespace: str) -> int:
    """Delete the mirrors in `namespace` that must not be there; how many were deleted.

    In an allowed pool namespace: those whose DeliveryEndpoint no longer exists (one list of the
    namespace's Lading-managed Secrets, then one GET per mirror of an endpoint this operator does not
    know of yet). Anywhere else: every mirror (no signing secret belongs in a tenant's namespace)."""
    listed = await _call("LIST", namespace, "*", rt.api.get(f"{_path(namespace)}{_SELECTOR}"))
    deleted = 0
    for _, endpoint in _mirrors(listed):
        if not allowed(rt, namespace):
            deleted += await remove(rt, endpoint, namespace)
            continue
        if endpoint in rt.endpoint_secrets:
            continue
        endpoint_namespace, _, name = endpoint.partition("/")
        path = kube.path(specs.API_VERSION, "deliveryendpoints", namespace=endpoint_namespace, name=name)
        try:
            if await rt.api.get(path) is None:
                deleted += await remove(rt, endpoint, namespace)
        except kube.KubeError as exc:  # e.g. a namespace this operator may not read: left alone
            logger.warning("mirror of DeliveryEndpoint %s in %s: not swept: %s", endpoint, namespace, exc)
    return deleted


async def sweep_outside_pool_namespaces(rt: runtime.Runtime) -> int:
    """Delete every mirror outside the allowed pool namespaces, in every namespace this operator
    serves (one cluster-wide list, or one list per served namespace); how many were deleted.

    Run once when the operator starts: mirrors written into a namespace before it stopped being a pool
    namespace (or by an operator that mirrored into every pool namespace) go, even where no pool is left."""
    if rt.settings.namespaces:
        served = rt.settings.namespaces
        collections = {namespace: _path(namespace) for namespace in served if not allowed(rt, namespace)}
    else:
        collections = {"*": kube.path("v1", "secrets", namespace=None)}
    deleted = 0
    for where, collection in collections.items():
        listed = await _call("LIST", where, "*", rt.api.get(f"{collection}{_SELECTOR}"))
        for namespace, endpoint in _mirrors(listed):
            if namespace and not allowed(rt, namespace):
                deleted += await remove(rt, endpoint, namespace)
    if deleted:
        logger.info("deleted %d signing-secret mirrors outside the pool namespaces %s", deleted,
                    ", ".join(rt.settings.pool_namespaces))  # fmt: skip
    return deleted
