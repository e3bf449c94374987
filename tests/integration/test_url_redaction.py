"""
A presigned or basic-auth URL that fails is never repeated: admission of a manifest and the
workers' fetch of documents, through the real code paths against real PostgreSQL and real HTTP,
leave the signature and the password nowhere: job rows, attempts, outbox events, the batch's
recent failures (what the operator writes into status), the logs and the metrics exposition.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import pathlib
from collections.abc import AsyncIterator

import asyncpg
import prometheus_client
import pytest
from lading_worker import running

from lading import applying, metrics
from lading.db import jobs
from lading.documents import manifest_lines
from lading.ids import BatchId
from tests.integration import test_manifest_batches as manifest_batches
from tests.support import factories, fileserver, waiting

SIGNATURE = "SECRETSIG"
PASSWORD = "PASSWORDSECRET"
QUERY = f"?X-Amz-Signature={SIGNATURE}&X-Amz-Credential=AKIA{SIGNATURE}"


@contextlib.asynccontextmanager
async def garbling() -> AsyncIterator[int]:
    """A TCP server on 127.0.0.1 that answers every request with bytes that are not HTTP: aiohttp's
    error for that (ClientResponseError) quotes the whole request URL, query included."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"garbage, not HTTP\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        await server.wait_closed()


def _assert_clean(text: str, where: str) -> None:
    assert SIGNATURE not in text, f"the signature leaked into {where}"
    assert PASSWORD not in text, f"the password leaked into {where}"


async def test_failing_presigned_urls_leave_no_secret_anywhere(
        db: asyncpg.Connection, dbpool: asyncpg.Pool, caplog: pytest.LogCaptureFixture, tmp_path: pathlib.Path
) -> None:
    caplog.set_level(logging.DEBUG)
    await factories.seed(db)
    gone = fileserver.unused_port()
    seen: list[str] = []
    async with fileserver.running() as server, garbling() as garbled:
        # Admission: a manifest that is missing (404), unreachable, or lists a URI with user info.
        for uri in (
            server.url("/missing.jsonl") + QUERY,
            f"http://127.0.0.1:{gone}/m.jsonl{QUERY}",
            f"http://127.0.0.1:{garbled}/m.jsonl{QUERY}",
        ):
            with pytest.raises(manifest_lines.ManifestUnavailable) as unavailable:
                await applying.admit_batch(db, manifest_batches.batch(uri), documents=manifest_batches.LOOPBACK)
            seen.append(str(unavailable.value))
        server.files["/creds.jsonl"] = manifest_batches.manifest_line(
            "creds", f"http://user:{PASSWORD}@127.0.0.1:{server.port}/d.txt{QUERY}", b"text"
        ) + b"\n"
        with pytest.raises(applying.InvalidManifest) as invalid:
            await applying.admit_batch(
                db, manifest_batches.batch(server.url("/creds.jsonl") + QUERY, name="creds", uid="uid-creds"),
                documents=manifest_batches.LOOPBACK,
            )  # fmt: skip
        seen.append(str(invalid.value))

        # Workers: documents that are missing, unreachable, or not what the manifest says.
        server.files["/docs/tampered.txt"] = b"these are other bytes"
        lines = [
            manifest_batches.manifest_line("missing", server.url("/docs/missing.txt") + QUERY, b"missing text"),
            manifest_batches.manifest_line("unreachable", f"http://127.0.0.1:{gone}/u.txt{QUERY}", b"text"),
            manifest_batches.manifest_line("tampered", server.url("/docs/tampered.txt") + QUERY, b"expected"),
            manifest_batches.manifest_line("garbled", f"http://127.0.0.1:{garbled}/g.txt{QUERY}", b"text"),
        ]
        server.files["/m.jsonl"] = b"\n".join(lines) + b"\n"
        applied = await applying.admit_batch(
            db, manifest_batches.batch(server.url("/m.jsonl") + QUERY), documents=manifest_batches.LOOPBACK
        )
        worker = running.Worker(
            dbpool, settings=manifest_batches.worker_settings(egress_allow=manifest_batches.LOOPBACK.egress_allow)
        )
        async with waiting.running(worker.run):
            await waiting.until(lambda: manifest_batches.settled(db, 4), timeout_s=60)

    assert await manifest_batches.states(db) == {
        "missing": ("FAILED_TERMINAL", "DOCUMENT_NOT_FOUND"),
        "unreachable": ("FAILED_TERMINAL", "ATTEMPTS_EXHAUSTED"),
        "tampered": ("FAILED_TERMINAL", "DOCUMENT_DIGEST_MISMATCH"),
        "garbled": ("FAILED_TERMINAL", "ATTEMPTS_EXHAUSTED"),
    }
    for message in seen:
        _assert_clean(message, "an admission error")
    assert "127.0.0.1" in seen[0] and "HTTP 404" in seen[0]  # host and status are kept
    assert "ClientConnectorError" in seen[1] and "ClientResponseError" in seen[2]
    job_rows = [dict(r) for r in await db.fetch("SELECT * FROM extraction_jobs")]
    attempts = [dict(r) for r in await db.fetch("SELECT * FROM job_attempts")]
    events = [dict(r) for r in await db.fetch("SELECT * FROM outbox_events")]
    _assert_clean(json.dumps(job_rows, default=str), "extraction_jobs")
    _assert_clean(json.dumps(attempts, default=str), "job_attempts")
    _assert_clean(json.dumps(events, default=str), "outbox_events")
    assert any("HTTP 404" in (a["error"] or "") for a in attempts)
    failures = await jobs.failures_of_batch(db, batch_id=BatchId(applied.result.batch_id), limit=10)
    assert len(failures) == 4
    _assert_clean(json.dumps([f.error for f in failures]), "the batch's recent failures")
    _assert_clean(caplog.text, "the logs")
    _assert_clean(prometheus_client.generate_latest(metrics.REGISTRY).decode(), "the metrics")
