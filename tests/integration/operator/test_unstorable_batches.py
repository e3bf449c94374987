"""
An ExtractionBatch whose documents PostgreSQL refuses, through the operator (kopf running for
real, the Kubernetes emulator, real PostgreSQL): Admitted=False with reason InvalidSpec naming
the document, instead of a reconcile error retried with backoff for ever; a NUL in the spec
itself is refused by the CRD before the operator sees it.
"""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest
from lading_operator import kube

from tests.integration.operator import conftest
from tests.support import kube_emulator

BATCHES = "lading.dev/v1alpha1/extractionbatches"


def _admitted(obj: dict[str, Any]) -> dict[str, Any]:
    for cond in obj.get("status", {}).get("conditions", []):
        if cond["type"] == "Admitted":
            return dict(cond)
    return {}


async def test_a_batch_whose_documents_the_database_refuses_is_invalid_spec_and_admits_nothing(
    emulator: kube_emulator.KubeEmulator, api: kube.Client, db: asyncpg.Connection, operator: Any
) -> None:
    # Defence in depth: the models and the CRD refuse U+0000 first, so the refusal is made here by a
    # trigger raising the error PostgreSQL raises for it (SQLSTATE 22021) on one document.
    await db.execute(
        """CREATE FUNCTION refuse_document() RETURNS trigger LANGUAGE plpgsql AS $$
           BEGIN
             IF NEW.text LIKE 'Invoice INV-0002 %' THEN
               RAISE EXCEPTION 'invalid byte sequence' USING ERRCODE = 'character_not_in_repertoire';
             END IF;
             RETURN NEW;
           END $$;
           CREATE TRIGGER refuse_document BEFORE INSERT ON job_documents
              FOR EACH ROW EXECUTE FUNCTION refuse_document();"""
    )
    try:
        await conftest.create_quota(api, "acme", ["acme"])
        await conftest.create_pool(api, "acme", "builtin")
        await conftest.create_batch(api, "acme", "march", documents=4)

        pending = await kube_emulator.wait_for(
            emulator, BATCHES, "acme", "march", lambda o: _admitted(o).get("reason") == "InvalidSpec"
        )

        assert pending["status"]["phase"] == "Pending"
        condition = _admitted(pending)
        assert condition["status"] == "False"
        assert condition["message"].startswith("ExtractionBatch acme/march: ")
        assert "CharacterNotInRepertoireError, SQLSTATE 22021" in condition["message"]
        assert "nothing was accepted" in condition["message"]
        counts = await db.fetchrow(
            "SELECT (SELECT count(*) FROM batches) AS b, (SELECT count(*) FROM extraction_jobs) AS j,"
            " (SELECT count(*) FROM job_documents) AS d"
        )
        assert tuple(counts) == (0, 0, 0)
    finally:
        # The run's database outlives this test (its tables are emptied, its triggers stay): a later
        # test's INV-0002 must not be refused.
        await db.execute("DROP TRIGGER refuse_document ON job_documents; DROP FUNCTION refuse_document()")


async def test_the_crd_refuses_a_nul_in_a_document_text(api: kube.Client) -> None:
    body = conftest.batch_body("acme", "nul", documents=2)
    body["spec"]["documents"][1]["text"] = "Invoice\x00 2"
    with pytest.raises(kube.KubeError) as caught:
        await api.create(conftest.batch_path("acme"), body)
    assert "spec.documents.1.text" in str(caught.value), caught.value
