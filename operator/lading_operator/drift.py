"""
Drift of an owned object: the JSON merge patch (RFC 7386) that brings the live object back to its
rendering (`rendering`), or None when it is in shape. `pool_steps.owned` sends it.

What counts as ours:

- A mapping in the rendering is compared key by key: keys we do not render (server defaults such as
  `clusterIP`, `status`, `resourceVersion`, labels others add) are left alone.
- A list is ours as a whole (containers, env, args, ports, volumes, tolerations): a different live list
  is replaced. Items are compared as "rendered keys only" too, so server-defaulted fields inside a
  container or a port (terminationMessagePath, protocol ...) are not drift.
- Pod scheduling fields we render only when the pool asks for them (`OPTIONAL_POD_FIELDS`, e.g.
  `nodeSelector`) are ours even when absent: a live one the rendering no longer has is removed (null),
  so removing `nodeSelector` from a pool's spec removes it from the Deployment. A `nodeSelector` is
  ours as a whole: a key the rendering dropped goes too.
- Resource quantities (`requests`, `limits`, `sizeLimit`) compare by value (`quantities`): the API
  server stores `1024Mi` as `1Gi`, which is the same amount, not drift.
- `spec.replicas` of a Deployment is the scaler's: compared only with `replicas_owned`.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from lading_operator import quantities

Path = tuple[str, ...]

POD_SPEC: Path = ("spec", "template", "spec")
OPTIONAL_POD_FIELDS = (
    "nodeSelector", "tolerations", "affinity", "runtimeClassName", "priorityClassName", "imagePullSecrets",
)  # fmt: skip
"""Pod spec fields the rendering sets only when configured: removed from the live object when it stops."""
WHOLE_MAPPINGS = frozenset({(*POD_SPEC, "nodeSelector")})
"""Mappings that are ours key by key and as a whole: live keys we do not render are removed."""
QUANTITY_PARENTS = frozenset({"requests", "limits"})
QUANTITY_KEYS = frozenset({"sizeLimit"})


def patch(
        desired: Mapping[str, Any],
        live: Mapping[str, Any],
        *,
        replicas_owned: bool = False,
) -> dict[str, Any] | None:
    """The merge patch that makes `live` match `desired` in the fields we own; None if in shape."""
    want = copy.deepcopy(dict(desired))
    if not replicas_owned:
        spec = want.get("spec")
        if isinstance(spec, dict):
            spec.pop("replicas", None)
    return _diff(want, live, ()) or None


def _diff(desired: Mapping[str, Any], live: Any, path: Path) -> dict[str, Any]:
    if not isinstance(live, Mapping):
        return dict(desired)
    result: dict[str, Any] = {}
    for key, want in desired.items():
        have = live.get(key)
        here = (*path, key)
        if isinstance(want, Mapping) and want:
            sub = _diff(want, have, here) if isinstance(have, Mapping) else dict(want)
            if here in WHOLE_MAPPINGS and isinstance(have, Mapping):
                sub.update({extra: None for extra in have if extra not in want})
            if sub:
                result[key] = sub
        elif not _covers(want, have, here) or (key not in live and want is not None):
            result[key] = want
    if path == POD_SPEC:
        result.update({key: None for key in OPTIONAL_POD_FIELDS if key not in desired and live.get(key) is not None})
    return result


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
