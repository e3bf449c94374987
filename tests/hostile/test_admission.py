"""
Hostile ExtractionBatch specs, document manifests (JSON lines) and manifest sets (YAML, as
`lading run` reads them) through core admission (`lading.applying`) against real PostgreSQL.

Invariant for each: admitted whole, or refused with a named reason (a pydantic ValidationError
for the spec, which the operator reports as InvalidSpec; AdmissionRejected with its reason;
InvalidManifest; ManifestError), never a temporary error that would be retried unchanged for
ever, never any other exception; nothing half-applied (a refusal adds no row anywhere, an
admission adds the batch with exactly its documents); every message encodes as UTF-8.
"""

from __future__ import annotations

import dataclasses
import itertools
import pathlib
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import hypothesis
import pydantic
import pytest
import yaml
from hypothesis import strategies as st

from lading import applying, errors
from lading.db import registry
from lading.ids import PoolName
from lading.models import manifests, specs
from lading.settings import DocumentSettings
from tests.hostile import strategies, tally
from tests.support import factories

REASONS = {"InvalidSpec", "InvalidManifest", "NoTenantQuota", "PoolNotFound", "PoolNotAllowed", "PriorityNotAllowed",
           "QuotaExceeded"}  # fmt: skip
"""Reasons a refusal may name: each tells the author what to change."""
SETTINGS = hypothesis.settings(
    max_examples=40, deadline=None, suppress_health_check=[hypothesis.HealthCheck.function_scoped_fixture],
)


@dataclasses.dataclass
class Admission:
    db: asyncpg.Connection
    root: pathlib.Path
    names: itertools.count[int] = dataclasses.field(default_factory=itertools.count)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:  # printed with a failing example: keep it short
        printer.text("<Admission>")

    def batch(self, spec: dict[str, Any]) -> dict[str, Any]:
        n = next(self.names)
        return {"apiVersion": specs.API_VERSION, "kind": "ExtractionBatch",
                "metadata": {"name": f"hostile-{n}", "namespace": "acme", "uid": f"uid-{n}"}, "spec": spec}  # fmt: skip

    async def counts(self) -> tuple[int, ...]:
        row = await self.db.fetchrow(
            "SELECT (SELECT count(*) FROM batches), (SELECT count(*) FROM extraction_jobs),"
            " (SELECT count(*) FROM job_documents), (SELECT count(*) FROM outbox_events),"
            " (SELECT count(*) FROM tenants), (SELECT count(*) FROM pools)"
        )
        assert row is not None
        return tuple(row)


@pytest.fixture
async def admission(db: asyncpg.Connection, tmp_path: pathlib.Path) -> AsyncIterator[Admission]:
    await factories.seed(db)
    await registry.upsert_pool(db, name=PoolName("acme/builtin"), provider="builtin", model="lading-builtin", spec={})
    (tmp_path / "acme").mkdir()
    yield Admission(db=db, root=tmp_path)


def _named(kind: str, exc: BaseException) -> None:
    """A refusal the author can act on: a known reason, and a message that can be printed."""
    str(exc).encode("utf-8")
    reason = getattr(exc, "reason", None) or type(exc).__name__
    tally.ended(kind, f"refused {reason}")
    if isinstance(exc, applying.AdmissionRejected):
        assert exc.reason in REASONS, exc.reason


async def _admitted_whole(
        kind: str, admission: Admission, before: tuple[int, ...], applied: applying.AppliedBatch, documents: int,
) -> None:
    tally.ended(kind, "admitted")
    after = await admission.counts()
    if applied.result.created:
        assert len(applied.result.job_ids) == documents
        expected = (before[0] + 1, before[1] + documents, before[2] + documents, before[3] + 1)
        assert after[:4] == expected, (before, after)
    else:
        assert after[:4] == before[:4]


@SETTINGS
@hypothesis.given(spec=strategies.batch_specs())
async def test_a_batch_spec_is_admitted_whole_or_refused_with_a_named_reason(
        admission: Admission, spec: dict[str, Any],
) -> None:
    tally.tried("batch-spec")
    before = await admission.counts()
    try:
        batch = specs.ExtractionBatch.model_validate(admission.batch(spec))
    except pydantic.ValidationError as exc:  # the operator's InvalidSpec
        _named("batch-spec", exc)
        return
    try:
        applied = await applying.admit_batch(admission.db, batch)
    except applying.AdmissionRejected as exc:
        _named("batch-spec", exc)
        assert await admission.counts() == before, "a refused batch left rows behind"
        return
    await _admitted_whole("batch-spec", admission, before, applied, len(batch.spec.documents or ()))


