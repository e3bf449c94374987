"""`lading run` with a batch given by manifest: the committed example, run from a copy, end to end."""

from __future__ import annotations

import asyncio
import json
import pathlib
import shutil
import subprocess
import sys

import asyncpg
import pytest

from lading_demo import generator
from tests.support import processes

ROOT = processes.ROOT
EXAMPLE = ROOT / "examples" / "large-batch"
MAKE_MANIFEST = ROOT / "hack" / "make_manifest.py"

pytestmark = pytest.mark.slow


def _run(*args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=timeout_s, env=processes.environment(),
        cwd=ROOT,
    )  # fmt: skip


def _lading(*args: str) -> subprocess.CompletedProcess[str]:
    return _run("-c", "from lading_cli.main import main; raise SystemExit(main())", *args)


def _copy_example(dest: pathlib.Path) -> pathlib.Path:
    """The README's recipe: copy the documents, write their manifest, point the batch at it."""
    shutil.copytree(EXAMPLE / "documents", dest / "documents")
    made = _run(str(MAKE_MANIFEST), str(dest / "documents"), "-o", str(dest / "manifest.jsonl"))
    assert made.returncode == 0, made.stderr
    batch = (EXAMPLE / "batch.yaml").read_text().replace("file:///data/acme/large-batch/", f"file://{dest}/")
    (dest / "batch.yaml").write_text(batch)
    return dest / "batch.yaml"


def test_the_committed_example_manifest_is_current() -> None:
    checked = _run(str(MAKE_MANIFEST), "--example", "--check")
    assert checked.returncode == 0, checked.stderr
    lines = [json.loads(line) for line in (EXAMPLE / "manifest.jsonl").read_text().splitlines()]
    assert [line["key"] for line in lines] == [s.key for s in generator.generate(8, seed=2026)]


async def test_lading_run_extracts_a_manifest_batch(
        db: asyncpg.Connection, database_url: str, tmp_path: pathlib.Path
) -> None:
    batch = _copy_example(tmp_path)
    done = await asyncio.to_thread(_lading, "run", str(batch), "--database-url", database_url, "--json")
    assert done.returncode == 0, done.stderr
    [summary] = json.loads(done.stdout)["batches"]
    assert summary["settled"] is True and summary["total"] == 8
    samples = generator.generate(8, seed=2026)
    states = {r["document_key"]: r["state"] for r in await db.fetch("SELECT document_key, state FROM extraction_jobs")}
    assert states == {s.key: s.expected_state for s in samples}
    stored = await db.fetch("SELECT text, uri FROM job_documents")
    assert all(r["text"] is None and r["uri"].startswith(f"file://{tmp_path}/documents/") for r in stored)


async def test_lading_run_refuses_a_manifest_with_a_bad_line_and_changes_nothing(
        db: asyncpg.Connection, database_url: str, tmp_path: pathlib.Path
) -> None:
    batch = _copy_example(tmp_path)
    lines = (tmp_path / "manifest.jsonl").read_text().splitlines()
    broken = json.loads(lines[5])
    broken["bytes"] = 0
    lines[5] = json.dumps(broken)
    (tmp_path / "manifest.jsonl").write_text("\n".join(lines) + "\n")
    done = await asyncio.to_thread(_lading, "run", str(batch), "--database-url", database_url)
    assert done.returncode == 2
    assert (
        "ExtractionBatch acme/march-invoices: spec.manifestUri: manifest line 6: bytes: must be greater than 0"
        in done.stderr
    )
    assert await db.fetchval("SELECT count(*) FROM extraction_jobs") == 0
    assert await db.fetchval("SELECT count(*) FROM tenants") == 0
