"""`lading run` end to end, as a user runs it: a real process, real PostgreSQL, the sample set."""

from __future__ import annotations

import asyncio
import json
import pathlib
import socket
import subprocess
import sys
from typing import Any

import asyncpg
import pytest
import yaml

from tests.support import model_stub, processes

ROOT = processes.ROOT
QUICKSTART = ROOT / "examples" / "quickstart.yaml"
TRUTH = ROOT / "examples" / "invoices" / "truth.jsonl"

pytestmark = pytest.mark.slow


def _quickstart_documents() -> list[dict[str, Any]]:
    """The quickstart's documents, its webhook moved to a free port: concurrent runs never collide on 8787."""
    documents = list(yaml.safe_load_all(QUICKSTART.read_text()))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    for document in documents:
        if document["kind"] == "DeliveryEndpoint":
            document["spec"]["url"] = document["spec"]["url"].replace(":8787/", f":{port}/")
    return documents


def _quickstart(tmp_path: pathlib.Path) -> str:
    path = tmp_path / "quickstart.yaml"
    path.write_text(yaml.safe_dump_all(_quickstart_documents(), allow_unicode=True))
    return str(path)


def _lading(*args: str, timeout_s: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "from lading_cli.main import main; raise SystemExit(main())", *args],
        capture_output=True, text=True, timeout=timeout_s, env=processes.environment(), cwd=ROOT,
    )  # fmt: skip


async def test_the_sample_set_ends_in_the_states_its_ground_truth_expects(
        db: asyncpg.Connection, database_url: str, tmp_path: pathlib.Path
) -> None:
    done = await asyncio.to_thread(_lading, "run", _quickstart(tmp_path), "--database-url", database_url, "--json")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    [batch] = summary["batches"]
    truth = [json.loads(line) for line in TRUTH.read_text().splitlines()]
    expected: dict[str, int] = {}
    for sample in truth:
        expected[sample["expected_state"]] = expected.get(sample["expected_state"], 0) + 1
    assert {k: v for k, v in batch["counts"].items() if v} == expected
    assert batch["settled"] is True and batch["total"] == len(truth) >= 200
    # Every success was delivered, signed, to the reference receiver `lading run` served, which booked it.
    assert batch["delivered"] == batch["counts"]["SUCCEEDED"] == expected["SUCCEEDED"]
    assert await db.fetchval("SELECT count(*) FROM erp_inbox WHERE status = 'accepted'") == expected["SUCCEEDED"]
    assert batch["started_at"].endswith("Z") and batch["completed_at"] >= batch["started_at"]

    states = {r["document_key"]: r["state"] for r in await db.fetch("SELECT document_key, state FROM extraction_jobs")}
    assert states == {s["key"]: s["expected_state"] for s in truth}
    # Every succeeded document's extraction equals its ground truth, field by field.
    results = {
        r["document_key"]: r["result"]
        for r in await db.fetch(
            "SELECT j.document_key, r.result FROM results r JOIN extraction_jobs j ON j.id = r.job_id"
            " WHERE j.state = 'SUCCEEDED'"
        )
    }
    for sample in truth:
        if sample["expected_state"] == "SUCCEEDED":
            got = {k: v for k, v in results[sample["key"]].items() if k != "evidence"}
            want = {k: v for k, v in sample["truth"].items() if k != "evidence"}
            assert got == want, sample["key"]


async def test_running_the_same_manifests_again_accepts_nothing_new(
        db: asyncpg.Connection, database_url: str, tmp_path: pathlib.Path
) -> None:
    quickstart = _quickstart(tmp_path)
    first = await asyncio.to_thread(_lading, "run", quickstart, "--database-url", database_url, "--json")
    assert first.returncode == 0, first.stderr
    jobs_before = await db.fetchval("SELECT count(*) FROM extraction_jobs")
    attempts_before = await db.fetchval("SELECT count(*) FROM job_attempts")
    again = await asyncio.to_thread(_lading, "run", quickstart, "--database-url", database_url, "--json")
    assert again.returncode == 0, again.stderr
    assert await db.fetchval("SELECT count(*) FROM extraction_jobs") == jobs_before
    assert await db.fetchval("SELECT count(*) FROM job_attempts") == attempts_before
    assert json.loads(again.stdout)["batches"][0]["counts"] == json.loads(first.stdout)["batches"][0]["counts"]


BROKEN = """\
apiVersion: lading.dev/v1alpha1
kind: TenantQuota
metadata: {name: acme}
spec: {namespaces: [acme]}
---
apiVersion: lading.dev/v1alpha1
kind: InferencePool
metadata: {name: builtin, namespace: acme}
spec:
  provider: builtin
  workers: {minReplicas: 3, maxReplicas: 1}
---
apiVersion: lading.dev/v1alpha1
kind: ExtractionBatch
metadata: {name: b, namespace: acme}
spec:
  schema: invoice.v1
  inferencePoolRef: {name: builtin}
  documents:
    - {key: a, text: "Invoice"}
    - {key: a, text: "Invoice again"}
"""


