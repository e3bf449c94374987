"""
Single flight across real worker processes (docs/reuse.md): identical documents claimed at the
same time by two workers cause one model call each (counted at the stub model server); the
duplicates give their claims back, wait without spending an attempt, and take the result. And
`lading run --json` reports each batch's reused jobs.
"""

from __future__ import annotations

import asyncio
import json
import pathlib
import subprocess
import sys

import asyncpg
import pytest
import yaml

from lading import accepting
from lading.db import registry
from lading.ids import PoolName
from lading_demo import generator
from tests.support import factories, model_stub, processes, waiting

pytestmark = pytest.mark.slow

POOL = PoolName(factories.POOL)
API = "lading.dev/v1alpha1"
ARGS = ["--poll-interval", "0.1", "--concurrency", "8", "--claim-batch", "4"]


async def test_identical_documents_in_flight_at_once_cause_one_model_call(
        db: asyncpg.Connection, database_url: str, tmp_path: pathlib.Path
) -> None:
    clean = [s for s in generator.generate(20, seed=16) if s.expected_state == "SUCCEEDED"]
    texts = [clean[0].text] * 4 + [clean[1].text] * 3 + [clean[2].text]
    async with model_stub.running(model_stub.delayed(1.0, model_stub.extracting())) as stub:
        await factories.seed(db)
        await registry.upsert_pool(
            db, name=POOL, provider="openai-compatible", model="stub-model", spec={"endpoint": {"url": stub.url}}
        )
        request = factories.batch_request(name="dups", count=0)
        request = accepting.BatchRequest(**{
            **request.__dict__,
            "validation_policy": "invoice-strict-v2",
            "documents": [accepting.DocumentInput(key=f"doc-{i}", text=t) for i, t in enumerate(texts)],
        })  # fmt: skip
        await accepting.accept_batch(db, request)
        workers = [
            await processes.start_worker(database_url, POOL, args=ARGS, log=tmp_path / f"worker-{i}.log")
            for i in range(2)
        ]
        try:

            async def settled() -> bool:
                return await db.fetchval("SELECT count(*) FROM extraction_jobs WHERE state = 'SUCCEEDED'") == 8

            await waiting.until(settled, timeout_s=60)
        finally:
            for worker in workers:
                await processes.stop(worker)
        calls = sum(1 for r in stub.requests if r.path.endswith("/chat/completions"))
    assert calls == 3  # one per distinct document
    assert await db.fetchval("SELECT count(*) FROM extraction_jobs WHERE reused_from IS NOT NULL") == 5
    assert await db.fetchval("SELECT count(*) FROM job_attempts WHERE outcome = 'reused'") == 5
    # Waiting happened, and spent nothing: every job ends on its first counted attempt.
    assert await db.fetchval("SELECT count(*) FROM job_attempts WHERE outcome = 'deferred'") >= 1
    assert await db.fetchval("SELECT max(attempt) FROM extraction_jobs") == 1
    # A taken result is the one its source stored.
    assert await db.fetchval(
        "SELECT bool_and(r.result = s.result) FROM extraction_jobs j"
        "  JOIN results r ON r.job_id = j.id JOIN results s ON s.job_id = j.reused_from"
    )


def _manifest(texts: list[str]) -> str:
    """A tenant, a builtin pool and two batches of the same documents, as `lading run` reads them."""
    head = [
        {"apiVersion": API, "kind": "TenantQuota", "metadata": {"name": "acme"},
         "spec": {"namespaces": ["acme"]}},
        {"apiVersion": API, "kind": "InferencePool", "metadata": {"name": "builtin", "namespace": "acme"},
         "spec": {"provider": "builtin"}},
    ]  # fmt: skip
    batches = [
        {"apiVersion": API, "kind": "ExtractionBatch", "metadata": {"name": name, "namespace": "acme"},
         "spec": {"schema": "invoice.v1", "inferencePoolRef": {"name": "builtin"},
                  "documents": [{"key": f"doc-{i}", "text": t} for i, t in enumerate(texts)]}}
        for name in ("monday", "tuesday")
    ]  # fmt: skip
    return yaml.safe_dump_all(head + batches, allow_unicode=True)


async def test_lading_run_reports_the_reused_jobs_of_each_batch(
        db: asyncpg.Connection, database_url: str, tmp_path: pathlib.Path
) -> None:
    clean = [s for s in generator.generate(20, seed=16) if s.expected_state == "SUCCEEDED"][:3]
    path = tmp_path / "reuse.yaml"
    path.write_text(_manifest([s.text for s in clean]))
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", "from lading_cli.main import main; raise SystemExit(main())",
         "run", str(path), "--database-url", database_url, "--json", "--no-receiver"],
        capture_output=True, text=True, timeout=120, env=processes.environment(), cwd=processes.ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)["batches"]
    assert [b["counts"]["SUCCEEDED"] for b in summary] == [3, 3]
    # Each document was extracted once; its twin in the other batch took the result.
    assert sum(b["reused"] for b in summary) == 3
    assert await db.fetchval("SELECT count(*) FROM job_attempts WHERE outcome = 'ok'") == 3
