"""
The OpenAPI 3.1 document of the intake, generated from the route table (`routes.ROUTES`) and the
pydantic models of its bodies. Served at `/openapi.json`; a copy is committed as
docs/openapi.json (`python -m lading_api.openapi --write`, checked by a test).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import sys
from typing import Any, Literal

import pydantic
import pydantic.json_schema

from lading import __version__, intake
from lading.models import specs
from lading_api import routes

COMMITTED = pathlib.Path(__file__).resolve().parents[2] / "docs" / "openapi.json"
_PARAM = re.compile(r"\{([a-z]+)\}")
_REF = "#/components/schemas/{model}"
IDEMPOTENCY_KEY_PATTERN = "^[\\x21-\\x7e]([\\x20-\\x7e]*[\\x21-\\x7e])?$"
"""What `app` accepts as an Idempotency-Key: printable ASCII, no space at either end."""
Mode = Literal["validation", "serialization"]

_SEGMENT = r"(?:[A-Za-z0-9_-][A-Za-z0-9._-]*|\.[A-Za-z0-9_-][A-Za-z0-9._-]*|\.\.[A-Za-z0-9._-]+)"
DOCUMENT_KEY_STRICT = f"^{_SEGMENT}(?:/{_SEGMENT})*$"
"""A document key as the intake accepts it: `specs.DOCUMENT_KEY_PATTERN` without the empty, `.` and
`..` segments its validator refuses (no lookahead: generators of strings from patterns lack it)."""
_PORT = r"(?:[0-9]{1,4}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])"
_HOST = r"[A-Za-z0-9._~!$&'()*+,;=%-]+"
MANIFEST_URI_STRICT = f"^(?:file://(?:localhost)?/[^\\s\\x00]*|https?://{_HOST}(?::{_PORT})?(?:[/?#][^\\s\\x00]*)?)$"
"""A manifest URI as the intake accepts it (`specs.MANIFEST_URI_PATTERN` and its validator): file://
with an absolute path, or http(s):// with a host, a port that parses and no credentials. Stricter
than the server by a little: IPv6 and non-ASCII hosts, which it also accepts, are left out."""
STRICTER_PATTERNS = {specs.DOCUMENT_KEY_PATTERN: DOCUMENT_KEY_STRICT, specs.MANIFEST_URI_PATTERN: MANIFEST_URI_STRICT}
"""The models' patterns whose fields a validator checks further, with what they accept in all: the
document says what the intake accepts, so requests generated from it are not mostly refused."""
_ONE_SOURCE = [
    {"required": ["text"], "properties": {
        "text": {"type": "string"}, "uri": {"type": "null"}, "sha256": {"type": "null"}, "bytes": {"type": "null"},
    }},
    {"required": ["uri", "sha256", "bytes"], "properties": {
        "text": {"type": "null"}, "uri": {"type": "string"}, "sha256": {"type": "string"}, "bytes": {"type": "integer"},
    }},
]  # fmt: skip
"""A document's source, as its validator wants it: `text`, or `uri` with `sha256` and `bytes`, never both."""