@SETTINGS
@hypothesis.given(lines=st.lists(strategies.manifest_lines(), min_size=1, max_size=6)
                  | st.lists(strategies.manifest_lines(valid_only=True), min_size=1, max_size=6))
@hypothesis.example(lines=[b'{"key": "a", "uri": "file:///d/a", "sha256": "' + b"a" * 64 + b'", "bytes": 1e309}'])
@hypothesis.example(lines=[strategies.nested(10_000, kind="list").encode()])
async def test_a_document_manifest_is_admitted_whole_or_refused_naming_the_line(
        admission: Admission, lines: list[bytes],
) -> None:
    tally.tried("manifest-line", len(lines))
    n = next(admission.names)
    path = admission.root / "acme" / f"manifest-{n}.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    batch = specs.ExtractionBatch.model_validate(admission.batch(
        {"schema": "invoice.v1", "inferencePoolRef": {"name": "builtin"}, "manifestUri": path.as_uri()}
    ))  # fmt: skip
    before = await admission.counts()
    try:
        applied = await applying.admit_batch(
            admission.db, batch, documents=DocumentSettings(roots=(str(admission.root),))
        )  # fmt: skip
    except applying.InvalidManifest as exc:
        _named("manifest-line", exc)
        assert await admission.counts() == before, "a refused manifest left rows behind"
        return
    await _admitted_whole("manifest-line", admission, before, applied, sum(1 for line in lines if line.strip()))


def _manifest_set(batch: dict[str, Any]) -> str:
    """A quota, a pool and `batch` as one YAML stream (whatever YAML can say of the batch)."""
    quota = {"apiVersion": specs.API_VERSION, "kind": "TenantQuota", "metadata": {"name": "acme"},
             "spec": {"namespaces": ["acme"]}}  # fmt: skip
    pool = {"apiVersion": specs.API_VERSION, "kind": "InferencePool",
            "metadata": {"name": "builtin", "namespace": "acme"}, "spec": {"provider": "builtin"}}  # fmt: skip
    try:
        return yaml.safe_dump_all([quota, pool, batch], allow_unicode=False)
    except yaml.YAMLError:  # a value YAML cannot represent: the set without it
        return yaml.safe_dump_all([quota, pool], allow_unicode=False)


YAML_TEXTS = st.one_of(
    strategies.ANY_TEXT,
    strategies.DEEP.map(lambda d: "apiVersion: lading.dev/v1alpha1\nkind: TenantQuota\nmetadata: {name: a}\n"
                        "spec: {namespaces: " + d + "}\n"),
    st.sampled_from(["a: !!python/object:os.system x\n", "a: &a [*a]\n", "- \x00\n", "--- !!binary AAAA\n",
                     "apiVersion: lading.dev/v1alpha1\nkind: TenantQuota\nmetadata: {name: \"\\ud800\\0\"}\n"]),
)  # fmt: skip


@SETTINGS
@hypothesis.given(text=st.builds(lambda spec: spec, strategies.batch_specs()) | YAML_TEXTS)
@hypothesis.example(text="x: " + "[" * 10_000 + "]" * 10_000)
@hypothesis.example(text="apiVersion: lading.dev/v1alpha1\nkind: TenantQuota\nmetadata: {name: \"\\ud800\"}\n")
async def test_a_manifest_set_is_applied_whole_or_refused_naming_the_problem(
        admission: Admission, text: str | dict[str, Any],
) -> None:
    tally.tried("manifest-set")
    if isinstance(text, dict):
        text = _manifest_set(admission.batch(text))
    before = await admission.counts()
    try:
        loaded = manifests.load_text(text, source="hostile.yaml")
    except errors.ManifestError as exc:
        _named("manifest-set", exc)
        return
    try:
        applied = await applying.apply_manifests(admission.db, loaded)
    except applying.AdmissionRejected as exc:
        _named("manifest-set", exc)
        assert await admission.counts() == before, "a refused manifest set was half-applied"
        return
    documents = sum(len(batch.resource.spec.documents or ()) for batch in loaded.extraction_batches)
    assert sum(len(a.result.job_ids) for a in applied) == documents
    tally.ended("manifest-set", "applied")
