"""kopf_patching.as_json_patch gives the operations kopf's own Patch.as_json_patch gives; StreamJson.loads
decodes what json.loads decodes."""

from __future__ import annotations

import copy
import functools
import json
from typing import Any

import jsonpatch
import pytest
from kopf._cogs.clients import api as kopf_api
from kopf._cogs.structs import bodies, finalizers, patches
from lading_operator import kopf_patching

FINALIZER = "lading.dev/finalizer"
KOPF_AS_JSON_PATCH = kopf_patching.KOPF_AS_JSON_PATCH


def test_kopf_own_method_kept_for_comparison() -> None:
    assert KOPF_AS_JSON_PATCH is not kopf_patching.as_json_patch
    assert kopf_patching.install()
    assert patches.Patch.as_json_patch is kopf_patching.as_json_patch
    assert kopf_api.json is kopf_patching.StreamJson
    assert kopf_patching.install()  # once


def _batch(*, finalizers: list[str] | None = None, documents: int = 50) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": "b", "namespace": "acme", "resourceVersion": "7", "generation": 1}
    if finalizers is not None:
        metadata["finalizers"] = finalizers
    return {
        "apiVersion": "lading.dev/v1alpha1",
        "kind": "ExtractionBatch",
        "metadata": metadata,
        "spec": {
            "schema": "invoice.v1",
            "documents": [{"key": f"k{i}", "text": f"text {i}"} for i in range(documents)],
        },
        "status": {"phase": "Pending", "conditions": [{"type": "Ready", "status": "False"}]},
    }


def _patch(body: dict[str, Any], merge: dict[str, Any] | None = None, *fns: patches.PatchFn) -> patches.Patch:
    return patches.Patch(merge or {}, body=bodies.Body(body), fns=fns)


BLOCK = functools.partial(finalizers.block_deletion, finalizer=FINALIZER)
ALLOW = functools.partial(finalizers.allow_deletion, finalizer=FINALIZER)

CASES = [
    pytest.param(_batch(), None, (BLOCK,), id="finalizer added, none before"),
    pytest.param(_batch(finalizers=["other"]), None, (BLOCK,), id="finalizer added after another"),
    pytest.param(_batch(finalizers=[FINALIZER]), None, (BLOCK,), id="finalizer already there"),
    pytest.param(_batch(finalizers=[FINALIZER]), None, (ALLOW,), id="the only finalizer removed"),
    pytest.param(_batch(finalizers=["other", FINALIZER]), None, (ALLOW,), id="one of two finalizers removed"),
    pytest.param(_batch(), None, (), id="nothing to do"),
    pytest.param(_batch(), {"metadata": {"annotations": {"a": "1"}}}, (BLOCK,), id="merge patch and a function"),
    pytest.param(
        _batch(), {"status": {"phase": "Running", "conditions": None}}, (), id="status fields set and removed"
    ),
    pytest.param(_batch(), {"spec": {"suspend": True}, "status": None}, (), id="spec field added, status removed"),
    pytest.param(_batch(), {"spec": {"documents": [{"key": "k0", "text": "new"}]}}, (), id="a list replaced"),
]


@pytest.mark.parametrize(("body", "merge", "fns"), CASES)
def test_the_same_operations_as_kopf(body: dict[str, Any], merge: dict[str, Any] | None, fns: tuple[Any, ...]) -> None:
    original = copy.deepcopy(body)
    expected = KOPF_AS_JSON_PATCH(_patch(body, merge, *fns))
    got = kopf_patching.as_json_patch(_patch(body, merge, *fns))
    assert sorted(map(repr, got)) == sorted(map(repr, expected))
    assert jsonpatch.apply_patch(body, got) == jsonpatch.apply_patch(body, expected)
    assert body == original  # the reference body is never changed


def test_against_a_fresher_body() -> None:
    old, fresh = _batch(), _batch(finalizers=["other"])
    fresh["metadata"]["resourceVersion"] = "8"
    patch = _patch(old, None, BLOCK)
    assert kopf_patching.as_json_patch(patch, bodies.Body(fresh)) == KOPF_AS_JSON_PATCH(patch, bodies.Body(fresh))
    assert kopf_patching.as_json_patch(patch, bodies.Body(fresh)) == [
        {"op": "add", "path": "/metadata/finalizers/1", "value": FINALIZER}
    ]


def test_not_plain_json_is_still_copied() -> None:
    body = _batch()
    body["spec"]["big"] = 2**70  # orjson refuses integers over 64 bits
    assert kopf_patching.as_json_patch(_patch(body, None, BLOCK)) == KOPF_AS_JSON_PATCH(_patch(body, None, BLOCK))


def test_no_reference_body() -> None:
    with pytest.raises(ValueError, match="original body"):
        kopf_patching.as_json_patch(patches.Patch({}, fns=[BLOCK]))
    assert kopf_patching.as_json_patch(patches.Patch({})) == []


@pytest.mark.parametrize(
    "line",
    [
        json.dumps({"type": "ADDED", "object": _batch(documents=3)}),
        '{"u64": 18446744073709551615, "i64": -9223372036854775808, "x": 12345678901234567.5, "z": -0.0}',
        '{"nan": NaN, "inf": -Infinity, "huge": 1e400}',  # not JSON, but json.loads takes it
        '{"lone": "\\ud800", "dup": 1, "dup": 2, "text": "caf\\u00e9 \\u2603"}',
    ],
)
def test_stream_json_decodes_what_json_decodes(line: str) -> None:
    got = kopf_patching.StreamJson.loads(line)
    assert repr(got) == repr(json.loads(line))


def test_stream_json_refuses_what_json_refuses() -> None:
    with pytest.raises(json.JSONDecodeError):
        kopf_patching.StreamJson.loads('{"truncated": ')
