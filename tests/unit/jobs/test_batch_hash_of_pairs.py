"""`hashing.batch_request_hash_of_pairs` (what inline acceptance uses) is the canonical batch hash."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lading.jobs import hashing

_KEYS = st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=0x10FFFF, blacklist_categories=["Cs"]))
_DIGESTS = st.text(alphabet="0123456789abcdef", min_size=64, max_size=64)


@given(
    documents=st.dictionaries(_KEYS, _DIGESTS, max_size=30),
    schema=st.text(max_size=20),
    policy=st.dictionaries(st.text(max_size=8), st.text(max_size=8) | st.integers(), max_size=3),
)
@settings(max_examples=300, deadline=None)
def test_it_equals_the_canonical_batch_hash(documents: dict[str, str], schema: str, policy: dict[str, object]) -> None:
    options = {"schema": schema, "model_policy": policy, "validation_policy": "invoice-strict-v1"}
    pairs = list(documents.items())
    expected = hashing.batch_request_hash(documents=pairs, **options)  # type: ignore[arg-type]
    assert hashing.batch_request_hash_of_pairs(documents=pairs, **options) == expected  # type: ignore[arg-type]


def test_a_lone_surrogate_fails_as_the_canonical_hash_does() -> None:
    options = {"schema": "invoice.v1", "model_policy": {}, "validation_policy": "p"}
    with pytest.raises(UnicodeEncodeError):
        hashing.batch_request_hash(documents=[("a\ud800", "0" * 64)], **options)  # type: ignore[arg-type]
    with pytest.raises(UnicodeEncodeError):
        hashing.batch_request_hash_of_pairs(documents=[("a\ud800", "0" * 64)], **options)  # type: ignore[arg-type]


@given(documents=st.dictionaries(_KEYS, _DIGESTS, max_size=30), cut=st.integers(min_value=0, max_value=30))
@settings(max_examples=200, deadline=None)
def test_adding_pairs_in_chunks_hashes_what_adding_them_one_by_one_does(documents: dict[str, str], cut: int) -> None:
    pairs = sorted(documents.items())
    one_by_one = hashing.BatchRequestHasher(schema="invoice.v1", model_policy={"m": 1}, validation_policy="p")
    for key, digest in pairs:
        one_by_one.add(key, digest)
    chunked = hashing.BatchRequestHasher(schema="invoice.v1", model_policy={"m": 1}, validation_policy="p")
    chunked.add_many(pairs[:cut])
    chunked.add_many([])
    chunked.add_many(pairs[cut:])
    assert chunked.hexdigest() == one_by_one.hexdigest()
    assert chunked.hexdigest() == hashing.batch_request_hash(
        schema="invoice.v1", model_policy={"m": 1}, validation_policy="p", documents=pairs
    )


def test_chunks_must_keep_the_keys_ascending() -> None:
    hasher = hashing.BatchRequestHasher(schema="invoice.v1", model_policy={}, validation_policy="p")
    hasher.add_many([("a", "0" * 64), ("b", "0" * 64)])
    with pytest.raises(ValueError, match="unique and ascending"):
        hasher.add_many([("c", "0" * 64), ("b", "1" * 64)])
