"""
The JSON schema -> structural openAPIV3Schema translation, on small models that use each
construct the translation handles (and the ones it must refuse rather than emit a CRD the API
server would reject or silently misread).
"""

from __future__ import annotations

import ipaddress
from typing import Literal

import pydantic
import pytest
from lading_operator import crds


class Inner(pydantic.BaseModel):
    """Inner docstring."""

    size: int = pydantic.Field(default=3, ge=1, le=9, description="How big.")


class Sample(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(alias_generator=pydantic.alias_generators.to_camel, extra="forbid")

    kind_name: Literal["only"] = pydantic.Field(description="One value.")
    ratio: float = pydantic.Field(default=0.5, gt=0, lt=1)
    maybe: str | None = pydantic.Field(default=None, max_length=5, description="Optional.")
    inner: Inner = pydantic.Field(default_factory=Inner, description="Field description wins.")
    inners: list[Inner] = pydantic.Field(default_factory=list, max_length=4)
    labels: dict[str, str] | None = pydantic.Field(default=None, max_length=8)
    tags: list[Literal["a", "b"]] = pydantic.Field(default_factory=lambda: ["a"], max_length=2)


def test_translation() -> None:
    schema = crds.model_schema(Sample)
    properties = schema["properties"]
    assert schema["required"] == ["kindName"] and "title" not in schema
    assert "additionalProperties" not in schema, "unknown fields are pruned/refused by the API server, not false"
    assert properties["kindName"] == {"type": "string", "description": "One value.", "enum": ["only"]}
    assert properties["ratio"] == {
        "type": "number", "default": 0.5,
        "minimum": 0, "maximum": 1, "exclusiveMinimum": True, "exclusiveMaximum": True,
    }  # fmt: skip
    assert properties["maybe"] == {"type": "string", "description": "Optional.", "maxLength": 5}
    assert properties["inner"]["description"] == "Field description wins."
    assert properties["inner"]["default"] == {"size": 3}
    assert properties["inner"]["properties"]["size"] == {
        "type": "integer", "description": "How big.", "default": 3, "minimum": 1, "maximum": 9,
    }  # fmt: skip
    assert properties["inners"]["items"]["properties"]["size"]["default"] == 3
    assert properties["inners"]["default"] == []
    assert properties["labels"] == {"type": "object", "maxProperties": 8, "additionalProperties": {"type": "string"}}
    assert properties["tags"]["items"] == {"type": "string", "enum": ["a", "b"]}
    assert properties["tags"]["default"] == ["a"]


def test_a_union_of_types_is_refused() -> None:
    class Union(pydantic.BaseModel):
        value: int | str

    with pytest.raises(ValueError, match=r"Union\.value: a union of several types has no structural schema"):
        crds.model_schema(Union)


def test_unique_items_is_refused() -> None:
    class Unique(pydantic.BaseModel):
        names: set[str]

    with pytest.raises(ValueError, match="uniqueItems is not allowed"):
        crds.model_schema(Unique)


def test_a_format_kubernetes_ignores_is_refused() -> None:
    class Network(pydantic.BaseModel):
        cidr: ipaddress.IPv4Network

    with pytest.raises(ValueError, match="is not one Kubernetes checks"):
        crds.model_schema(Network)


def test_free_form_fields_are_refused() -> None:
    class Free(pydantic.BaseModel):
        anything: object

    with pytest.raises(ValueError, match=r"Free\.anything: no type"):
        crds.model_schema(Free)
