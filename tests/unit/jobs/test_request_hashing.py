"""Canonical request hashes: stable, order-independent, and covering what affects the result."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from lading.jobs import hashing

MODEL = {"pool": "ns/p", "provider": "builtin", "model": "m"}


@given(digest=st.text(alphabet="0123456789abcdef", min_size=64, max_size=64), schema=st.text(max_size=20),
       policy=st.text(max_size=20))
def test_the_fast_job_hasher_equals_the_canonical_definition(digest: str, schema: str, policy: str) -> None:
    fast = hashing.job_request_hasher(schema=schema, model_policy=MODEL, validation_policy=policy)
    assert fast(digest) == hashing.job_request_hash(
        content_sha256=digest, schema=schema, model_policy=MODEL, validation_policy=policy
    )


def test_key_order_of_the_model_policy_does_not_matter() -> None:
    reordered = dict(reversed(list(MODEL.items())))
    a = hashing.batch_request_hash(schema="s", model_policy=MODEL, validation_policy="p", documents=[("k", "d")])
    b = hashing.batch_request_hash(schema="s", model_policy=reordered, validation_policy="p", documents=[("k", "d")])
    assert a == b


def test_document_order_does_not_matter_but_content_does() -> None:
    docs = [("a", "1"), ("b", "2")]
    base = hashing.batch_request_hash(schema="s", model_policy=MODEL, validation_policy="p", documents=docs)
    assert base == hashing.batch_request_hash(
        schema="s", model_policy=MODEL, validation_policy="p", documents=list(reversed(docs))
    )
    assert base != hashing.batch_request_hash(
        schema="s", model_policy=MODEL, validation_policy="p", documents=[("a", "1"), ("b", "3")]
    )
    assert base != hashing.batch_request_hash(schema="s", model_policy=MODEL, validation_policy="q", documents=docs)
