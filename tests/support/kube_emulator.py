"""
A Kubernetes API emulator for operator tests: kmock's in-memory emulator, plus the parts of the
API server the operator depends on and plain kmock leaves out.

kmock (pinned to 0.8.* in pyproject.toml, because this subclass overrides its request handling)
stores objects as plain JSON and patches them by merging. A real API server also:

- stamps `metadata.uid`, `resourceVersion` (bumped on every change, not on a no-op patch),
  `creationTimestamp` and `generation` (bumped only when something outside metadata and status
  changes), and fills `metadata.name` from `generateName` (kopf posts events that way);
- answers 409 to creating an existing object, 404 to touching a missing one, and 422 to a
  JSON patch whose `test` operation fails (kopf's finalizer patches test the resourceVersion);
- separates the status subresource: a write to `/status` changes only `.status`, a write to the
  object itself leaves `.status` alone, for kinds that declare the subresource;
- removes an object once it is marked for deletion and its last finalizer is gone;
- filters lists and watches by `?labelSelector=` (equality `k=v`/`k==v`, `k!=v`, existence `k`,
  absence `!k`, joined by commas), as the operator's watch of owned Deployments and Services
  relies on: without it every Deployment of the cluster would reach the operator. As a real API
  server does, a watch gets DELETED when a change makes an object stop matching its selector, and
  ADDED when a change makes one start matching;
- serves server-side apply (PATCH with `application/apply-patch+yaml`, `?fieldManager=` required,
  `?force=true`), simplified: the applied object is merged into the stored one (created when absent,
  201); every field path of the applied object is recorded as owned by the manager in
  `metadata.managedFields` (operation Apply, FieldsV1 `f:` keys); a field the manager applied before
  and no longer applies is removed unless another manager owns it, and a map it owned is removed
  once it is empty (keys someone else added stay). Lists are atomic (a real API server merges lists
  of containers, ports, env... by key): a list is owned and replaced as a whole. Without `force`, a
  field another manager owns with another value is a 409 Conflict; with it, the applier takes the
  field over. Other writes (merge and JSON patches) are not recorded as managers, but a field they
  change is no longer owned by any applier (as the API server moves it to the updater), so the next
  apply does not remove what a scaler or a person set there.
- Resource quantities are stored as the client sent them (`1024Mi` stays `1024Mi`); a real API
  server stores a built-in kind's quantities canonically (`1Gi`), so clients must compare them by
  value, as the operator does (`lading_operator.quantities`).

This subclass adds exactly that, and serves discovery for Lading's CRDs (built from the CRD
YAML when `operator/lading_operator/crds/` has it, else from `lading.models.specs`), kopf's
backbone resources (namespaces, events, customresourcedefinitions), kopf's ClusterKopfPeering
(operator replicas with `--peering` keep their records in its status, no status subresource), and
the built-in kinds the operator writes (Deployments, Services, Secrets, KEDA ScaledObjects and
TriggerAuthentications). It still has no
controllers: nothing creates Pods, no Deployment becomes ready and owner references are not
garbage-collected; tests set such status themselves. It counts every request (`requests`) so
the benchmark can report API traffic.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import copy
import datetime
import itertools
import json
import pathlib
import secrets
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiohttp.web
import attrs
import jsonpatch
import kmock
import orjson
import yaml
from kmock._internal import apps, enums, rendering

from lading.models import specs
from tests.support import crd_schema

CRD_DIR = pathlib.Path(__file__).resolve().parents[2] / "crds"

BACKBONE: dict[str, kmock.ResourceInfo] = {
    "v1/namespaces": kmock.ResourceInfo(kind="Namespace", namespaced=False, verbs={"list", "watch", "get"}),
    "v1/events": kmock.ResourceInfo(kind="Event", namespaced=True, verbs={"create", "list", "get"}),
    "apiextensions.k8s.io/v1/customresourcedefinitions": kmock.ResourceInfo(
        kind="CustomResourceDefinition", namespaced=False, verbs={"list", "watch", "get"}
    ),
    "v1/secrets": kmock.ResourceInfo(
        kind="Secret", namespaced=True, verbs={"get", "list", "create", "patch", "delete"}
    ),
    "v1/services": kmock.ResourceInfo(
        kind="Service", namespaced=True, verbs={"get", "list", "watch", "create", "patch", "delete"}
    ),
    "apps/v1/deployments": kmock.ResourceInfo(
        kind="Deployment",
        namespaced=True,
        verbs={"get", "list", "watch", "create", "patch", "delete"},
        subresources={"status", "scale"},
    ),
    "keda.sh/v1alpha1/triggerauthentications": kmock.ResourceInfo(
        kind="TriggerAuthentication", namespaced=True, verbs={"get", "list", "watch", "create", "patch", "delete"}
    ),
    "kopf.dev/v1/clusterkopfpeerings": kmock.ResourceInfo(
        kind="ClusterKopfPeering", namespaced=False, verbs={"get", "list", "watch", "create", "patch"}
    ),
    "keda.sh/v1alpha1/scaledobjects": kmock.ResourceInfo(
        kind="ScaledObject",
        namespaced=True,
        verbs={"get", "list", "watch", "create", "patch", "delete"},
        subresources={"status"},
    ),
}
"""Kinds besides Lading's own: kopf's backbone (without which it waits silently) and what the operator writes."""


def lading_resources() -> dict[str, kmock.ResourceInfo]:
    """Discovery entries of Lading's kinds: from the CRD YAML when present, else from the spec models."""
    found: dict[str, kmock.ResourceInfo] = {}
    for path in sorted(CRD_DIR.glob("*.yaml")) if CRD_DIR.is_dir() else []:
        for document in yaml.safe_load_all(path.read_text()):
            if not isinstance(document, dict) or document.get("kind") != "CustomResourceDefinition":
                continue
            spec = document["spec"]
            names = spec["names"]
            for version in spec["versions"]:
                key = f"{spec['group']}/{version['name']}/{names['plural']}"
                found[key] = kmock.ResourceInfo(
                    kind=names["kind"],
                    singular=names.get("singular"),
                    namespaced=spec.get("scope", "Namespaced") == "Namespaced",
                    shortnames=set(names.get("shortNames", [])),
                    categories=set(names.get("categories", [])),
                    verbs={"get", "list", "watch", "create", "patch", "delete"},
                    subresources=set(version.get("subresources", {})),
                )
    if found:
        return found
    for kind in specs.LADING_KINDS:
        plural = kind.KIND.lower() + ("es" if kind.KIND.endswith(("ch", "s")) else "s")
        found[f"{specs.GROUP}/{specs.VERSION}/{plural}"] = kmock.ResourceInfo(
            kind=kind.KIND,
            singular=kind.KIND.lower(),
            namespaced=kind.NAMESPACED,
            verbs={"get", "list", "watch", "create", "patch", "delete"},
            subresources={"status"},
        )
    return found


