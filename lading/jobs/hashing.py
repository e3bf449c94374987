"""
Canonical request hashes: what makes two acceptances "the same request".

The hash covers everything that affects the result (document digest, extraction
schema, model policy, validation policy) and nothing transport-level (priority,
deadline, delivery endpoint, suspend, labels). It is versioned: a change to what the
hash covers bumps HASH_VERSION, and stored hashes keep the version they were made with.
Canonical JSON: sorted keys, no insignificant whitespace, UTF-8, so key order in the
YAML a user applied never matters.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import orjson

HASH_VERSION = 1


def canonical_json(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def content_digest(text: str) -> str:
    """SHA-256 of a document's UTF-8 bytes, hex."""
    return hashlib.sha256(text.encode()).hexdigest()


def job_request_hasher(
        *,
        schema: str,
        model_policy: Mapping[str, Any],
        validation_policy: str,
) -> Callable[[str], str]:
    """The job request hash for documents of one batch, as a function of the content digest.

    The canonical JSON of everything but the digest is built once and the digest spliced
    in, which gives byte-for-byte the canonical JSON of the whole request: a 10,000-job
    batch costs 10,000 SHA-256 calls, not 10,000 JSON serialisations.
    """
    prefix, suffix = job_request_template(schema=schema, model_policy=model_policy, validation_policy=validation_policy)

    def job_hash(content_sha256: str) -> str:
        # A hex digest (what content_digest returns) needs no JSON escaping: quoting it is
        # its canonical JSON. The equivalence with job_request_hash is property-tested.
        return hashlib.sha256(prefix + b'"' + content_sha256.encode() + b'"' + suffix).hexdigest()

    return job_hash


def job_request_template(
        *,
        schema: str,
        model_policy: Mapping[str, Any],
        validation_policy: str,
) -> tuple[bytes, bytes]:
    """The canonical JSON of a job request split around its digest: the request of a document
    with digest D is `prefix + b'"' + D + b'"' + suffix`. Bulk acceptance computes the same hash
    in SQL from these two parts (`sha256(prefix || '"' || digest || '"' || suffix)`)."""
    placeholder = "DOCUMENT-DIGEST"
    template = canonical_json(
        {
            "v": HASH_VERSION,
            "document_sha256": placeholder,
            "schema": schema,
            "model": dict(model_policy),
            "validation_policy": validation_policy,
        }
    )
    prefix, suffix = template.split(f'"{placeholder}"'.encode())
    return prefix, suffix


def job_request_hash(
        *,
        content_sha256: str,
        schema: str,
        model_policy: Mapping[str, Any],
        validation_policy: str,
) -> str:
    """The hash of one job's request."""
    return hashlib.sha256(
        canonical_json(
            {
                "v": HASH_VERSION,
                "document_sha256": content_sha256,
                "schema": schema,
                "model": dict(model_policy),
                "validation_policy": validation_policy,
            }
        )
    ).hexdigest()


def batch_request_hash(
        *,
        schema: str,
        model_policy: Mapping[str, Any],
        validation_policy: str,
        documents: Iterable[tuple[str, str]],
) -> str:
    """The hash of a whole batch: its result-affecting options and every (key, content digest)."""
    return hashlib.sha256(
        canonical_json(
            {
                "v": HASH_VERSION,
                "schema": schema,
                "model": dict(model_policy),
                "validation_policy": validation_policy,
                "documents": sorted(documents),
            }
        )
    ).hexdigest()


def batch_request_hash_of_pairs(
        *,
        schema: str,
        model_policy: Mapping[str, Any],
        validation_policy: str,
        documents: Iterable[tuple[str, str]],
) -> str:
    """`batch_request_hash`, byte for byte, for a large batch: the sorted (key, digest) pairs are
    serialised in one orjson call (its compact output of strings and arrays is exactly the
    canonical JSON's; property-tested) between the two halves of the canonical template. A pair
    orjson refuses (a lone surrogate) takes the standard path, which fails as it always did."""
    pairs = sorted(documents)
    try:
        encoded = orjson.dumps(pairs)
    except orjson.JSONEncodeError:
        return batch_request_hash(
            schema=schema, model_policy=model_policy, validation_policy=validation_policy, documents=pairs
        )
    placeholder = "DOCUMENT-PAIRS"
    template = canonical_json(
        {"v": HASH_VERSION, "schema": schema, "model": dict(model_policy), "validation_policy": validation_policy,
         "documents": placeholder}
    )  # fmt: skip
    prefix, suffix = template.split(f'"{placeholder}"'.encode())
    return hashlib.sha256(prefix + encoded + suffix).hexdigest()


class BatchRequestHasher:
    """`batch_request_hash`, fed one (key, content digest) pair at a time in ascending key order.

    A manifest batch of a million documents is hashed as the database streams its sorted pairs,
    without holding them: the same bytes as `batch_request_hash` would serialise, so a batch
    hashes the same whether its documents came inline or by manifest (property-tested).
    Keys must be unique and arrive in code point order (SQL: ORDER BY key COLLATE "C").
    """

    def __init__(self, *, schema: str, model_policy: Mapping[str, Any], validation_policy: str) -> None:
        placeholder = "DOCUMENT-PAIRS"
        template = canonical_json(
            {
                "v": HASH_VERSION,
                "schema": schema,
                "model": dict(model_policy),
                "validation_policy": validation_policy,
                "documents": placeholder,
            }
        )
        prefix, self._suffix = template.split(f'"{placeholder}"'.encode())
        self._sha = hashlib.sha256(prefix + b"[")
        self._last: str | None = None

    def add(self, key: str, content_sha256: str) -> None:
        if self._last is not None:
            if key <= self._last:
                raise ValueError(f"document keys must be unique and ascending; {key!r} came after {self._last!r}")
            self._sha.update(b",")
        self._sha.update(canonical_json([key, content_sha256]))
        self._last = key

    def add_many(self, pairs: Sequence[tuple[str, str]]) -> None:
        """`add` for each pair in turn, the same bytes hashed: the pairs serialised by orjson
        (its compact output is the canonical JSON's for strings) and fed to the hash at once."""
        last = self._last
        for key, _ in pairs:
            if last is not None and key <= last:
                raise ValueError(f"document keys must be unique and ascending; {key!r} came after {last!r}")
            last = key
        if not pairs:
            return
        try:
            encoded = orjson.dumps(pairs)[1:-1]  # the pairs without the enclosing brackets
        except orjson.JSONEncodeError:  # a lone surrogate: fail as `add` does
            for key, digest in pairs:
                self.add(key, digest)
            return
        self._sha.update(b"," + encoded if self._last is not None else encoded)
        self._last = last

    def hexdigest(self) -> str:
        final = self._sha.copy()
        final.update(b"]" + self._suffix)
        return final.hexdigest()
