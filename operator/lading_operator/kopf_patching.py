"""
Two of kopf's costs on large objects, made cheaper without changing what kopf does.

1. Its finalizer patch. kopf adds and removes its finalizer with a JSON patch guarded by the object's resourceVersion
(`kopf._cogs.clients.patching.patch_obj`). To build it, `Patch.as_json_patch` deep-copies the whole
object, applies the patch to the copy and diffs the two copies whole with `jsonpatch`, which
serialises every list item on both sides. For an ExtractionBatch with 1,000 inline documents (80 KB)
that was about a sixth of the operator's CPU while admitting batches, all of it spent to find
one added string in `metadata.finalizers`; kopf pays the copy even on patches with no functions.

`as_json_patch` computes the same operations: it copies the object with orjson (JSON in, JSON
out: several times faster than `copy.deepcopy`; anything orjson cannot encode falls back to
`copy.deepcopy`), returns early when there is nothing to do, and hands `jsonpatch` only the
top-level fields that differ (compared with `!=`, which runs in C). A field equal on both sides
yields no operation in a whole diff either, and a move is found only between fields that changed,
so the operations are those of the whole diff (jsonpatch orders the fields of a dict as a set does,
so operations on different top-level fields may come in another order; they touch different
fields, so the patched object is the same). tests/unit/operator/test_kopf_patching.py compares the
two on kopf's own finalizer functions and on merge patches.

2. Its watch streams. kopf decodes every watch event with the standard library's `json.loads`:
about 2.6 ms for an 80 KB ExtractionBatch, and a batch brings three events while it is admitted
(created, finalizer added, status written). `StreamJson.loads` decodes with orjson (about 10 times
faster), and with `json.loads` what orjson refuses (NaN, 1e400). The one difference: orjson decodes
an integer over 64 bits as a float, but the API server never sends one (it decodes JSON numbers into
int64 or float64 and encodes them back), so every event it sends decodes to the same objects.

`install()` puts both in place once per process: the method on kopf's `Patch` class and `StreamJson`
as the `json` its API module streams with. It leaves kopf's own code in place, and says so, where
kopf no longer has what they rely on (`_original`, `_apply_patch`, `fns`; a module-level `json` in
`kopf._cogs.clients.api`): correct and slower.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
from typing import Any, cast

import jsonpatch
import orjson
from kopf._cogs.clients import api as kopf_api
from kopf._cogs.structs import bodies, patches

logger = logging.getLogger("lading.operator")

_MISSING = object()
KOPF_AS_JSON_PATCH = patches.Patch.as_json_patch
"""kopf's own method, as it was when this module was imported (before `install`)."""
_REQUIRED = ("_original", "_apply_patch", "fns")


def _copy(body: dict[str, Any]) -> dict[str, Any]:
    try:
        return cast(dict[str, Any], orjson.loads(orjson.dumps(body)))
    except (TypeError, orjson.JSONEncodeError):  # not plain JSON (e.g. an integer over 64 bits)
        return copy.deepcopy(body)


def as_json_patch(
        self: patches.Patch, body: bodies.Body | bodies.RawBody | None = None
) -> patches.JSONPatch:
    """kopf's `Patch.as_json_patch`, computed from the top-level fields that change only."""
    if not self:
        return []
    base = body if body is not None else self._original
    if base is None:
        raise ValueError("Cannot build a JSON-patch without the original body as a reference.")
    body_as_is = dict(base)
    body_to_be = _copy(body_as_is)
    self._apply_patch(cast(bodies.RawBody, body_to_be), (), dict(self))
    for fn in self.fns:
        fn(cast(bodies.RawBody, body_to_be))
    keys = list(body_as_is) + [key for key in body_to_be if key not in body_as_is]
    changed = [key for key in keys if body_as_is.get(key, _MISSING) != body_to_be.get(key, _MISSING)]
    if not changed:
        return []
    before = {key: body_as_is[key] for key in changed if key in body_as_is}
    after = {key: body_to_be[key] for key in changed if key in body_to_be}
    return cast(patches.JSONPatch, jsonpatch.JsonPatch.from_diff(before, after).patch)


class StreamJson:
    """What kopf's API module calls `json`: only `loads` is used there (on each watch event)."""

    JSONDecodeError = json.JSONDecodeError

    @staticmethod
    def loads(text: str) -> Any:
        with contextlib.suppress(orjson.JSONDecodeError):  # e.g. NaN or 1e400: json.loads takes them
            return orjson.loads(text)
        return json.loads(text)


def install() -> bool:
    """Put `as_json_patch` and `StreamJson` in place in kopf; True when both are (now or before)."""
    installed = True
    if patches.Patch.as_json_patch is not as_json_patch:
        probe = patches.Patch({}, body=None)
        if all(hasattr(probe, name) for name in _REQUIRED):
            patches.Patch.as_json_patch = as_json_patch  # type: ignore[method-assign]
        else:
            logger.warning("kopf's Patch changed (no %s): kopf's own as_json_patch stays", ", ".join(_REQUIRED))
            installed = False
    if getattr(kopf_api, "json", None) is json:
        setattr(kopf_api, "json", StreamJson)  # noqa: B010 (mypy: a class in place of a module)
    elif getattr(kopf_api, "json", None) is not StreamJson:
        logger.warning("kopf's API module changed (no module-level json): its watch streams decode with its own")
        installed = False
    return installed
