"""The request examples of the intake's OpenAPI document are requests the intake accepts as sent
(clients copy them; Schemathesis mixes them into the requests it generates, so its stateful links
lead to objects that exist)."""

from __future__ import annotations

import json

import pytest
from lading_api import openapi, routes


@pytest.mark.parametrize("route", [r for r in routes.ROUTES if r.examples], ids=lambda r: r.operation_id)
def test_every_request_example_is_valid_as_it_is_documented(route: routes.Route) -> None:
    assert route.request is not None
    documented = openapi.document()["paths"][route.path][route.method.lower()]
    examples = documented["requestBody"]["content"]["application/json"]["examples"]
    assert set(examples) == set(route.examples)
    for example in examples.values():
        route.request.model_validate_json(json.dumps(example["value"]))
