"""
Errors as RFC 9457 problem details (`application/problem+json`).

Every error the intake answers has a `type` (a URI under PROBLEM_BASE naming the kind), a `title`
(the same for every problem of the type), the `status`, a `detail` for this occurrence, and, for
invalid requests, `errors`: every field error, each with a JSON `pointer` into the request body and
its `detail`. docs/api.md lists the types.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

import aiohttp.web
import orjson
import pydantic

PROBLEM_JSON: Final = "application/problem+json"
PROBLEM_BASE: Final = "https://lading.dev/problems/"

TITLES: Final[Mapping[str, str]] = {
    "bad-request": "The request is malformed",
    "idempotency-key-missing": "An Idempotency-Key header is required",
    "unauthorized": "A valid bearer token is required",
    "not-found": "No such resource",
    "method-not-allowed": "Method not allowed",
    "too-large": "The request body is too large",
    "unsupported-media-type": "The request body must be JSON",
    "invalid-request": "The request is invalid",
    "not-admitted": "The request was not admitted",
    "idempotency-key-reused": "The Idempotency-Key was used for a different request",
    "request-in-progress": "A request with this Idempotency-Key is still being processed",
    "batch-exists": "A batch of this name exists with another spec",
    "quota-exceeded": "The tenant's queue is full",
    "unavailable": "The service is unavailable",
    "internal-error": "Internal error",
}


def problem(
        status: int,
        kind: str,
        detail: str,
        *,
        errors: Sequence[Mapping[str, str]] | None = None,
        headers: Mapping[str, str] | None = None,
        extra: Mapping[str, Any] | None = None,
) -> aiohttp.web.Response:
    body: dict[str, Any] = {"type": PROBLEM_BASE + kind, "title": TITLES[kind], "status": status, "detail": detail}
    if errors:
        body["errors"] = list(errors)
    if extra:
        body.update(extra)
    return aiohttp.web.Response(
        status=status, body=orjson.dumps(body), content_type=PROBLEM_JSON, headers=dict(headers or {})
    )


def field_errors(exc: pydantic.ValidationError, *, prefix: str = "") -> list[dict[str, str]]:
    """Every error of a pydantic validation, with a JSON pointer to the field (aliases, as sent).
    Input values are never repeated: they may be document text."""
    found = []
    for error in exc.errors(include_url=False, include_input=False):
        pointer = prefix + "".join(f"/{_escape(str(part))}" for part in error["loc"])
        found.append({"pointer": pointer or "/", "detail": str(error["msg"])})
    return found


def _escape(part: str) -> str:
    return part.replace("~", "~0").replace("/", "~1")
