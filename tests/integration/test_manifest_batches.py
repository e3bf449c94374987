"""
Large batches by manifest: admission streams a JSON-lines manifest (file:// or http://) into one
acceptance transaction, and real workers fetch, verify and extract the documents by URI.
"""

from __future__ import annotations

import hashlib
import json
import pathlib
import tracemalloc
from collections.abc import Sequence

import asyncpg
import pytest
from lading_worker import running

from lading import accepting, applying, errors, metrics
from lading.documents import manifest_lines
from lading.jobs import hashing
from lading.models import specs
from lading.settings import (
    AttemptSettings,
    ClaimerSettings,
    DocumentSettings,
    LeaseSettings,
    ReaperSettings,
    WorkerProcessSettings,
)
from lading_demo import generator
from tests.support import factories, fileserver, waiting

MODEL_POLICY = {"pool": factories.POOL, "provider": "builtin", "model": "lading-builtin"}
LOOPBACK = DocumentSettings(egress_allow=("127.0.0.0/8",))
"""The test servers listen on 127.0.0.1, which the default egress policy refuses."""


@pytest.fixture(autouse=True)
def tenant_directory(tmp_path: pathlib.Path) -> pathlib.Path:
    """`tmp_path` is the document root; the batches here are namespace acme's, so read beneath acme/."""
    (tmp_path / "acme").mkdir()
    return tmp_path / "acme"


def batch(uri: str, *, name: str = "big", uid: str = "uid-big") -> specs.ExtractionBatch:
    return specs.ExtractionBatch.model_validate(
        {
            "apiVersion": "lading.dev/v1alpha1",
            "kind": "ExtractionBatch",
            "metadata": {"name": name, "namespace": "acme", "uid": uid},
            "spec": {
                "schema": "invoice.v1",
                "inferencePoolRef": {"name": "builtin", "namespace": "lading-system"},
                "manifestUri": uri,
            },
        }
    )


