"""The OpenAPI document says what the intake accepts, validators included: a request generated from
it (Schemathesis, a client's generator) is accepted by the intake's validation, and a document
body the intake refuses for its source (text, or uri with sha256 and bytes) is one the document
refuses too."""

from __future__ import annotations

import json
import re
from typing import Any

import hypothesis
import jsonschema
import pydantic
import pytest
from hypothesis import strategies as st
from lading_api import openapi

from lading import intake
from lading.documents import manifest_lines
from lading.models import specs

SHA = "0" * 64


def _accepts_document(**fields: Any) -> bool:
    body = {"key": "k", "inferencePoolRef": "lading-system/qwen", **fields}
    try:
        intake.DocumentRequest.model_validate_json(json.dumps(body))
    except pydantic.ValidationError:
        return False
    return True


def _accepts_key(key: str) -> bool:
    return _accepts_document(key=key, text="x")


def _accepts_uri(uri: str) -> bool:
    return _accepts_document(uri=uri, sha256=SHA, bytes=1)


@hypothesis.given(st.from_regex(specs.DOCUMENT_KEY_PATTERN, fullmatch=True).filter(lambda k: len(k) <= 256))
@hypothesis.settings(max_examples=400, deadline=None)
def test_a_key_matches_the_documented_pattern_exactly_when_the_intake_accepts_it(key: str) -> None:
    assert (re.fullmatch(openapi.DOCUMENT_KEY_STRICT, key) is not None) == _accepts_key(key)


@pytest.mark.parametrize("key", ["a//b", "a/", ".", "..", "a/./b", "a/../b", "./a"])
def test_keys_the_models_pattern_allows_and_the_intake_refuses_are_refused_by_the_document(key: str) -> None:
    assert re.fullmatch(specs.DOCUMENT_KEY_PATTERN, key) is not None
    assert not _accepts_key(key)
    assert re.fullmatch(openapi.DOCUMENT_KEY_STRICT, key) is None


@hypothesis.given(st.from_regex(openapi.MANIFEST_URI_STRICT, fullmatch=True)
                  .filter(lambda u: 8 <= len(u) <= manifest_lines.URI_MAX))  # fmt: skip
@hypothesis.settings(max_examples=400, deadline=None)
def test_every_uri_the_document_allows_is_accepted(uri: str) -> None:
    assert _accepts_uri(uri)


@pytest.mark.parametrize("uri", ["file://host/a", "file://a", "http://user@host/", "http://host:99999/",
                                 "https://:80/", "http://host:x/"])
def test_uris_the_models_pattern_allows_and_the_intake_refuses_are_refused_by_the_document(uri: str) -> None:
    assert re.fullmatch(specs.MANIFEST_URI_PATTERN, uri) is not None
    assert not _accepts_uri(uri)
    assert re.fullmatch(openapi.MANIFEST_URI_STRICT, uri) is None


def test_every_use_of_the_models_patterns_is_replaced_by_the_strict_one() -> None:
    text = json.dumps(openapi.document())
    for loose in openapi.STRICTER_PATTERNS:
        assert json.dumps(loose) not in text
    for strict in openapi.STRICTER_PATTERNS.values():
        assert json.dumps(strict) in text


SOURCES: list[dict[str, Any]] = [
    {"text": "x"},
    {"text": "x", "uri": None, "sha256": None, "bytes": None},
    {"uri": "https://h/a", "sha256": SHA, "bytes": 1},
    {"uri": "https://h/a", "sha256": SHA, "bytes": 1, "text": None},
    {},
    {"text": None},
    {"text": "x", "uri": "https://h/a"},
    {"text": "x", "bytes": 1},
    {"text": "x", "uri": "https://h/a", "sha256": SHA, "bytes": 1},
    {"uri": "https://h/a", "sha256": SHA},
    {"uri": "https://h/a", "bytes": 1, "sha256": None},
]


@pytest.mark.parametrize("source", SOURCES, ids=lambda s: json.dumps(s, sort_keys=True))
def test_the_document_and_the_intake_agree_on_a_documents_source(source: dict[str, Any]) -> None:
    document = openapi.document()
    schema = {**document["components"]["schemas"]["DocumentRequest"], "components": document["components"]}
    body = {"key": "k", "inferencePoolRef": "lading-system/qwen", **source}
    documented = jsonschema.Draft202012Validator(schema).is_valid(body)
    assert documented == _accepts_document(**source)