def document() -> dict[str, Any]:
    models: list[type[pydantic.BaseModel]] = []
    for route in routes.ROUTES:
        if route.request is not None:
            models.append(route.request)
        models.extend(answer.model for answer in route.answers.values() if answer.model is not None)
    unique = list(dict.fromkeys(models))
    keyed, definitions = pydantic.json_schema.models_json_schema(
        [(model, "validation" if _is_request(model) else "serialization") for model in unique],
        by_alias=True, ref_template=_REF,
    )  # fmt: skip
    schemas = _stricter(dict(definitions.get("$defs", {})))
    paths: dict[str, dict[str, Any]] = {}
    for route in routes.ROUTES:
        operation: dict[str, Any] = {"operationId": route.operation_id, "summary": route.summary, "responses": {}}
        parameters = [_path_parameter(name) for name in _PARAM.findall(route.path)]
        parameters += [{"name": n, "in": "query", "required": False, "description": d, "schema": dict(schema)}
                       for n, schema, d in route.query]
        if route.method == "POST":
            parameters.append({
                "name": "Idempotency-Key", "in": "header", "required": True,
                "description": "A unique value per intended request (1 to 255 printable ASCII characters); "
                "reuse it only to retry that request.",
                "schema": {"type": "string", "minLength": 1, "maxLength": 255, "pattern": IDEMPOTENCY_KEY_PATTERN},
            })  # fmt: skip
        if parameters:
            operation["parameters"] = parameters
        if route.request is not None:
            operation["requestBody"] = {"required": True, "content": {"application/json": {
                "schema": keyed[(route.request, "validation")]}}}  # fmt: skip
            if route.examples:
                operation["requestBody"]["content"]["application/json"]["examples"] = {
                    name: {"summary": summary, "value": dict(value)}
                    for name, (summary, value) in route.examples.items()
                }
        for status, answer in sorted(route.answers.items()):
            response: dict[str, Any] = {"description": answer.description}
            if answer.model is not None:
                mode: Mode = "validation" if _is_request(answer.model) else "serialization"
                response["content"] = {answer.content_type: {"schema": keyed[(answer.model, mode)]}}
            elif answer.content_type != "application/json":
                response["content"] = {answer.content_type: {"schema": {"type": "string"}}}
            else:
                response["content"] = {"application/json": {"schema": {"type": "object"}}}
            if answer.headers:
                response["headers"] = {name: {"schema": {"type": "string"}} for name in answer.headers}
            if answer.links:
                response["links"] = {name: {"operationId": operation, "parameters": dict(parameters)}
                                     for name, (operation, parameters) in answer.links.items()}
            operation["responses"][str(status)] = response
        if not route.public:
            operation["security"] = [{"bearer": []}]
        paths.setdefault(route.path, {})[route.method.lower()] = operation
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Lading intake API",
            "version": __version__,
            "description": "Submit documents and ExtractionBatches over HTTP; read their state and results. "
            "See docs/api.md.",
        },
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer",
                                           "description": "A token from `lading tokens create`."}},
        },
    }


def _stricter(schemas: dict[str, Any]) -> dict[str, Any]:
    """The models' schemas with what their validators check beyond JSON Schema said in it too."""
    tightened: dict[str, Any] = json.loads(json.dumps(schemas), object_hook=_strict_pattern)
    document = tightened.get(intake.DocumentRequest.__name__)
    if document is not None:
        document["oneOf"] = _ONE_SOURCE
    return tightened


def _strict_pattern(schema: dict[str, Any]) -> dict[str, Any]:
    pattern = schema.get("pattern")
    if isinstance(pattern, str) and pattern in STRICTER_PATTERNS:
        schema["pattern"] = STRICTER_PATTERNS[pattern]
    return schema


def _is_request(model: type[pydantic.BaseModel]) -> bool:
    return any(route.request is model for route in routes.ROUTES)


def _path_parameter(name: str) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    if name == "id":
        schema = {"type": "integer", "minimum": 1, "maximum": 2**63 - 1}
    elif name == "namespace":
        schema = {"type": "string", "minLength": 1, "maxLength": 63, "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"}
    return {"name": name, "in": "path", "required": True, "schema": schema}


def rendered() -> str:
    return json.dumps(document(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lading_api.openapi", description=__doc__)
    parser.add_argument("--write", action="store_true", help=f"write {COMMITTED}")
    parser.add_argument("--check", action="store_true", help=f"exit 1 when {COMMITTED} is stale")
    args = parser.parse_args(argv)
    text = rendered()
    if args.write:
        COMMITTED.write_text(text, encoding="utf-8")
    elif args.check:
        if not COMMITTED.exists() or COMMITTED.read_text(encoding="utf-8") != text:
            print(f"{COMMITTED} is stale: run python -m lading_api.openapi --write", file=sys.stderr)
            return 1
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
