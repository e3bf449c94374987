"""
Offline stand-in for the API server's handling of a custom resource against its CRD: defaulting,
openAPIV3Schema validation and CEL `x-kubernetes-validations`, without a cluster.

- Schema: the CRD's openAPIV3Schema is turned into JSON Schema (Kubernetes' `x-kubernetes-*`
  keywords dropped, `nullable` honoured) and checked with `jsonschema`. Unknown fields are
  errors, as with `kubectl apply` (strict field validation, the default since Kubernetes 1.27),
  instead of being silently pruned.
- Defaults are applied before validation, as the API server does.
- CEL: every rule is evaluated with cel-python at its node, `self` bound to the value there and
  `oldSelf` (transition rules) to the old object's value; list items of `x-kubernetes-list-type:
  map` lists are correlated by their keys. Kubernetes' list extension `sum()` is provided.
"""

from __future__ import annotations

import copy
import pathlib
from collections.abc import Iterator, Mapping
from typing import Any

import celpy
import celpy.adapter
import celpy.celtypes
import celpy.evaluation
import jsonschema
import yaml

REPO = pathlib.Path(__file__).resolve().parents[2]
CRD_DIR = REPO / "crds"

Json = Any


def load_crds(directory: pathlib.Path = CRD_DIR) -> dict[str, dict[str, Any]]:
    """CRDs of `directory` by kind."""
    found = {}
    for path in sorted(directory.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text(encoding="utf-8"))
        found[crd["spec"]["names"]["kind"]] = crd
    return found


def openapi_schema(crd: Mapping[str, Any]) -> dict[str, Any]:
    versions = crd["spec"]["versions"]
    assert len(versions) == 1, "one served version expected"
    schema: dict[str, Any] = versions[0]["schema"]["openAPIV3Schema"]
    return schema


def to_json_schema(node: Mapping[str, Any]) -> dict[str, Any]:
    """An OpenAPI v3 (Kubernetes structural) schema node as JSON Schema, unknown fields forbidden."""
    result: dict[str, Any] = {}
    for key, value in node.items():
        if key.startswith("x-kubernetes-") or key in ("nullable", "default", "description"):
            continue
        if key == "properties":
            result[key] = {name: to_json_schema(child) for name, child in value.items()}
        elif key in ("items", "additionalProperties") and isinstance(value, Mapping):
            result[key] = to_json_schema(value)
        else:
            result[key] = copy.deepcopy(value)
    for bound, exclusive in (("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum")):
        if result.get(exclusive) is True:  # OpenAPI v3.0's boolean flag -> JSON Schema's number
            result[exclusive] = result.pop(bound)
        elif result.get(exclusive) is False:
            del result[exclusive]
    if node.get("nullable") and "type" in result:
        result["type"] = [result["type"], "null"]
    if node.get("type") == "object" and "properties" in node and "additionalProperties" not in node:
        result["additionalProperties"] = False
    if node.get("x-kubernetes-list-type") == "set":
        result["uniqueItems"] = True
    return result


def apply_defaults(node: Mapping[str, Any], value: Json) -> Json:
    """`value` with the schema's defaults filled in, recursively (the API server's defaulting)."""
    if isinstance(value, dict) and "properties" in node:
        value = dict(value)
        for name, child in node["properties"].items():
            if name not in value and "default" in child:
                value[name] = copy.deepcopy(child["default"])
            if name in value:
                value[name] = apply_defaults(child, value[name])
    elif isinstance(value, list) and "items" in node:
        value = [apply_defaults(node["items"], item) for item in value]
    return value


def schema_errors(crd: Mapping[str, Any], obj: Mapping[str, Any]) -> list[str]:
    """Violations of the CRD's openAPIV3Schema by `obj` (after defaulting), as 'path: message'."""
    schema = openapi_schema(crd)
    validator = jsonschema.Draft202012Validator(to_json_schema(schema))
    defaulted = apply_defaults(schema, obj)
    return sorted(
        f"{'.'.join(str(step) for step in error.absolute_path) or '<root>'}: {error.message}"
        for error in validator.iter_errors(defaulted)
    )


def _list_sum(values: celpy.celtypes.ListType) -> Any:
    total: Any = celpy.celtypes.IntType(0)
    for value in values:
        total = total + value
    return total


_ENVIRONMENT = celpy.Environment()
_FUNCTIONS = {"sum": _list_sum}
_PROGRAMS: dict[str, Any] = {}


def _program(rule: str) -> Any:
    if rule not in _PROGRAMS:
        _PROGRAMS[rule] = _ENVIRONMENT.program(_ENVIRONMENT.compile(rule), functions=_FUNCTIONS)
    return _PROGRAMS[rule]


def rules(node: Mapping[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, str]]]:
    """Every CEL rule of a schema with the path of its node ('.spec.workers')."""
    for rule in node.get("x-kubernetes-validations", []):
        yield path, rule
    for name, child in node.get("properties", {}).items():
        yield from rules(child, f"{path}.{name}")
    if "items" in node:
        yield from rules(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), Mapping):
        yield from rules(node["additionalProperties"], f"{path}{{}}")


def _cel_violations(node: Mapping[str, Any], value: Json, old: Json, path: str) -> Iterator[str]:
    for rule in node.get("x-kubernetes-validations", []):
        is_transition = "oldSelf" in rule["rule"]
        if is_transition and old is None:
            continue
        activation = {"self": celpy.adapter.json_to_cel(value)}
        if is_transition:
            activation["oldSelf"] = celpy.adapter.json_to_cel(old)
        try:
            result = _program(rule["rule"]).evaluate(activation)
        except Exception as exc:
            yield f"{path or '<root>'}: {rule.get('message', rule['rule'])} (evaluation error: {exc})"
            continue
        if isinstance(result, celpy.evaluation.CELEvalError):
            yield f"{path or '<root>'}: {rule.get('message', rule['rule'])} (evaluation error: {result})"
        elif not isinstance(result, celpy.celtypes.BoolType):
            yield f"{path or '<root>'}: rule {rule['rule']!r} returned {result!r}, not a bool"
        elif not result:
            yield f"{path or '<root>'}: {rule.get('message', rule['rule'])}"
    if isinstance(value, dict):
        for name, child in node.get("properties", {}).items():
            if name in value:
                old_child = old.get(name) if isinstance(old, dict) else None
                yield from _cel_violations(child, value[name], old_child, f"{path}.{name}")
    elif isinstance(value, list) and "items" in node:
        keys = node.get("x-kubernetes-list-map-keys")
        old_by_key = {}
        if keys and isinstance(old, list):
            old_by_key = {tuple(item.get(key) for key in keys): item for item in old}
        for index, item in enumerate(value):
            old_item = old_by_key.get(tuple(item.get(key) for key in keys)) if keys else None
            yield from _cel_violations(node["items"], item, old_item, f"{path}[{index}]")


def cel_errors(crd: Mapping[str, Any], obj: Mapping[str, Any], old: Mapping[str, Any] | None = None) -> list[str]:
    """Violated CEL rules for creating `obj` (old None) or updating `old` to `obj`; both defaulted first."""
    schema = openapi_schema(crd)
    new = apply_defaults(schema, obj)
    previous = None if old is None else apply_defaults(schema, old)
    return list(_cel_violations(schema, new, previous, ""))


def admission_errors(crd: Mapping[str, Any], obj: Mapping[str, Any], old: Mapping[str, Any] | None = None) -> list[str]:
    """Everything the API server would reject `obj` for: schema first, CEL if the schema passes."""
    return schema_errors(crd, obj) or cel_errors(crd, obj, old)