async def test_bad_manifests_are_rejected_with_file_document_and_field_and_nothing_is_applied(
        db: asyncpg.Connection, database_url: str, tmp_path: pathlib.Path
) -> None:
    manifest = tmp_path / "broken.yaml"
    manifest.write_text(BROKEN)
    done = await asyncio.to_thread(_lading, "run", str(manifest), "--database-url", database_url)
    assert done.returncode == 2
    assert f"{manifest}: document 2 (InferencePool acme/builtin): spec.workers.maxReplicas" in done.stderr
    assert f"{manifest}: document 3 (ExtractionBatch acme/b): spec.documents" in done.stderr
    assert await db.fetchval("SELECT count(*) FROM tenants") == 0
    assert await db.fetchval("SELECT count(*) FROM batches") == 0


async def test_a_run_that_cannot_finish_in_time_exits_non_zero(
        db: asyncpg.Connection, database_url: str, tmp_path: pathlib.Path
) -> None:
    documents = _quickstart_documents()
    [pool] = [d for d in documents if d["kind"] == "InferencePool"]
    pool["spec"]["builtin"] = {"latencyMs": 600000}  # the model never answers in time
    manifest = tmp_path / "slow.yaml"
    manifest.write_text(yaml.safe_dump_all(documents))
    done = await asyncio.to_thread(
        _lading, "run", str(manifest), "--database-url", database_url, "--timeout", "2", "--json"
    )
    assert done.returncode == 1
    assert "not settled within 2 s" in done.stderr
    assert json.loads(done.stdout)["batches"][0]["settled"] is False


async def test_a_pool_on_an_openai_compatible_endpoint_runs_with_the_key_from_its_secret(
        db: asyncpg.Connection, database_url: str, tmp_path: pathlib.Path
) -> None:
    documents = _quickstart_documents()
    [pool] = [d for d in documents if d["kind"] == "InferencePool"]
    [batch] = [d for d in documents if d["kind"] == "ExtractionBatch"]
    batch["spec"]["documents"] = batch["spec"]["documents"][:10]
    async with model_stub.running(model_stub.extracting()) as stub:
        pool["spec"] = {
            "provider": "openai-compatible",
            "model": "qwen",
            "endpoint": {"url": stub.url, "apiKeySecretRef": {"name": "model-key", "key": "apiKey"}},
        }
        secret = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "model-key", "namespace": pool["metadata"]["namespace"]},
            "stringData": {"apiKey": "sk-from-secret"},
        }
        manifest = tmp_path / "openai.yaml"
        manifest.write_text(yaml.safe_dump_all([*documents, secret]))
        done = await asyncio.to_thread(_lading, "run", str(manifest), "--database-url", database_url, "--json")
    assert done.returncode == 0, done.stderr
    [summary] = json.loads(done.stdout)["batches"]
    assert summary["settled"] and summary["total"] == 10
    assert len(stub.requests) >= 10
    assert {r.headers["Authorization"] for r in stub.requests} == {"Bearer sk-from-secret"}
    assert "sk-from-secret" not in done.stdout + done.stderr


async def test_deliveries_to_an_endpoint_that_is_not_on_this_machine_are_refused_by_the_egress_policy(
        db: asyncpg.Connection, database_url: str, tmp_path: pathlib.Path
) -> None:
    documents = _quickstart_documents()
    [endpoint] = [d for d in documents if d["kind"] == "DeliveryEndpoint"]
    [batch] = [d for d in documents if d["kind"] == "ExtractionBatch"]
    batch["spec"]["documents"] = batch["spec"]["documents"][:5]
    endpoint["spec"]["url"] = "http://10.255.255.1:8787/webhooks/lading"  # private: refused, never connected
    manifest = tmp_path / "private.yaml"
    manifest.write_text(yaml.safe_dump_all(documents))
    done = await asyncio.to_thread(_lading, "run", str(manifest), "--database-url", database_url, "--json")
    assert done.returncode == 0, done.stderr
    [summary] = json.loads(done.stdout)["batches"]
    assert summary["delivered"] == 0 and summary["counts"]["SUCCEEDED"] > 0
    errors = await db.fetch("SELECT DISTINCT state, last_error_class FROM deliveries")
    assert [tuple(r) for r in errors] == [("FAILED_TERMINAL", "EgressRefused")]
    assert "whsec_" not in done.stdout + done.stderr
