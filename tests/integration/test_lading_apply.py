"""`lading apply` as a user runs it (its `main`, output captured) against real PostgreSQL: all or nothing."""

from __future__ import annotations

import asyncio
import dataclasses
import pathlib

import asyncpg
import pytest
from lading_cli import main

DEFINITIONS = """\
apiVersion: lading.dev/v1alpha1
kind: TenantQuota
metadata: {name: acme}
spec: {namespaces: [acme], maxQueuedJobs: 100, maxInFlight: 4, allowedPriorities: [normal, low]}
---
apiVersion: lading.dev/v1alpha1
kind: InferencePool
metadata: {name: builtin, namespace: acme}
spec: {provider: builtin}
---
apiVersion: v1
kind: Secret
metadata: {name: erp-signing, namespace: acme}
stringData: {secret: whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw}
---
apiVersion: lading.dev/v1alpha1
kind: DeliveryEndpoint
metadata: {name: erp, namespace: acme}
spec: {url: "https://erp.acme.example/hook", secretRef: {name: erp-signing, key: secret}}
"""


def batch(name: str, *, priority: str = "normal", endpoint: str = "erp") -> str:
    return f"""\
apiVersion: lading.dev/v1alpha1
kind: ExtractionBatch
metadata: {{name: {name}, namespace: acme}}
spec:
  schema: invoice.v1
  inferencePoolRef: {{name: builtin}}
  deliveryEndpointRef: {{name: {endpoint}}}
  priority: {priority}
  documents: [{{key: inv-1, text: "Invoice 1"}}, {{key: inv-2, text: "Invoice 2"}}]
"""


@dataclasses.dataclass(frozen=True)
class Done:
    returncode: int
    stdout: str
    stderr: str


async def lading_apply(
        capsys: pytest.CaptureFixture[str], database_url: str, *args: str | pathlib.Path) -> Done:  # fmt: skip
    capsys.readouterr()
    code = await asyncio.to_thread(main.main, ["apply", *map(str, args), "--database-url", database_url])
    out, err = capsys.readouterr()
    return Done(code, out, err)


async def counts(db: asyncpg.Connection) -> tuple[int, int, int, int]:
    row = await db.fetchrow(
        "SELECT (SELECT count(*) FROM tenants), (SELECT count(*) FROM pools), (SELECT count(*) FROM endpoints), "
        "(SELECT count(*) FROM extraction_jobs)"
    )
    return tuple(row)


async def test_apply_writes_the_set_once_and_again_changes_nothing(
        db: asyncpg.Connection, database_url: str, tmp_path: pathlib.Path,
        capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    (tmp_path / "definitions.yaml").write_text(DEFINITIONS)
    (tmp_path / "batch.yaml").write_text(batch("march"))
    dry = await lading_apply(capsys, database_url, tmp_path / "definitions.yaml", tmp_path / "batch.yaml", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "extractionbatch acme/march admitted: 2 jobs (dry run: nothing was changed)" in dry.stdout
    assert await counts(db) == (0, 0, 0, 0)

    done = await lading_apply(capsys, database_url, tmp_path / "definitions.yaml", tmp_path / "batch.yaml")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "tenantquota/acme configured", "inferencepool acme/builtin configured", "deliveryendpoint acme/erp configured",
        "secret acme/erp-signing checked (never stored)", "extractionbatch acme/march admitted: 2 jobs",
    ]  # fmt: skip
    assert await counts(db) == (1, 1, 1, 2)
    assert "whsec_" not in str(await db.fetch("SELECT * FROM endpoints"))

    # A batch alone leans on what is in the database already; the first batch again is unchanged.
    (tmp_path / "april.yaml").write_text(batch("april"))
    again = await lading_apply(capsys, database_url, tmp_path / "batch.yaml", tmp_path / "april.yaml")
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines() == [
        "extractionbatch acme/march unchanged: 2 jobs (accepted before)", "extractionbatch acme/april admitted: 2 jobs",
    ]  # fmt: skip
    assert await counts(db) == (1, 1, 1, 4)


async def test_a_refused_batch_applies_nothing_and_names_file_document_and_field(
        db: asyncpg.Connection, database_url: str, tmp_path: pathlib.Path,
        capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    (tmp_path / "set.yaml").write_text(DEFINITIONS + "---\n" + batch("ok") + "---\n" + batch("urgent", priority="high"))
    refused = await lading_apply(capsys, database_url, tmp_path / "set.yaml")
    assert refused.returncode == 2
    assert (f"{tmp_path / 'set.yaml'}: document 6 (ExtractionBatch acme/urgent): spec.priority: TenantQuota acme "
            "does not allow priority high (allowedPriorities: normal, low) (PriorityNotAllowed)") in refused.stderr
    assert await counts(db) == (0, 0, 0, 0)

    (tmp_path / "lost.yaml").write_text(batch("lost", endpoint="nowhere"))
    (tmp_path / "bad.yaml").write_text(batch("bad").replace("priority: normal", "priority: urgent"))
    invalid = await lading_apply(capsys, database_url, tmp_path / "bad.yaml")
    assert invalid.returncode == 2
    assert f"{tmp_path / 'bad.yaml'}: document 1 (ExtractionBatch acme/bad): spec.priority:" in invalid.stderr
    missing = await lading_apply(capsys, database_url, tmp_path / "lost.yaml")
    assert missing.returncode == 2
    assert (f"{tmp_path / 'lost.yaml'}: document 1 (ExtractionBatch acme/lost): spec.deliveryEndpointRef: "
            "DeliveryEndpoint acme/nowhere is neither in the files nor in the database") in missing.stderr
    assert await counts(db) == (0, 0, 0, 0)
