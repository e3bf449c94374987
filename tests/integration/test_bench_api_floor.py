"""
The `api` benchmark's floor (hack/bench_api_floor.py), a real server process on the run's database:
what it is compared with is only a bound when it writes what an accepted document needs, so each
POST must leave its job (READY, in the given batch), its text, its key's claim and its
idempotency record, and answer 202 with the job's Location.
"""

from __future__ import annotations

import asyncio
import hashlib
import pathlib
import re
import sys

import aiohttp
import asyncpg

from tests.integration.test_admission_rules import seed
from tests.integration.test_document_intake import document, submit

FLOOR = pathlib.Path(__file__).resolve().parents[2] / "hack" / "bench_api_floor.py"


async def test_each_post_to_the_floor_writes_one_ready_job_with_its_text_claim_and_record(
        db: asyncpg.Connection, dbpool: asyncpg.Pool, database_url: str) -> None:  # fmt: skip
    await seed(db)
    batch_id = await db.fetchval("SELECT batch_id FROM extraction_jobs WHERE id = $1",
                                 (await submit(dbpool, document("inv-0"))).job_id)
    server = await asyncio.create_subprocess_exec(
        sys.executable, str(FLOOR), database_url, str(batch_id), stdout=asyncio.subprocess.PIPE
    )
    try:
        assert server.stdout is not None
        line = (await asyncio.wait_for(server.stdout.readline(), timeout=30)).decode()
        match = re.search(r"listening on (http://\S+)", line)
        assert match is not None, line
        texts = {f"floor-{n}": f"Invoice {n}\nTotal 119.00 EUR" for n in range(3)}
        async with aiohttp.ClientSession() as http:
            for key, text in texts.items():
                async with http.post(f"{match[1]}/v1/namespaces/acme/documents", json={"key": key, "text": text},
                                     headers={"Idempotency-Key": key}) as answer:
                    assert answer.status == 202
                    assert answer.headers["Location"].startswith("/v1/jobs/")
    finally:
        server.kill()
        await server.wait()
    rows = await db.fetch(
        "SELECT j.document_key, j.state, j.batch_id, j.content_sha256, d.text, s.job_id = j.id AS claimed, "
        "       r.status, r.location "
        "  FROM extraction_jobs j JOIN job_documents d ON d.job_id = j.id "
        "  JOIN document_submissions s ON s.namespace = 'acme' AND s.idempotency_key = j.document_key "
        "  JOIN api_requests r ON r.namespace = 'acme' AND r.idempotency_key = j.document_key "
        " WHERE j.document_key LIKE 'floor-%' ORDER BY j.document_key"
    )
    assert [row["document_key"] for row in rows] == sorted(texts)
    for row in rows:
        assert (row["state"], row["batch_id"], row["claimed"], row["status"]) == ("READY", batch_id, True, 202)
        assert row["text"] == texts[row["document_key"]]
        assert row["content_sha256"] == hashlib.sha256(row["text"].encode()).hexdigest()
        assert row["location"].startswith("/v1/jobs/")
