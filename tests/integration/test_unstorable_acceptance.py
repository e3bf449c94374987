"""
Acceptance of a value PostgreSQL cannot store (U+0000, a lone surrogate): a permanent error
naming the field, the whole transaction rolled back, and admission says InvalidSpec, never a
transient failure to retry. The spec models refuse such values first; these requests bypass
them on purpose, to prove the defence behind them.
"""

from __future__ import annotations

import dataclasses

import asyncpg
import pytest

from lading import accepting, applying, errors
from lading.models import manifests, specs
from tests.support import factories


async def _counts(conn: asyncpg.Connection) -> tuple[int, int, int, int]:
    row = await conn.fetchrow(
        """SELECT (SELECT count(*) FROM batches) AS b, (SELECT count(*) FROM extraction_jobs) AS j,
                  (SELECT count(*) FROM job_documents) AS d, (SELECT count(*) FROM outbox_events) AS o"""
    )
    assert row is not None
    return row["b"], row["j"], row["d"], row["o"]


def _with_document(request: accepting.BatchRequest, index: int, *, key: str | None = None,
                   text: str | None = None) -> accepting.BatchRequest:  # fmt: skip
    documents = list(request.documents)
    old = documents[index]
    documents[index] = accepting.DocumentInput(
        key=old.key if key is None else key, text=old.text if text is None else text
    )
    return dataclasses.replace(request, documents=documents)


@pytest.mark.parametrize(
    ("key", "text", "field", "reason"),
    [
        (None, "Total 12.00\x00 EUR", "spec.documents[3].text", "U+0000 (NUL)"),  # fails in COPY on the server
        (None, "Total \ud800 EUR", "spec.documents[3].text", "lone surrogate U+D800"),  # fails encoding the COPY
        ("doc-\x00003", None, "spec.documents[3].key", "U+0000 (NUL)"),  # the jobs' COPY
    ],
    ids=["nul-in-text", "surrogate-in-text", "nul-in-key"],
)
async def test_an_unstorable_document_is_a_permanent_error_and_nothing_is_accepted(
        db: asyncpg.Connection,
        key: str | None,
        text: str | None,
        field: str,
        reason: str,
) -> None:
    await factories.seed(db)
    request = _with_document(factories.batch_request(count=8), 3, key=key, text=text)

    with pytest.raises(accepting.UnstorableRequest) as caught:
        await accepting.accept_batch(db, request)

    message = str(caught.value)
    assert isinstance(caught.value, errors.PermanentError)
    assert f"{field}: contains" in message and reason in message, message
    assert "nothing was accepted" in message
    assert "Total" not in message, "the document's text is never repeated"
    assert await _counts(db) == (0, 0, 0, 0)
    # The connection is fine, and the same batch with the value fixed is accepted whole.
    fixed = await accepting.accept_batch(db, factories.batch_request(count=8))
    assert fixed.created and len(fixed.job_ids) == 8
    assert await _counts(db) == (1, 8, 8, 1)


def _batch(documents: list[tuple[str, str]]) -> specs.ExtractionBatch:
    """An ExtractionBatch whose documents skip validation, as if a model check were missing."""
    valid = specs.ExtractionBatch.model_validate(
        {
            "apiVersion": specs.API_VERSION,
            "kind": "ExtractionBatch",
            "metadata": {"name": "march", "namespace": "acme", "uid": "u-1"},
            "spec": {
                "schema": "invoice.v1",
                "inferencePoolRef": {"name": "builtin", "namespace": "lading-system"},
                "documents": [{"key": "placeholder", "text": "placeholder"}],
            },
        }
    )
    inline = [specs.InlineDocument.model_construct(key=key, text=text) for key, text in documents]
    return valid.model_copy(update={"spec": valid.spec.model_copy(update={"documents": inline})})


async def test_admission_of_an_unstorable_batch_is_rejected_as_invalid_spec(db: asyncpg.Connection) -> None:
    await factories.seed(db)
    batch = _batch([("inv-1", "fine"), ("inv-2", "Total\x00")])

    with pytest.raises(applying.AdmissionRejected) as caught:
        await applying.admit_batch(db, batch)

    assert caught.value.reason == "InvalidSpec"
    assert str(caught.value).startswith("ExtractionBatch acme/march: ")
    assert "spec.documents[1].text: contains U+0000 (NUL)" in str(caught.value)
    assert "(document 'inv-2')" in str(caught.value)
    assert await _counts(db) == (0, 0, 0, 0)


async def test_a_manifest_set_with_an_unstorable_batch_applies_nothing(db: asyncpg.Connection) -> None:
    """`lading run`: the quota, the pool and a good batch are in the same transaction as the bad
    batch; all of it rolls back."""
    loaded = manifests.load_text(
        """
apiVersion: lading.dev/v1alpha1
kind: TenantQuota
metadata: {name: acme}
spec: {namespaces: [acme]}
---
apiVersion: lading.dev/v1alpha1
kind: InferencePool
metadata: {name: builtin, namespace: lading-system}
spec: {provider: builtin}
---
apiVersion: lading.dev/v1alpha1
kind: ExtractionBatch
metadata: {name: good, namespace: acme}
spec:
  schema: invoice.v1
  inferencePoolRef: {name: builtin, namespace: lading-system}
  documents: [{key: inv-1, text: "Invoice 1"}]
""",
        source="set.yaml",
    )
    bad = manifests.Loaded(resource=_batch([("inv-1", "Invoice\x00 1")]), source="set.yaml", document=4)
    loaded = dataclasses.replace(loaded, extraction_batches=(*loaded.extraction_batches, bad))

    with pytest.raises(applying.AdmissionRejected) as caught:
        await applying.apply_manifests(db, loaded)

    assert caught.value.reason == "InvalidSpec"
    assert await _counts(db) == (0, 0, 0, 0)
    assert await db.fetchval("SELECT count(*) FROM tenants") == 0
    assert await db.fetchval("SELECT count(*) FROM pools") == 0
