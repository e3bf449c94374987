"""
Whether an owned object must be applied again: `pool_steps.owned` applies the whole rendering
(`rendering`) with server-side apply (kube.py), and this module says when that is needed without an
API call.

- `applied_hash`: the sha256 of the rendered object, stamped on it as the annotation
  `lading.dev/applied-sha256`. A live object carrying the hash of the current rendering was last
  applied from it; one without it, or with another, gets the new rendering. Server-side apply then
  removes what the previous rendering set and this one does not (a removed `nodeSelector`, a
  toleration, an env var): the field manager `lading-operator` owned them, and no one else does.
- `differs`: the live object no longer has what we render (an edit by hand or by another tool):
  applied again, and the pool posts DriftCorrected when the apply changed the object.
  - A mapping in the rendering is compared key by key: keys we do not render (server defaults such
    as `clusterIP`, `status`, `resourceVersion`, labels others add) are not drift.
  - A list is compared item by item, each item as "rendered keys only" too, so server-defaulted
    fields inside a container or a port (terminationMessagePath, protocol ...) are not drift.
  - Resource quantities (`requests`, `limits`, `sizeLimit`) compare by value (`quantities`): an API
    server stores `1024Mi` of a Deployment as `1Gi`, the same amount, which is not drift.
  - Fields others added that we never render (a `nodeSelector` key set with kubectl) are theirs:
    server-side apply leaves fields it does not own, so this does not call them drift either.
- `spec.replicas` of a Deployment is the scaler's (or KEDA's): never part of the rendering compared here.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from lading_operator import quantities

Path = tuple[str, ...]

APPLIED_HASH_ANNOTATION = "lading.dev/applied-sha256"
QUANTITY_PARENTS = frozenset({"requests", "limits"})
QUANTITY_KEYS = frozenset({"sizeLimit"})


def applied_hash(rendered: Mapping[str, Any]) -> str:
    """sha256 of the rendering (canonical JSON, without the hash annotation itself)."""
    meta = dict(rendered.get("metadata") or {})
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if k != APPLIED_HASH_ANNOTATION}
    body = {**rendered, "metadata": {**meta, "annotations": annotations}}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def stamped(rendered: Mapping[str, Any]) -> dict[str, Any]:
    """The rendering with its `applied_hash` annotation: what is applied."""
    meta = dict(rendered.get("metadata") or {})
    annotations = {**(meta.get("annotations") or {}), APPLIED_HASH_ANNOTATION: applied_hash(rendered)}
    return {**rendered, "metadata": {**meta, "annotations": annotations}}


def up_to_date(rendered: Mapping[str, Any], live: Mapping[str, Any]) -> bool:
    """The live object was applied from this rendering and nobody changed what we render since."""
    annotations = (live.get("metadata") or {}).get("annotations") or {}
    return annotations.get(APPLIED_HASH_ANNOTATION) == applied_hash(rendered) and not differs(rendered, live)


def differs(desired: Mapping[str, Any], live: Mapping[str, Any]) -> bool:
    """Whether `live` lacks or changed a field of `desired` (rendered keys only; `replicas` ignored)."""
    want = dict(desired)
    spec = want.get("spec")
    if isinstance(spec, Mapping) and "replicas" in spec:
        want["spec"] = {k: v for k, v in spec.items() if k != "replicas"}
    return not _covers(want, live, ())


def _covers(desired: Any, live: Any, path: Path) -> bool:
    """Whether `live` has everything `desired` says (extra live keys allowed, recursively)."""
    if isinstance(desired, Mapping):
        return isinstance(live, Mapping) and all(
            key in live and _covers(value, live[key], (*path, key)) for key, value in desired.items()
        )
    if isinstance(desired, list):
        return (
            isinstance(live, list)
            and len(desired) == len(live)
            and all(_covers(d, w, (*path, "[]")) for d, w in zip(desired, live, strict=True))
        )
    if _is_quantity(path) and quantities.same(desired, live):
        return True
    return _same_scalar(desired, live)


def _is_quantity(path: Path) -> bool:
    return bool(path) and (path[-1] in QUANTITY_KEYS or (len(path) >= 2 and path[-2] in QUANTITY_PARENTS))


def _same_scalar(desired: Any, live: Any) -> bool:
    if desired == live and type(desired) is type(live):
        return True
    # The API server normalises some values: bool/int are distinct, but a port or size given as
    # a string of digits and read back as an int is not drift.
    if isinstance(desired, bool) or isinstance(live, bool):
        return False
    if isinstance(desired, int | float) and isinstance(live, int | float):
        return bool(desired == live)
    return False
