"""
The intake as a process: killed between the acceptance's commit and the answer (the retry gets
the first job, not a second one) or before the commit (nothing is left half-applied), a database
it cannot reach (503 with Retry-After), the OpenAPI document it serves (and the committed copy,
which must not be stale), and `lading tokens`.
"""

from __future__ import annotations

import json
import secrets
import sys
import time
import urllib.error
import urllib.request

import aiohttp
import asyncpg
import pytest
from lading_api import openapi
from lading_api.settings import ApiSettings
from lading_cli import main as cli

from tests.integration.api.conftest import ApiProcess, Tenant, call, document, start_api

BATCH = {"name": "march", "spec": {
    "schema": "invoice.v1", "inferencePoolRef": {"name": "builtin", "namespace": "lading-system"},
    "documents": [{"key": "a", "text": "Invoice A"}, {"key": "b", "text": "Invoice B"}],
}}  # fmt: skip


@pytest.mark.parametrize(("route", "failpoint"), [
    # A document and its Idempotency-Key record commit together: killed after that commit, the
    # retry is the first answer again.
    ("documents", "api.after_commit_before_answer"),
    # A batch's record is written after its acceptance committed: killed in between, the retry
    # gets the same batch through the core's own idempotency (the batch's name); killed after
    # both, the record's replay.
    ("batches", "api.after_accept_before_record"),
    ("batches", "api.after_commit_before_answer"),
])  # fmt: skip
async def test_a_retry_after_the_server_died_before_answering_gets_the_first_job(
        route: str, failpoint: str, database_url: str, acme: Tenant, db: asyncpg.Connection,
        http: aiohttp.ClientSession,
) -> None:
    body = document() if route == "documents" else BATCH
    doomed = start_api(database_url, failpoints=f"{failpoint}=kill")
    try:
        with pytest.raises(aiohttp.ClientError):
            await call(http, "POST", f"{doomed.base_url}/v1/namespaces/acme/{route}", tenant=acme, key="k", json=body)
        assert doomed.process.wait(timeout=30) == -9
    finally:
        doomed.kill()
    jobs = await db.fetchval("SELECT count(*) FROM extraction_jobs")
    assert jobs == (1 if route == "documents" else 2)
    first = await db.fetchval("SELECT min(id) FROM extraction_jobs")
    restarted = start_api(database_url)
    try:
        retry = await call(http, "POST", f"{restarted.base_url}/v1/namespaces/acme/{route}", tenant=acme, key="k",
                           json=body)
    finally:
        restarted.kill()
    location = f"/v1/jobs/{first}" if route == "documents" else "/v1/namespaces/acme/batches/march"
    assert (retry.status, retry.headers["Location"]) == (202, location)
    assert retry.headers["Idempotency-Replayed"] == "true"
    assert await db.fetchval("SELECT count(*) FROM extraction_jobs") == jobs


async def test_a_document_killed_before_its_commit_leaves_no_record_and_its_retry_is_accepted(
        database_url: str, acme: Tenant, db: asyncpg.Connection, http: aiohttp.ClientSession,
) -> None:
    doomed = start_api(database_url, failpoints="intake.before_commit=kill")
    try:
        with pytest.raises(aiohttp.ClientError):
            await call(http, "POST", f"{doomed.base_url}/v1/namespaces/acme/documents", tenant=acme, key="k",
                       json=document())
        assert doomed.process.wait(timeout=30) == -9
    finally:
        doomed.kill()
    assert await db.fetchval("SELECT count(*) FROM extraction_jobs") == 0
    assert await db.fetchval("SELECT count(*) FROM api_requests") == 0
    restarted = start_api(database_url)
    try:
        retry = await call(http, "POST", f"{restarted.base_url}/v1/namespaces/acme/documents", tenant=acme, key="k",
                           json=document())
    finally:
        restarted.kill()
    job_id = await db.fetchval("SELECT id FROM extraction_jobs")
    assert (retry.status, retry.headers["Location"]) == (202, f"/v1/jobs/{job_id}")
    assert "Idempotency-Replayed" not in retry.headers
    assert await db.fetchval("SELECT count(*) FROM api_requests") == 1


async def test_an_unreachable_database_is_503_with_retry_after(http: aiohttp.ClientSession) -> None:
    cut_off = start_api("postgresql://postgres@127.0.0.1:9/nowhere")  # discard port: refused at once
    try:
        posted = await call(http, "POST", f"{cut_off.base_url}/v1/namespaces/acme/documents", key="k",
                            json=document(), headers={"Authorization": "Bearer lading_" + "a" * 43})
        ready = await call(http, "GET", f"{cut_off.base_url}/readyz")
        alive = await call(http, "GET", f"{cut_off.base_url}/healthz")
    finally:
        cut_off.kill()
    assert posted.status == 503 and int(posted.headers["Retry-After"]) > 0
    assert posted.body["type"].endswith("/unavailable") and "nowhere" not in json.dumps(posted.body)
    assert (ready.status, alive.status) == (503, 200)


async def test_the_served_openapi_document_is_the_committed_one(
        api_server: ApiProcess, http: aiohttp.ClientSession
) -> None:
    served = await call(http, "GET", f"{api_server.base_url}/openapi.json")
    assert served.status == 200
    committed = json.loads(openapi.COMMITTED.read_text(encoding="utf-8"))
    assert served.body == committed, "docs/openapi.json is stale: run python -m lading_api.openapi --write"
    assert set(committed["paths"]) >= {"/v1/namespaces/{namespace}/documents", "/v1/jobs/{id}"}


def lading(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """`lading ARGS...` in this process (a subprocess would spend seconds importing): exit code, stdout, stderr."""
    try:
        code = cli.main(list(args))
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 2
        print(exc.code, file=sys.stderr)
    out, err = capsys.readouterr()
    return code, out, err


def get(url: str, token: str) -> int:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        exc.close()
        return exc.code


def test_tokens_are_printed_once_listed_without_secrets_and_stop_working_within_a_second_of_revocation(
        api_server: ApiProcess, database_url: str, capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = lading(capsys, "tokens", "create", "--database-url", database_url, "--namespace", "tokens-ns",
                            "--name", f"ci-{secrets.token_hex(3)}", "--expires-in", "30d")
    assert code == 0, err
    token, name = out.strip(), err.split()[1]
    assert token.startswith("lading_") and "expires" in err
    url = f"{api_server.base_url}/v1/namespaces/tokens-ns/batches/none"
    assert get(url, token) == 404  # authenticated: nothing there
    code, out, _ = lading(capsys, "tokens", "list", "--database-url", database_url, "--json")
    assert code == 0 and token not in out
    assert {t["name"]: t["active"] for t in json.loads(out)["tokens"]}[name] is True
    assert lading(capsys, "tokens", "revoke", name, "--database-url", database_url)[0] == 0
    revoked = time.monotonic()
    # A valid token's lookup is reused for ApiSettings.token_cache_s (1 s): refused within that, and for good.
    while (status := get(url, token)) != 401 and time.monotonic() - revoked < 5:
        time.sleep(0.05)
    assert status == 401 and time.monotonic() - revoked < ApiSettings().token_cache_s + 1.0
    assert get(url, token) == 401
    code, _, err = lading(capsys, "tokens", "create", "--database-url", database_url, "--namespace", "Not_A_Namespace")
    assert code != 0 and "--namespace" in err
