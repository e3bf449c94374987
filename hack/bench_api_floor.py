"""
The `api` benchmark's floor (hack/bench_api.py): the least an HTTP intake on this stack can do for
a single-document POST, served the same way as `lading api` and measured by the same load
generator in the same run, so Lading's latency can be read against what the machine allows.

    python hack/bench_api_floor.py DATABASE_URL BATCH_ID     prints "listening on http://H:P"

Each POST's body is parsed and the rows an accepted document needs are written in ONE statement
in autocommit (one round trip, one commit, synchronous_commit as the database has it): its
idempotency record with the answer (api_requests), its key's claim (document_submissions), its
job (extraction_jobs, with every index the workers need) and its text (job_documents), appended
to batch BATCH_ID; then `202` with a `Location`. The request's Idempotency-Key is the document
key, so every request of a run writes a new job.

What it leaves out, which the intake does: authentication, the field rules, the idempotency
check (a repeated key fails here), the tenant's admission (quota, pools, priorities, the queue
counters: the statement switches the counting triggers off), the rolling batch's choice and
count, waking the claimers, the outbox event. The floor is a bound from below, not a rival: no
implementation of the contract on this stack answers faster than it on the same machine.

The pool holds its 20 connections from the start (the intake's pool size; none is opened while a
run is measured).
"""

from __future__ import annotations

import asyncio
import sys
import uuid

import aiohttp.web
import asyncpg
import orjson

POOL_SIZE = 20
WRITE_ROWS = """
WITH exempt AS MATERIALIZED (
    SELECT set_config('lading.queued_counted', 'on', true) AS setting
), job_id AS MATERIALIZED (
    SELECT nextval('extraction_jobs_id_seq') AS id FROM exempt
), record AS (
    INSERT INTO api_requests (namespace, idempotency_key, request_sha256, status, location, body)
    SELECT $1, $2, md5($3), 202, $4, $5::jsonb FROM exempt
), claim AS (
    INSERT INTO document_submissions (namespace, idempotency_key, request_digest, job_id)
    SELECT $1, $2, md5($3), id FROM job_id
), job AS (
    INSERT INTO extraction_jobs (id, tenant, batch_id, ordinal, document_key, request_hash, content_sha256, pool,
                                 schema, validation_policy, priority, max_attempts, deadline_at)
    SELECT j.id, b.tenant, b.id, 0, $2, md5($3), encode(sha256(convert_to($3, 'UTF8')), 'hex'), b.pool,
           'invoice.v1', b.validation_policy, 1, 5, clock_timestamp() + interval '1 day'
      FROM job_id j CROSS JOIN batches b
     WHERE b.id = $6
    RETURNING id
)
INSERT INTO job_documents (job_id, text, uri, sha256, bytes)
SELECT id, $3, NULL, NULL, octet_length($3) FROM job
"""


async def serve(database_url: str, batch_id: int) -> None:
    db = await asyncpg.create_pool(database_url, min_size=POOL_SIZE, max_size=POOL_SIZE,
                                   server_settings={"application_name": "lading-api-floor", "jit": "off"})
    assert db is not None

    async def post(request: aiohttp.web.Request) -> aiohttp.web.Response:
        document = orjson.loads(await request.read())
        key = request.headers["Idempotency-Key"]
        location = f"/v1/jobs/{uuid.uuid4()}"
        body = orjson.dumps({"status": "accepted", "location": location})
        await db.execute(WRITE_ROWS, request.match_info["namespace"], key, document["text"], location,
                         body.decode(), batch_id)
        return aiohttp.web.Response(status=202, body=body, content_type="application/json",
                                    headers={"Location": location})

    app = aiohttp.web.Application()
    app.router.add_post("/v1/namespaces/{namespace}/documents", post)
    runner = aiohttp.web.AppRunner(app, access_log=None, handler_cancellation=False)
    await runner.setup()
    site = aiohttp.web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = next(address for address in runner.addresses if isinstance(address, tuple))[:2]
    print(f"listening on http://{host}:{port}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
        await db.close()


if __name__ == "__main__":
    asyncio.run(serve(sys.argv[1], int(sys.argv[2])))
