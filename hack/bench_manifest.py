"""
The `accept-manifest` benchmark: admission of a batch given by a 100,000-line JSON-lines manifest
(file://), through the same path as the operator and `lading run` (`applying.spool_manifest`, then
`applying.admit_batch`).

Measured, per batch (median of 3, each under a new batch name):
- read: streaming the manifest from disk, validating every line, spooling it to a local CSV;
- accept: the acceptance transaction (COPY into the staging table, the batch hash over the
  key-sorted (key, sha256) pairs, the same pass finding any repeated key, the job and document
  INSERT ... SELECT, the accepted event);
- total jobs/s = lines / (read + accept);
- re-admission of the last batch (the idempotent path: read, stage, hash, find the batch);
- CPU of each phase (median): this process's, and the acceptance's PostgreSQL backend's
  (utime + stime from /proc), which do not depend on what else runs on the machine.

Target: 25,000 jobs/s end to end (a million-document batch admitted in 40 s).
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import statistics
import tempfile
import time
from typing import Any

import asyncpg

from lading import applying
from lading.db import pool as dbpool
from lading.models import specs
from lading.settings import DocumentSettings

LINES = 100_000
REPETITIONS = 3
TARGET_JOBS_PER_S = 25_000
NAMESPACE = "bench"
POOL = {"name": "bench", "namespace": "lading-system"}


def write_manifest(path: pathlib.Path, count: int) -> None:
    """`count` lines naming documents under /data/bench (admission never reads the documents)."""
    with path.open("w") as out:
        for i in range(count):
            text = f"Invoice INV-{i:07d} total {i % 9973}.{i % 100:02d} EUR\n".encode()
            line = {
                "key": f"march/inv-{i:07d}",
                "uri": f"file:///data/bench/march/inv-{i:07d}.txt",
                "sha256": hashlib.sha256(text).hexdigest(),
                "bytes": len(text),
            }
            out.write(json.dumps(line) + "\n")


def batch(name: str, uri: str) -> specs.ExtractionBatch:
    return specs.ExtractionBatch.model_validate(
        {
            "apiVersion": specs.API_VERSION,
            "kind": "ExtractionBatch",
            "metadata": {"name": name, "namespace": NAMESPACE, "uid": f"uid-{name}"},
            "spec": {"schema": "invoice.v1", "inferencePoolRef": POOL, "manifestUri": uri},
        }
    )


CPU: dict[str, list[float]] = {"read_python": [], "accept_python": [], "accept_postgres": []}
"""CPU seconds of each admission's phases (the new batches'), filled by _admit."""


def _backend_cpu_s(pid: int) -> float:
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _admit(
        conn: asyncpg.Connection, resource: specs.ExtractionBatch, settings: DocumentSettings
) -> tuple[float, float, applying.AppliedBatch]:
    backend = int(await conn.fetchval("SELECT pg_backend_pid()"))
    started, cpu = time.perf_counter(), time.process_time()
    async with applying.spool_manifest(resource, documents=settings) as spooled:
        read_s, read_cpu = time.perf_counter() - started, time.process_time() - cpu
        started, cpu, pg = time.perf_counter(), time.process_time(), _backend_cpu_s(backend)
        applied = await applying.admit_batch(conn, resource, manifest=spooled, documents=settings)
        accept_s = time.perf_counter() - started
        if applied.result.created:
            CPU["read_python"].append(read_cpu)
            CPU["accept_python"].append(time.process_time() - cpu)
            CPU["accept_postgres"].append(_backend_cpu_s(backend) - pg)
    return read_s, accept_s, applied


async def bench_accept_manifest(url: str) -> tuple[dict[str, Any], dict[str, Any], bool]:
    with tempfile.TemporaryDirectory(prefix="lading-bench-manifest-") as directory:
        path = pathlib.Path(directory) / NAMESPACE / "manifest.jsonl"  # a root holds a directory per namespace
        path.parent.mkdir()
        write_manifest(path, LINES)
        size = path.stat().st_size
        settings = DocumentSettings(roots=(directory,))
        conn = await dbpool.connect(url)
        try:
            reads, accepts = [], []
            for rep in range(REPETITIONS):
                read_s, accept_s, applied = await _admit(conn, batch(f"manifest-{rep}", path.as_uri()), settings)
                if not applied.result.created or len(applied.result.job_ids) != LINES:
                    raise RuntimeError(f"batch manifest-{rep} was not admitted as new")
                reads.append(read_s)
                accepts.append(accept_s)
            read_s, accept_s, again = await _admit(conn, batch(f"manifest-{REPETITIONS - 1}", path.as_uri()), settings)
            if again.result.created:
                raise RuntimeError("re-admission of the same manifest inserted something")
            jobs = await conn.fetchval("SELECT count(*) FROM extraction_jobs")
            documents = await conn.fetchval("SELECT count(*) FROM job_documents WHERE uri IS NOT NULL")
        finally:
            await conn.close()
    totals = [r + a for r, a in zip(reads, accepts, strict=True)]
    results = {
        "lines_per_manifest": LINES,
        "manifest_bytes": size,
        "repetitions": REPETITIONS,
        "jobs_per_s_median": round(LINES / statistics.median(totals), 1),
        "read_ms_median": round(statistics.median(reads) * 1000, 1),
        "accept_ms_median": round(statistics.median(accepts) * 1000, 1),
        "cpu_ms_median": {phase: round(statistics.median(values) * 1000) for phase, values in CPU.items() if values},
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "total_ms_all": [round(t * 1000, 1) for t in totals],
        "readmit_ms": round((read_s + accept_s) * 1000, 1),
        "job_rows": jobs,
        "document_rows_by_uri": documents,
    }
    targets = {"jobs_per_s_median_min": TARGET_JOBS_PER_S}
    passed = results["jobs_per_s_median"] >= TARGET_JOBS_PER_S and jobs == documents == LINES * REPETITIONS
    return results, targets, passed