def _now() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _generation_relevant(body: Mapping[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in body.items() if key not in ("metadata", "status")}


@attrs.define(kw_only=True)
class KubeEmulator(kmock.KubernetesEmulator):
    """kmock's emulator with API-server bookkeeping (see the module docstring)."""

    validate: bool = True
    """Check Lading's custom resources against their CRD (schema, defaults, CEL) like the API server."""
    _versions: itertools.count[int] = attrs.field(factory=lambda: itertools.count(1), init=False)
    _crds: dict[str, dict[str, Any]] = attrs.field(factory=dict, init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        for key, info in {**BACKBONE, **lading_resources()}.items():
            self.resources[key] = info
        if self.validate and CRD_DIR.is_dir():
            self._crds = {crd["spec"]["names"]["plural"]: crd for crd in crd_schema.load_crds(CRD_DIR).values()}

    def _admit(self, resource: kmock.resource, new: dict[str, Any], old: dict[str, Any] | None) -> dict[str, Any]:
        """Defaults and validation of a Lading object, as the API server does; 422 with the reasons."""
        crd = self._crds.get(str(resource.plural)) if resource.group == specs.GROUP else None
        if crd is None:
            return new
        defaulted = crd_schema.apply_defaults(crd_schema.openapi_schema(crd), new)
        problems = crd_schema.admission_errors(crd, defaulted, old)
        if problems:
            raise kmock.KubernetesError(status=422, reason="Invalid", message="; ".join(problems)[:2000])
        return dict(defaulted)

    # --- What tests use.

    def count(self) -> int:
        """Requests served so far (every method, every path)."""
        return len(self._requests)

    def breakdown(self, since: int = 0) -> dict[str, int]:
        """Requests served since the `since`-th, by action and resource (e.g. 'update extractionbatches/status')."""
        counts: collections.Counter[str] = collections.Counter()
        for request in list(self._requests)[since:]:
            what = request.resource.plural if request.resource is not None else request.url.path
            if request.subresource:
                what = f"{what}/{request.subresource}"
            action = request.action.value if request.action is not None else str(request.method.value).lower()
            counts[f"{action} {what}"] += 1
        return dict(counts.most_common())

    def stored(self, resource: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        key = (kmock.resource(resource), namespace, name)
        if key not in self.objects or self.objects[key].deleted:
            return None
        return self.objects[key].raw  # stored objects are never changed in place: no copy needed, do not mutate

    def names(self, resource: str, namespace: str | None = None) -> list[str]:
        wanted = kmock.resource(resource)
        return sorted(
            name for (res, ns, name), obj in self.objects.items()
            if res == wanted and (namespace is None or ns == namespace) and not obj.deleted
        )  # fmt: skip

    def _has_status_subresource(self, resource: kmock.resource) -> bool:
        for declared in self.resources:
            if declared == resource:
                return "status" in self.resources[declared].subresources
        return False

    # --- The API server's bookkeeping.

    async def _serve_list(self, request: rendering.Request) -> rendering.Payload:
        result = await super()._serve_list(request)
        wanted = label_selector(request.params.get("labelSelector", ""))
        if wanted is None or not isinstance(result, dict):
            return result
        return {**result, "items": [item for item in result["items"] if _labels_match(wanted, item)]}

    async def _serve_watch(self, request: rendering.Request) -> AsyncIterator[rendering.Payload]:
        wanted = label_selector(request.params.get("labelSelector", ""))
        async for event in super()._serve_watch(request):
            if not isinstance(event, dict):
                yield event
                continue
            kind, obj, old = event.get("type"), event.get("object") or {}, event.get("old")
            if wanted is None:
                yield {"type": kind, "object": obj}
                continue
            now = _labels_match(wanted, obj)
            before = now if kind != "MODIFIED" or not isinstance(old, dict) else _labels_match(wanted, old)
            if kind == "MODIFIED" and before != now:
                kind = "ADDED" if now else "DELETED"  # started or stopped matching the selector
            elif not now:
                continue
            yield {"type": kind, "object": obj}

    async def _handle(self, request: rendering.Request) -> Any:
        if request.resource is None or request.action not in (
            enums.action.CREATE, enums.action.UPDATE, enums.action.DELETE
        ):  # fmt: skip
            return await apps.RawHandler._handle(self, request)
        if request.action == enums.action.CREATE:
            return aiohttp.web.json_response(await self._create(request), status=201)
        if request.action == enums.action.UPDATE and _is_apply(request):
            created = await self._apply_create(request)
            if created is not None:
                return aiohttp.web.json_response(created, status=201)
        if request.action == enums.action.UPDATE:
            gone = await self._update(request)
        else:
            gone = await self._delete(request)
        key = (request.resource, request.namespace, str(request.name))
        async with self._lock:
            raw = self.objects[key].raw
            if gone is not None:
                self.objects[key].delete()
                await self._buses[request.resource].put({"type": "DELETED", "object": raw})
        return aiohttp.web.json_response(raw)

    async def _create(self, request: rendering.Request, data: Any = None) -> dict[str, Any]:
        assert request.resource is not None
        data = request.data if data is None else data
        if not isinstance(data, dict):
            raise kmock.KubernetesError(status=400, reason="BadRequest", message="the body must be a JSON object")
        body = dict(data)
        body["metadata"] = meta = dict(body.get("metadata") or {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + secrets.token_hex(3)
        if not meta.get("name"):
            raise kmock.KubernetesError(status=422, reason="Invalid", message="metadata.name: Required value")
        if request.namespace:
            meta["namespace"] = request.namespace
        meta.update(
            uid=str(uuid.uuid4()),
            resourceVersion=str(next(self._versions)),
            creationTimestamp=_now(),
            generation=1,
        )
        key = (request.resource, meta.get("namespace"), meta["name"])
        body = self._admit(request.resource, body, None)
        async with self._lock:
            if key in self.objects and not self.objects[key].deleted:
                raise kmock.KubernetesError(
                    status=409, reason="AlreadyExists", message=f"{meta['name']} already exists"
                )
            if key in self.objects:
                self.objects[key].create(body)
            else:
                self.objects[key] = body
            await self._buses[request.resource].put({"type": "ADDED", "object": body})
        return body

    async def _update(self, request: rendering.Request) -> Any:
        assert request.resource is not None
        key = (request.resource, request.namespace, str(request.name))
        content_type = request.headers.get("Content-Type", "")
        async with self._lock:
            if key not in self.objects or self.objects[key].deleted:
                raise kmock.KubernetesError(status=404, reason="NotFound", message=f"{request.name} not found")
            old = self.objects[key].raw
            status_only = request.subresource == "status"
            separate = self._has_status_subresource(request.resource)
            if _is_apply(request):
                new = self._applied(request, old, separate=separate)
            elif "json-patch" in content_type:
                if not isinstance(request.data, list):
                    raise kmock.KubernetesError(status=400, reason="BadRequest", message="a JSON patch is a list")
                try:
                    new = jsonpatch.apply_patch(_clone(old), request.data, in_place=True)
                except jsonpatch.JsonPatchTestFailed as exc:
                    raise kmock.KubernetesError(status=422, reason="Invalid", message=str(exc)) from None
                except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
                    raise kmock.KubernetesError(status=422, reason="Invalid", message=str(exc)) from None
            elif "merge-patch" in content_type or "strategic-merge-patch" in content_type:
                if not isinstance(request.data, dict):
                    raise kmock.KubernetesError(status=400, reason="BadRequest", message="a merge patch is an object")
                new = _merge(old, request.data)
            else:
                raise kmock.KubernetesError(
                    status=415, reason="UnsupportedMediaType", message=f"unsupported patch type {content_type!r}"
                )
            if status_only:
                new = (
                    {**old, "status": new.get("status")}
                    if "status" in new
                    else {k: v for k, v in old.items() if k != "status"}
                )
            elif separate:
                new = {
                    **{k: v for k, v in new.items() if k != "status"},
                    **({"status": old["status"]} if "status" in old else {}),
                }
            new = dict(new)
            new["metadata"] = new_meta = dict(new.get("metadata") or {})
            for fixed in ("uid", "creationTimestamp", "name", "namespace"):
                if fixed in old.get("metadata", {}):
                    new_meta[fixed] = old["metadata"][fixed]
            new_meta["resourceVersion"] = old["metadata"]["resourceVersion"]
            new_meta["generation"] = old["metadata"].get("generation", 1)
            if new == old:
                return None  # a no-op patch changes nothing, not even the resourceVersion
            new = self._admit(request.resource, new, old)
            if not _is_apply(request):
                new_meta = _disown_changed(new, old)
                new["metadata"] = new_meta
            if _generation_relevant(new) != _generation_relevant(old):
                new_meta["generation"] = new_meta["generation"] + 1
            new_meta["resourceVersion"] = str(next(self._versions))
            self.objects[key].create(new)
            await self._buses[request.resource].put({"type": "MODIFIED", "object": new, "old": old})
            if new_meta.get("deletionTimestamp") and not new_meta.get("finalizers"):
                return key
            return None

    async def _apply_create(self, request: rendering.Request) -> dict[str, Any] | None:
        """Server-side apply to an absent object creates it (None: it exists, apply to it)."""
        assert request.resource is not None
        key = (request.resource, request.namespace, str(request.name))
        async with self._lock:
            if key in self.objects and not self.objects[key].deleted:
                return None
        applied = _apply_body(request)
        separate = self._has_status_subresource(request.resource)
        body = self._applied(request, {}, separate=separate)
        body.setdefault("metadata", {})["name"] = applied["metadata"]["name"]
        return await self._create(request, data=body)

    def _applied(self, request: rendering.Request, old: dict[str, Any], *, separate: bool) -> dict[str, Any]:
        """The object after `request`'s apply onto `old` ({} when absent), managedFields included."""
        applied = _apply_body(request)
        manager = request.params.get("fieldManager") or ""
        if not manager:
            raise kmock.KubernetesError(status=400, reason="BadRequest",
                                        message="fieldManager is required for apply patch")  # fmt: skip
        if request.name is not None and applied["metadata"].get("name") not in (None, str(request.name)):
            raise kmock.KubernetesError(status=400, reason="BadRequest", message="the name does not match the URL")
        if separate or request.subresource:
            applied.pop("status", None)
        force = request.params.get("force") == "true"
        fields = _field_paths(applied)
        owners = _owners(old)
        others = {m: paths for m, paths in owners.items() if m != manager}
        if not force:
            conflicts = sorted(
                ".".join(path) for m, paths in others.items() for path in paths & fields
                if _leaf(applied, path) and _get(old, path) != _get(applied, path)
            )  # fmt: skip
            if conflicts:
                raise kmock.KubernetesError(status=409, reason="Conflict",
                                            message=f"Apply failed with conflicts: {', '.join(conflicts)}")  # fmt: skip
        kept_by_others = set().union(*others.values()) if others else set()
        gone = owners.get(manager, set()) - fields - kept_by_others
        new = _clone(old)
        for path in sorted(gone, key=len, reverse=True):  # deepest first: a map goes once it is empty
            _remove(new, path)
        new = _merge_applied(new, applied)
        if force:
            others = {m: paths - fields for m, paths in others.items()}
        owners = {**{m: p for m, p in others.items() if p}, manager: fields}
        old_entries = {e.get("manager"): e for e in (old.get("metadata") or {}).get("managedFields") or []}
        new["metadata"] = {**(new.get("metadata") or {}), "managedFields": [
            _managed_entry(m, paths, api_version=str(new.get("apiVersion") or ""), previous=old_entries.get(m))
            for m, paths in sorted(owners.items())
        ]}  # fmt: skip
        return dict(new)

    async def _delete(self, request: rendering.Request) -> Any:
        assert request.resource is not None
        key = (request.resource, request.namespace, str(request.name))
        async with self._lock:
            if key not in self.objects or self.objects[key].deleted:
                raise kmock.KubernetesError(status=404, reason="NotFound", message=f"{request.name} not found")
            current = dict(self.objects[key].raw)
            current["metadata"] = meta = dict(current.get("metadata") or {})
            if meta.get("deletionTimestamp"):
                return None
            if meta.get("finalizers"):
                meta["deletionTimestamp"] = _now()
                meta["resourceVersion"] = str(next(self._versions))
                self.objects[key].create(current)
                await self._buses[request.resource].put({"type": "MODIFIED", "object": current})
                return None
            return key


APPLY_CONTENT_TYPE = "application/apply-patch+yaml"
FieldPath = tuple[str, ...]
_UNOWNED: frozenset[FieldPath] = frozenset({
    ("apiVersion",), ("kind",), ("metadata",), ("metadata", "name"), ("metadata", "namespace"),
    ("metadata", "managedFields"), ("metadata", "resourceVersion"), ("metadata", "uid"),
    ("metadata", "creationTimestamp"), ("metadata", "generation"),
})  # fmt: skip
"""Paths no manager owns: the object's identity and what the API server stamps."""


def _is_apply(request: rendering.Request) -> bool:
    return APPLY_CONTENT_TYPE in request.headers.get("Content-Type", "")


def _apply_body(request: rendering.Request) -> dict[str, Any]:
    data = request.data
    if data is None and request.text:
        try:
            data = yaml.safe_load(request.text)
        except yaml.YAMLError as exc:
            raise kmock.KubernetesError(status=400, reason="BadRequest", message=str(exc)) from None
    if not isinstance(data, dict):
        raise kmock.KubernetesError(status=400, reason="BadRequest", message="an apply patch is an object")
    body = _clone(data)
    body["metadata"] = dict(body.get("metadata") or {})
    return dict(body)


def _field_paths(obj: Mapping[str, Any], prefix: FieldPath = ()) -> set[FieldPath]:
    """Every map key at every depth of `obj` (lists are leaves), less the unowned ones."""
    found: set[FieldPath] = set()
    for key, value in obj.items():
        path = (*prefix, key)
        if path not in _UNOWNED:
            found.add(path)
        if isinstance(value, Mapping):
            found |= _field_paths(value, path)
    return found


def _get(obj: Any, path: FieldPath) -> Any:
    for key in path:
        if not isinstance(obj, Mapping) or key not in obj:
            return None
        obj = obj[key]
    return obj


def _leaf(obj: Any, path: FieldPath) -> bool:
    return not isinstance(_get(obj, path), Mapping)


def _remove(obj: dict[str, Any], path: FieldPath) -> None:
    """Remove `path` from `obj` (in place): a leaf always, a map only once it is empty."""
    parent = _get(obj, path[:-1]) if len(path) > 1 else obj
    if not isinstance(parent, dict) or path[-1] not in parent:
        return
    if isinstance(parent[path[-1]], Mapping) and parent[path[-1]]:
        return
    del parent[path[-1]]


def _merge_applied(target: Any, applied: Any) -> Any:
    """Maps merge key by key; lists and scalars replace."""
    if not isinstance(applied, dict) or not isinstance(target, dict):
        return applied
    result = dict(target)
    for key, value in applied.items():
        result[key] = _merge_applied(result.get(key), value)
    return result


def _owners(obj: Mapping[str, Any]) -> dict[str, set[FieldPath]]:
    """The Apply managers of a stored object and the paths each owns (from its managedFields)."""
    owners: dict[str, set[FieldPath]] = {}
    for entry in (obj.get("metadata") or {}).get("managedFields") or []:
        if entry.get("operation") == "Apply":
            owners[str(entry.get("manager"))] = _paths_of(entry.get("fieldsV1") or {})
    return owners


def _paths_of(tree: Mapping[str, Any], prefix: FieldPath = ()) -> set[FieldPath]:
    found: set[FieldPath] = set()
    for key, sub in tree.items():
        if key.startswith("f:"):
            path = (*prefix, key[2:])
            found.add(path)
            found |= _paths_of(sub or {}, path)
    return found


def _tree_of(paths: set[FieldPath]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for path in sorted(paths):
        node = tree
        for key in path:
            node = node.setdefault(f"f:{key}", {})
    return tree


def _managed_entry(
    manager: str, paths: set[FieldPath], *, api_version: str, previous: Mapping[str, Any] | None
) -> dict[str, Any]:
    tree = _tree_of(paths)
    unchanged = previous is not None and previous.get("fieldsV1") == tree
    return {"manager": manager, "operation": "Apply", "apiVersion": api_version,
            "time": previous.get("time") if unchanged and previous is not None else _now(),
            "fieldsType": "FieldsV1", "fieldsV1": tree}  # fmt: skip


def _disown_changed(new: dict[str, Any], old: Mapping[str, Any]) -> dict[str, Any]:
    """The metadata of `new` after a write that is not an apply: a field it changed or removed is no
    longer owned by any Apply manager (the API server hands it to the updater)."""
    meta = dict(new.get("metadata") or {})
    entries = meta.get("managedFields") or []
    if not entries:
        return meta
    kept = []
    for entry in entries:
        if entry.get("operation") != "Apply":
            kept.append(entry)
            continue
        paths = _paths_of(entry.get("fieldsV1") or {})
        still = {
            path for path in paths
            if _get(new, path) is not None
            and (isinstance(_get(new, path), Mapping) or _get(new, path) == _get(old, path))
        }  # fmt: skip
        if still == paths:
            kept.append(entry)
        elif still:
            kept.append({**entry, "fieldsV1": _tree_of(still), "time": _now()})
    meta["managedFields"] = kept
    return meta


LabelRequirement = tuple[str, str, str | None]
"""(key, operator, value): operator '=' or '!=' with a value, 'exists' or '!exists' without."""


def label_selector(text: str) -> list[LabelRequirement] | None:
    """The requirements of a `labelSelector` query parameter; None for an empty one. Set-based
    requirements (`in`, `notin`) are refused with 400, as this emulator does not evaluate them."""
    if not text.strip():
        return None
    requirements: list[LabelRequirement] = []
    for part in (p.strip() for p in text.split(",")):
        if " in " in part or " notin " in part or "(" in part:
            raise kmock.KubernetesError(status=400, reason="BadRequest", message=f"unsupported selector {part!r}")
        if "!=" in part:
            key, _, value = part.partition("!=")
            requirements.append((key.strip(), "!=", value.strip()))
        elif "=" in part:
            key, _, value = part.replace("==", "=").partition("=")
            requirements.append((key.strip(), "=", value.strip()))
        elif part.startswith("!"):
            requirements.append((part[1:].strip(), "!exists", None))
        else:
            requirements.append((part, "exists", None))
    return requirements


def _labels_match(requirements: list[LabelRequirement], obj: Mapping[str, Any]) -> bool:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    for key, operator, value in requirements:
        if operator == "=" and labels.get(key) != value:
            return False
        if operator == "!=" and labels.get(key) == value:
            return False
        if operator == "exists" and key not in labels:
            return False
        if operator == "!exists" and key in labels:
            return False
    return True


def _clone(value: Any) -> Any:
    """A deep copy of JSON data (several times faster than copy.deepcopy for large objects); what
    orjson cannot encode (a lone surrogate a client sent escaped) is copied by copy.deepcopy."""
    try:
        return orjson.loads(orjson.dumps(value))
    except (TypeError, orjson.JSONEncodeError):
        return copy.deepcopy(value)


def _merge(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: objects merge recursively, null removes, anything else replaces.

    Copy-on-write: parts of `target` the patch does not touch are shared, not copied. Stored objects
    are never changed in place, so sharing is safe and a status patch of a large batch stays cheap."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = _merge(result.get(key), value)
    return result


@contextlib.asynccontextmanager
async def serving(*, validate: bool = True) -> AsyncIterator[KubeEmulator]:
    """The emulator on a loopback port for the block; `emulator.servers[0].url` is its base URL."""
    async with KubeEmulator(validate=validate) as emulator, kmock.Server(emulator):
        yield emulator


def write_kubeconfig(path: pathlib.Path, *, server: str, namespace: str = "default") -> pathlib.Path:
    """A kubeconfig for `server` (plain HTTP on loopback, no credentials), as `kubectl` would read it."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "emulator",
        "clusters": [{"name": "emulator", "cluster": {"server": server}}],
        "users": [{"name": "emulator", "user": {}}],
        "contexts": [
            {"name": "emulator", "context": {"cluster": "emulator", "user": "emulator", "namespace": namespace}}
        ],
    }
    path.write_text(json.dumps(config))
    return path


async def wait_for(
    emulator: KubeEmulator,
    resource: str,
    namespace: str | None,
    name: str,
    predicate: Any,
    *,
    timeout_s: float = 20.0,
) -> dict[str, Any]:
    """Wait until the object exists and `predicate(obj)` is true; returns it."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    last: dict[str, Any] | None = None
    while True:
        last = emulator.stored(resource, namespace, name)
        if last is not None and predicate(last):
            return last
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError(
                f"{resource} {namespace}/{name} not as expected within {timeout_s} s; last: {last!r}"[:4000]
            )
        await asyncio.sleep(0.05)