def manifest_line(key: str, uri: str, data: bytes) -> bytes:
    return json.dumps({"key": key, "uri": uri, "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}).encode()


def synthetic_manifest(path: pathlib.Path, count: int, *, padding: int = 0) -> list[bytes]:
    """`count` lines naming documents that need not exist (admission never reads them)."""
    lines = [
        manifest_line(f"doc-{i:06d}", f"file:///data/{'p' * padding}/doc-{i:06d}.txt", f"document {i}".encode())
        for i in range(count)
    ]
    path.write_bytes(b"\n".join(lines) + b"\n")
    return lines


def write_documents(root: pathlib.Path, documents: Sequence[tuple[str, str]]) -> str:
    """Document files under `root` and a manifest listing them; returns the manifest's URI."""
    lines = []
    for key, text in documents:
        data = text.encode()
        path = root / f"{key}.txt"
        path.write_bytes(data)
        lines.append(manifest_line(key, path.as_uri(), data))
    manifest = root / "manifest.jsonl"
    manifest.write_bytes(b"\n".join(lines) + b"\n")
    return manifest.as_uri()


async def counts(db: asyncpg.Connection) -> tuple[int, int, int, int]:
    row = await db.fetchrow(
        "SELECT (SELECT count(*) FROM batches) AS b, (SELECT count(*) FROM extraction_jobs) AS j,"
        " (SELECT count(*) FROM job_documents) AS d, (SELECT count(*) FROM outbox_events) AS o"
    )
    assert row is not None
    return row["b"], row["j"], row["d"], row["o"]


async def test_a_10000_document_manifest_is_admitted_in_one_transaction_with_bounded_memory(
        db: asyncpg.Connection, tmp_path: pathlib.Path
) -> None:
    await factories.seed(db)
    # Long URIs: the manifest is ~12 MB, so holding it (or its lines as objects) would show.
    lines = synthetic_manifest(tmp_path / "acme" / "m.jsonl", 10_000, padding=1000)
    size = (tmp_path / "acme" / "m.jsonl").stat().st_size
    assert size > 11_000_000
    settings = DocumentSettings(roots=(str(tmp_path),))
    tracemalloc.start()
    try:
        applied = await applying.admit_batch(db, batch((tmp_path / "acme" / "m.jsonl").as_uri()), documents=settings)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < size / 4, f"admission held {peak} bytes for a {size}-byte manifest"
    assert applied.result.created and len(applied.result.job_ids) == 10_000
    batches_, jobs_, documents_, events = await counts(db)
    assert (batches_, jobs_, documents_) == (1, 10_000, 10_000)
    assert events >= 1
    assert await db.fetchval("SELECT count(*) FROM job_documents WHERE text IS NULL AND uri IS NOT NULL") == 10_000
    # Manifest order is job order; every job's hashes are those of an inline document with that digest.
    rows = await db.fetch(
        "SELECT j.ordinal, j.document_key, j.content_sha256, j.request_hash, d.uri, d.sha256, d.bytes"
        " FROM extraction_jobs j JOIN job_documents d ON d.job_id = j.id ORDER BY j.id"
    )
    assert [r["ordinal"] for r in rows] == list(range(10_000))
    first = json.loads(lines[0])
    assert (rows[0]["document_key"], rows[0]["uri"], rows[0]["sha256"], rows[0]["bytes"]) == (
        first["key"], first["uri"], first["sha256"], first["bytes"]
    )
    for row in (rows[0], rows[4321], rows[-1]):
        assert row["request_hash"] == hashing.job_request_hash(
            content_sha256=row["content_sha256"], schema="invoice.v1", model_policy=MODEL_POLICY,
            validation_policy=specs.VALIDATION_POLICY_DEFAULT,
        )  # fmt: skip


async def test_a_bad_line_near_the_end_admits_nothing(db: asyncpg.Connection, tmp_path: pathlib.Path) -> None:
    await factories.seed(db)
    lines = synthetic_manifest(tmp_path / "acme" / "m.jsonl", 10_000)
    bad = json.loads(lines[9_998])
    bad["sha256"] = bad["sha256"].upper()
    lines[9_998] = json.dumps(bad).encode()
    (tmp_path / "acme" / "m.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    with pytest.raises(applying.InvalidManifest) as caught:
        await applying.admit_batch(
            db, batch((tmp_path / "acme" / "m.jsonl").as_uri()), documents=DocumentSettings(roots=(str(tmp_path),))
        )
    assert caught.value.reason == "InvalidManifest"
    assert caught.value.line == 9_999
    assert str(caught.value) == (
        "ExtractionBatch acme/big: spec.manifestUri: manifest line 9999: sha256: must be 64 lowercase hex characters"
    )
    assert await counts(db) == (0, 0, 0, 0)


async def test_a_bad_last_line_without_a_final_newline_admits_nothing(
        db: asyncpg.Connection, tmp_path: pathlib.Path
) -> None:
    await factories.seed(db)
    lines = synthetic_manifest(tmp_path / "acme" / "m.jsonl", 10_000)
    lines[-1] = lines[-1].replace(b'"bytes": ', b'"bytes": -')
    (tmp_path / "acme" / "m.jsonl").write_bytes(b"\n".join(lines))
    with pytest.raises(applying.InvalidManifest) as caught:
        await applying.admit_batch(
            db, batch((tmp_path / "acme" / "m.jsonl").as_uri()), documents=DocumentSettings(roots=(str(tmp_path),))
        )
    assert caught.value.line == 10_000
    assert str(caught.value).startswith(
        "ExtractionBatch acme/big: spec.manifestUri: manifest line 10000: bytes: must be greater than 0"
    )
    assert await counts(db) == (0, 0, 0, 0)


async def test_a_duplicate_key_admits_nothing_and_names_both_lines(
        db: asyncpg.Connection, tmp_path: pathlib.Path
) -> None:
    await factories.seed(db)
    lines = synthetic_manifest(tmp_path / "acme" / "m.jsonl", 500)
    lines.append(lines[41])
    (tmp_path / "acme" / "m.jsonl").write_bytes(b"\n".join(lines))  # no final newline: still a line
    with pytest.raises(applying.InvalidManifest, match=r"manifest line 501: key: 'doc-000041' is already listed on "
                                                      r"line 42; keys must be unique"):
        await applying.admit_batch(
            db, batch((tmp_path / "acme" / "m.jsonl").as_uri()), documents=DocumentSettings(roots=(str(tmp_path),))
        )
    assert await counts(db) == (0, 0, 0, 0)


async def test_of_several_duplicate_keys_the_one_repeated_first_is_named(
        db: asyncpg.Connection, tmp_path: pathlib.Path
) -> None:
    """Named by the line of its repetition, not by the key's place in key order (the order the
    hash finds repetitions in)."""
    await factories.seed(db)
    lines = synthetic_manifest(tmp_path / "acme" / "m.jsonl", 500)
    lines += [lines[300], lines[41], lines[300]]
    (tmp_path / "acme" / "m.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    with pytest.raises(applying.InvalidManifest, match=r"manifest line 501: key: 'doc-000300' is already listed on "
                                                      r"line 301; keys must be unique"):
        await applying.admit_batch(
            db, batch((tmp_path / "acme" / "m.jsonl").as_uri()), documents=DocumentSettings(roots=(str(tmp_path),))
        )
    assert await counts(db) == (0, 0, 0, 0)


async def test_readmission_is_idempotent_and_a_changed_manifest_conflicts(
        db: asyncpg.Connection, tmp_path: pathlib.Path
) -> None:
    await factories.seed(db)
    lines = synthetic_manifest(tmp_path / "acme" / "m.jsonl", 300)
    settings = DocumentSettings(roots=(str(tmp_path),))
    uri = (tmp_path / "acme" / "m.jsonl").as_uri()
    first = await applying.admit_batch(db, batch(uri), documents=settings)
    again = await applying.admit_batch(db, batch(uri), documents=settings)
    assert first.result.created and not again.result.created
    assert again.result.job_ids == first.result.job_ids and again.result.batch_id == first.result.batch_id
    assert (await counts(db))[:3] == (1, 300, 300)

    (tmp_path / "acme" / "m.jsonl").write_bytes(b"\n".join(lines[:-1]) + b"\n")
    with pytest.raises(errors.IdempotencyConflict):
        await applying.admit_batch(db, batch(uri), documents=settings)
    assert (await counts(db))[:3] == (1, 300, 300)


async def test_the_same_documents_hash_the_same_inline_and_by_manifest(
        db: asyncpg.Connection, tmp_path: pathlib.Path
) -> None:
    await factories.seed(db)
    texts = [(f"doc-{i:03d}", f"Rechnung {i} - Summe {i},00 €") for i in (3, 1, 2, 10)]
    uri = write_documents(tmp_path / "acme", texts)
    await applying.admit_batch(db, batch(uri, name="by-manifest"), documents=DocumentSettings(roots=(str(tmp_path),)))
    inline = specs.ExtractionBatch.model_validate(
        {
            **batch(uri).model_dump(by_alias=True, exclude_none=True),
            "metadata": {"name": "inline", "namespace": "acme", "uid": "uid-inline"},
            "spec": {
                "schema": "invoice.v1",
                "inferencePoolRef": {"name": "builtin", "namespace": "lading-system"},
                "documents": [{"key": k, "text": t} for k, t in texts],
            },
        }
    )
    await applying.admit_batch(db, inline)
    hashes = {r["name"]: r["request_hash"] for r in await db.fetch("SELECT name, request_hash FROM batches")}
    assert hashes["inline"] == hashes["by-manifest"]
    job_hashes = await db.fetch(
        "SELECT b.name, j.document_key, j.request_hash FROM extraction_jobs j JOIN batches b ON b.id = j.batch_id"
    )
    by_key: dict[str, set[str]] = {}
    for row in job_hashes:
        by_key.setdefault(row["document_key"], set()).add(row["request_hash"])
    assert all(len(found) == 1 for found in by_key.values()) and len(by_key) == 4


async def test_an_http_manifest_is_admitted_and_an_unreachable_one_is_temporary(
        db: asyncpg.Connection, tmp_path: pathlib.Path
) -> None:
    await factories.seed(db)
    synthetic_manifest(tmp_path / "acme" / "m.jsonl", 2_000)
    async with fileserver.running() as server:
        server.files["/batches/m.jsonl"] = (tmp_path / "acme" / "m.jsonl").read_bytes()
        server.failures["/batches/m.jsonl"].append(503)
        with pytest.raises(manifest_lines.ManifestUnavailable, match="HTTP 503") as caught:
            await applying.admit_batch(db, batch(server.url("/batches/m.jsonl")), documents=LOOPBACK)
        assert isinstance(caught.value, errors.TemporaryError) and caught.value.reason == "ManifestUnavailable"
        assert await counts(db) == (0, 0, 0, 0)
        applied = await applying.admit_batch(db, batch(server.url("/batches/m.jsonl")), documents=LOOPBACK)
        assert len(applied.result.job_ids) == 2_000
        with pytest.raises(applying.InvalidManifest, match="HTTP 403"):
            server.failures["/other.jsonl"].append(403)
            await applying.admit_batch(
                db, batch(server.url("/other.jsonl"), name="other", uid="uid-o"), documents=LOOPBACK
            )
        server.redirects["/moved.jsonl"] = "file:///etc/passwd"
        with pytest.raises(applying.InvalidManifest, match="redirect to a non-http"):
            await applying.admit_batch(db, batch(server.url("/moved.jsonl"), name="m", uid="uid-m"), documents=LOOPBACK)
        server.redirects["/elsewhere.jsonl"] = "/batches/m.jsonl"
        moved = await applying.admit_batch(
            db, batch(server.url("/elsewhere.jsonl"), name="moved", uid="uid-moved"), documents=LOOPBACK
        )
        assert len(moved.result.job_ids) == 2_000
        # Without an allowance, the egress policy refuses loopback before any request is sent.
        requests = sum(server.requests.values())
        with pytest.raises(applying.InvalidManifest, match="refused: a loopback address"):
            await applying.admit_batch(db, batch(server.url("/batches/m.jsonl"), name="ssrf", uid="uid-s"))
        assert sum(server.requests.values()) == requests
    port = fileserver.unused_port()
    with pytest.raises(manifest_lines.ManifestUnavailable, match="ClientConnectorError"):
        await applying.admit_batch(
            db, batch(f"http://127.0.0.1:{port}/m.jsonl", name="gone", uid="uid-gone"), documents=LOOPBACK
        )


async def test_a_file_manifest_outside_the_document_roots_is_refused(
        db: asyncpg.Connection, tmp_path: pathlib.Path
) -> None:
    await factories.seed(db)
    synthetic_manifest(tmp_path / "acme" / "m.jsonl", 10)
    (tmp_path / "roots").mkdir()
    with pytest.raises(applying.InvalidManifest, match="outside the document directories of namespace acme"):
        await applying.admit_batch(
            db, batch((tmp_path / "acme" / "m.jsonl").as_uri()),
            documents=DocumentSettings(roots=(str(tmp_path / "roots"),)),
        )
    with pytest.raises(applying.InvalidManifest, match="no document roots are configured"):
        await applying.admit_batch(db, batch((tmp_path / "acme" / "m.jsonl").as_uri()))
    assert await counts(db) == (0, 0, 0, 0)


# --- Workers


def worker_settings(*roots: pathlib.Path, egress_allow: tuple[str, ...] = ()) -> WorkerProcessSettings:
    return WorkerProcessSettings(
        pool=factories.POOL,
        lease=LeaseSettings(ttl_s=10, heartbeat_interval_s=0.05),
        claimer=ClaimerSettings(concurrency=8, batch_size=8, poll_interval_s=0.05),
        reaper=ReaperSettings(interval_s=0.05),
        attempt=AttemptSettings(backoff_base_s=0.01, backoff_cap_s=0.02, timeout_s=5),
        documents=DocumentSettings(
            roots=tuple(str(r) for r in roots), fetch_timeout_s=5, egress_allow=egress_allow
        ),
        shutdown_grace_s=5.0,
    )


async def settled(db: asyncpg.Connection, n: int) -> bool:
    done: int = await db.fetchval(
        "SELECT count(*) FROM extraction_jobs WHERE state IN ('SUCCEEDED','FAILED_TERMINAL','REVIEW_REQUIRED')"
    )
    return done == n


async def states(db: asyncpg.Connection) -> dict[str, tuple[str, str | None]]:
    rows = await db.fetch("SELECT document_key, state, last_error_class FROM extraction_jobs")
    return {r["document_key"]: (r["state"], r["last_error_class"]) for r in rows}


async def test_workers_fetch_verify_and_extract_documents_given_by_uri(
        db: asyncpg.Connection, dbpool: asyncpg.Pool, tmp_path: pathlib.Path
) -> None:
    await factories.seed(db)
    samples = generator.generate(40, seed=7)
    uri = write_documents(tmp_path / "acme", [(s.key, s.text) for s in samples])
    await applying.admit_batch(db, batch(uri), documents=DocumentSettings(roots=(str(tmp_path),)))
    worker = running.Worker(dbpool, settings=worker_settings(tmp_path))
    async with waiting.running(worker.run):
        await waiting.until(lambda: settled(db, 40), timeout_s=60)
    assert {key: state for key, (state, _) in (await states(db)).items()} == {s.key: s.expected_state for s in samples}
    results = await db.fetch(
        "SELECT j.document_key, r.result FROM results r JOIN extraction_jobs j ON j.id = r.job_id"
        " WHERE j.state = 'SUCCEEDED'"
    )
    truth = {s.key: s.truth for s in samples}
    assert results
    for row in results:
        got = {k: v for k, v in row["result"].items() if k != "evidence"}
        want = {k: v for k, v in (truth[row["document_key"]] or {}).items() if k != "evidence"}
        assert got == want, row["document_key"]


async def test_a_tampered_document_fails_terminally_with_a_digest_mismatch(
        db: asyncpg.Connection, dbpool: asyncpg.Pool, tmp_path: pathlib.Path
) -> None:
    await factories.seed(db)
    samples = generator.generate(3, seed=11)
    uri = write_documents(tmp_path / "acme", [(s.key, s.text) for s in samples])
    await applying.admit_batch(db, batch(uri), documents=DocumentSettings(roots=(str(tmp_path),)))
    tampered = tmp_path / "acme" / f"{samples[1].key}.txt"
    original = tampered.read_bytes()
    tampered.write_bytes(original.replace(b"1", b"7", 1) if b"1" in original else b"X" + original[1:])
    labels = {"pool": factories.POOL, "result": "DOCUMENT_DIGEST_MISMATCH"}
    mismatches_before = metrics.REGISTRY.get_sample_value("lading_document_fetches_total", labels) or 0.0
    worker = running.Worker(dbpool, settings=worker_settings(tmp_path))
    async with waiting.running(worker.run):
        await waiting.until(lambda: settled(db, 3), timeout_s=30)
    assert metrics.REGISTRY.get_sample_value("lading_document_fetches_total", labels) == mismatches_before + 1
    state, error_class = (await states(db))[samples[1].key]
    assert (state, error_class) == ("FAILED_TERMINAL", "DOCUMENT_DIGEST_MISMATCH")
    attempt = await db.fetchrow(
        "SELECT a.outcome, a.error, a.tokens_in FROM job_attempts a JOIN extraction_jobs j ON j.id = a.job_id"
        " WHERE j.document_key = $1",
        samples[1].key,
    )
    assert attempt is not None and attempt["outcome"] == "terminal"
    assert "does not match the manifest's sha256" in attempt["error"]
    assert attempt["tokens_in"] is None  # the model was not called
    found = await states(db)
    assert all(found[s.key][0] == s.expected_state for i, s in enumerate(samples) if i != 1)


async def test_a_document_outside_the_batch_namespace_directory_is_refused(
        db: asyncpg.Connection, dbpool: asyncpg.Pool, tmp_path: pathlib.Path
) -> None:
    """Another tenant's file with its valid digest, a link to it, a directory link in the middle
    of the path, '..': a batch of acme reads none of them, and the errors say nothing of them."""
    await factories.seed(db)
    (tmp_path / "outside").mkdir()
    secret = tmp_path / "outside" / "secret.txt"
    secret.write_bytes(b"not for tenants")
    root = tmp_path / "shared"
    (root / "acme").mkdir(parents=True)
    (root / "globex").mkdir()
    theirs = root / "globex" / "invoice.txt"
    theirs.write_bytes(b"globex invoice 4711, not for acme")
    (root / "acme" / "escape.txt").symlink_to(secret)
    (root / "acme" / "neighbour").symlink_to(root / "globex", target_is_directory=True)
    lines = [
        manifest_line("direct", secret.as_uri(), b"not for tenants"),
        manifest_line("via-symlink", (root / "acme" / "escape.txt").as_uri(), b"not for tenants"),
        manifest_line("dotdot", f"file://{root}/acme/../globex/invoice.txt", theirs.read_bytes()),
        manifest_line("other-tenant", theirs.as_uri(), theirs.read_bytes()),
        manifest_line("dir-link", (root / "acme" / "neighbour" / "invoice.txt").as_uri(), theirs.read_bytes()),
    ]
    (root / "acme" / "m.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    await applying.admit_batch(
        db, batch((root / "acme" / "m.jsonl").as_uri()), documents=DocumentSettings(roots=(str(root),))
    )
    worker = running.Worker(dbpool, settings=worker_settings(root))
    async with waiting.running(worker.run):
        await waiting.until(lambda: settled(db, 5), timeout_s=30)
    assert await states(db) == {
        key: ("FAILED_TERMINAL", "DOCUMENT_REFUSED")
        for key in ("direct", "via-symlink", "dotdot", "other-tenant", "dir-link")
    }
    # Documents with equal bytes are duplicates: all but one of each wait for it (attempts `deferred`,
    # given back), then are refused themselves; every attempt's error is checked for leaks.
    attempts = await db.fetch("SELECT outcome, error FROM job_attempts")
    assert sum(1 for a in attempts if a["outcome"] != "deferred") == 5
    errors_ = [a["error"] for a in attempts if a["error"] is not None]
    digest = hashlib.sha256(theirs.read_bytes()).hexdigest()
    for error in errors_:
        assert "not for" not in error and digest[:8] not in error and "bytes," not in error, error


async def test_http_documents_are_verified_and_an_unavailable_one_is_retried(
        db: asyncpg.Connection, dbpool: asyncpg.Pool, tmp_path: pathlib.Path
) -> None:
    await factories.seed(db)
    samples = generator.generate(6, seed=3)
    async with fileserver.running() as server:
        lines = []
        for sample in samples:
            data = sample.text.encode()
            server.files[f"/docs/{sample.key}.txt"] = data
            lines.append(manifest_line(sample.key, server.url(f"/docs/{sample.key}.txt"), data))
        flaky, missing = samples[0], samples[1]
        server.failures[f"/docs/{flaky.key}.txt"].extend([503, 502])
        del server.files[f"/docs/{missing.key}.txt"]
        server.files["/m.jsonl"] = b"\n".join(lines) + b"\n"
        await applying.admit_batch(db, batch(server.url("/m.jsonl")), documents=LOOPBACK)
        worker = running.Worker(dbpool, settings=worker_settings(egress_allow=LOOPBACK.egress_allow))
        async with waiting.running(worker.run):
            await waiting.until(lambda: settled(db, 6), timeout_s=30)
        assert server.requests[f"/docs/{flaky.key}.txt"] == 3
    found = await states(db)
    assert found[missing.key] == ("FAILED_TERMINAL", "DOCUMENT_NOT_FOUND")
    assert found[flaky.key][0] == flaky.expected_state
    attempts = await db.fetch(
        "SELECT a.outcome, a.error_class FROM job_attempts a JOIN extraction_jobs j ON j.id = a.job_id"
        " WHERE j.document_key = $1 ORDER BY a.fence",
        flaky.key,
    )
    assert [(a["outcome"], a["error_class"]) for a in attempts][:2] == [
        ("transient", "DOCUMENT_UNAVAILABLE"), ("transient", "DOCUMENT_UNAVAILABLE")
    ]
    assert len(attempts) == 3
    for sample in samples[2:]:
        assert found[sample.key][0] == sample.expected_state


async def test_a_document_on_a_refused_address_is_never_requested(
        db: asyncpg.Connection, dbpool: asyncpg.Pool
) -> None:
    """The manifest may name any URL; the workers' egress policy decides what they connect to."""
    await factories.seed(db)
    async with fileserver.running() as server:
        server.files["/inside.txt"] = b"cluster-internal"
        server.files["/m.jsonl"] = manifest_line("inside", server.url("/inside.txt"), b"cluster-internal") + b"\n"
        await applying.admit_batch(db, batch(server.url("/m.jsonl")), documents=LOOPBACK)
        worker = running.Worker(dbpool, settings=worker_settings())
        async with waiting.running(worker.run):
            await waiting.until(lambda: settled(db, 1), timeout_s=30)
        assert server.requests["/inside.txt"] == 0
    assert await states(db) == {"inside": ("FAILED_TERMINAL", "DOCUMENT_REFUSED")}
    error = await db.fetchval("SELECT error FROM job_attempts")
    assert "refused: a loopback address" in error and "--egress-allow" in error


async def test_an_unreachable_document_host_exhausts_its_retries(
        db: asyncpg.Connection, dbpool: asyncpg.Pool
) -> None:
    await factories.seed(db)
    port = fileserver.unused_port()
    async with fileserver.running() as server:
        server.files["/m.jsonl"] = manifest_line("gone", f"http://127.0.0.1:{port}/gone.txt", b"text") + b"\n"
        await applying.admit_batch(db, batch(server.url("/m.jsonl")), documents=LOOPBACK)
    request = await db.fetchval("SELECT max_attempts FROM extraction_jobs")
    assert request == 5
    worker = running.Worker(dbpool, settings=worker_settings(egress_allow=LOOPBACK.egress_allow))
    async with waiting.running(worker.run):
        await waiting.until(lambda: settled(db, 1), timeout_s=30)
    row = await db.fetchrow("SELECT state, attempt, last_error_class, last_error FROM extraction_jobs")
    assert row is not None and row["state"] == "FAILED_TERMINAL" and row["attempt"] == 5
    assert row["last_error_class"] == "ATTEMPTS_EXHAUSTED" and "DOCUMENT_UNAVAILABLE" in row["last_error"]
    assert await db.fetchval("SELECT count(*) FROM job_attempts WHERE error_class = 'DOCUMENT_UNAVAILABLE'") >= 4


def test_accept_batch_refuses_inline_documents_and_a_manifest_together(tmp_path: pathlib.Path) -> None:
    request = factories.batch_request(count=1)
    spooled = manifest_lines.Spooled(uri="file:///m", path=tmp_path / "m.csv", documents=1, total_bytes=1)
    both = accepting.BatchRequest(**{**request.__dict__, "manifest": spooled})
    assert both.document_count == 1


async def test_uris_with_commas_quotes_and_backslashes_survive_the_bulk_load(
        db: asyncpg.Connection, tmp_path: pathlib.Path
) -> None:
    await factories.seed(db)
    odd = ['file:///data/a,b.txt', 'file:///data/"quoted".txt', "file:///data/back\\slash.txt", "https://h/x?a=1,2&b=\"3\""]
    lines = [manifest_line(f"k{i}", uri, f"text {i}".encode()) for i, uri in enumerate(odd)]
    (tmp_path / "acme" / "m.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    await applying.admit_batch(
        db, batch((tmp_path / "acme" / "m.jsonl").as_uri()), documents=DocumentSettings(roots=(str(tmp_path),))
    )
    stored = await db.fetch(
        "SELECT d.uri FROM job_documents d JOIN extraction_jobs j ON j.id = d.job_id ORDER BY j.ordinal"
    )
    assert [r["uri"] for r in stored] == odd


@pytest.mark.parametrize("digest", ["A" * 64, "a" * 63, "a" * 65, "a" * 63 + "\n", "a" * 63 + "g", "é" * 64, ""])
async def test_the_database_refuses_a_document_digest_that_is_not_64_lowercase_hex_digits(
        db: asyncpg.Connection, tmp_path: pathlib.Path, digest: str
) -> None:
    """job_documents_sha256_hex (migration 0047: the rule of 0008, checked more cheaply)."""
    await factories.seed(db)
    synthetic_manifest(tmp_path / "acme" / "m.jsonl", 1)
    await applying.admit_batch(
        db, batch((tmp_path / "acme" / "m.jsonl").as_uri()), documents=DocumentSettings(roots=(str(tmp_path),))
    )
    await db.execute("UPDATE job_documents SET sha256 = $1", "0123456789abcdef" * 4)  # a valid one passes
    with pytest.raises(asyncpg.CheckViolationError, match="job_documents_sha256_hex"):
        await db.execute("UPDATE job_documents SET sha256 = $1", digest)
