"""`lading receiver` as a real process: starts, answers probes, books a signed delivery, stops on SIGTERM."""

from __future__ import annotations

import asyncio
import pathlib
import re
import signal
import subprocess
import sys

import aiohttp
import asyncpg
import pytest
from lading_webhook_receiver import ledger

from tests.integration.receiver import deliveries
from tests.support import processes

LADING = [sys.executable, "-c", "from lading_cli.main import main; raise SystemExit(main())"]


@pytest.mark.slow
async def test_lading_receiver_serves_signed_deliveries_and_stops_cleanly_on_sigterm(
        db: asyncpg.Connection, database_url: str, tmp_path: pathlib.Path
) -> None:
    old, new = deliveries.new_secret(), deliveries.new_secret()
    secret_file = tmp_path / "secrets"
    secret_file.write_text(f"# rotation: the new secret\n{new}\n")
    await _migrate(database_url)
    process = await asyncio.create_subprocess_exec(
        *LADING, "receiver", "--port", "0", "--database-url", database_url, "--secret-file", str(secret_file),
        env=processes.environment(LADING_RECEIVER_SECRETS=old), cwd=processes.ROOT,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        line = (await asyncio.wait_for(process.stdout.readline(), 30)).decode()
        match = re.search(r"listening on (http://127\.0\.0\.1:\d+/webhooks/lading) \(2 secret\(s\)\)", line)
        assert match, line
        url = match[1]
        async with aiohttp.ClientSession() as http:
            async with http.get(url + "/healthz") as response:
                assert response.status == 200
            async with http.get(url + "/readyz") as response:
                assert response.status == 200
            for n, secret in enumerate((old, new)):
                body = deliveries.event_body(job_id=n, result=deliveries.invoice(number=f"P-{n}"))
                headers = deliveries.signed(body, secret=secret, delivery_id=f"msg_proc{n}")
                async with http.post(url, data=body, headers=headers) as response:
                    assert response.status == 200, await response.text()
        assert await ledger.count(db) == 2
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 30) == 0
        assert process.stderr is not None
        output = line + (await process.stdout.read()).decode() + (await process.stderr.read()).decode()
        assert old not in output and new not in output
    finally:
        await processes.stop(process)


async def _migrate(database_url: str) -> None:
    """`lading migrate --receiver`: the receiver waits for its schema, it never migrates."""
    process = await asyncio.create_subprocess_exec(
        *LADING, "migrate", "--receiver", "--database-url", database_url,
        env=processes.environment(), cwd=processes.ROOT, stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 0 and out.decode().startswith("receiver schema at version"), out


async def _start(database_url: str, *, secret: str, failpoints: str = "") -> tuple[asyncio.subprocess.Process, str]:
    await _migrate(database_url)
    extra = {"LADING_FAILPOINTS": failpoints} if failpoints else {}
    process = await asyncio.create_subprocess_exec(
        *LADING, "receiver", "--port", "0", "--database-url", database_url,
        env=processes.environment(LADING_RECEIVER_SECRETS=secret, **extra), cwd=processes.ROOT,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    assert process.stdout is not None
    line = (await asyncio.wait_for(process.stdout.readline(), 30)).decode()
    match = re.search(r"listening on (\S+) ", line)
    assert match, line
    return process, match[1]


@pytest.mark.slow
async def test_a_receiver_killed_after_its_commit_books_once_when_the_delivery_comes_again(
        db: asyncpg.Connection, database_url: str
) -> None:
    secret = deliveries.new_secret()
    body = deliveries.event_body()
    headers = deliveries.signed(body, secret=secret, delivery_id="msg_killed")
    process, url = await _start(database_url, secret=secret, failpoints="receiver.after_commit_before_response=kill")
    try:
        async with aiohttp.ClientSession() as http:
            with pytest.raises(aiohttp.ClientError):  # SIGKILL: the connection drops, no answer
                async with http.post(url, data=body, headers=headers) as response:
                    await response.read()
        assert await asyncio.wait_for(process.wait(), 30) == -signal.SIGKILL
    finally:
        await processes.stop(process)
    assert await ledger.count(db) == 1

    process, url = await _start(database_url, secret=secret)
    try:
        async with aiohttp.ClientSession() as http, http.post(url, data=body, headers=headers) as response:
            assert response.status == 200
            answer = await response.json()
        stored = await db.fetchval("SELECT reference FROM ledger_invoices")
        assert answer == {"status": "duplicate", "reference": stored}
        assert await ledger.count(db) == 1
    finally:
        process.send_signal(signal.SIGTERM)
        await asyncio.wait_for(process.wait(), 30)
        await processes.stop(process)


def _lading(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*LADING, *args], env=processes.environment(**env), cwd=processes.ROOT, capture_output=True, text=True,
        timeout=60, check=False,
    )  # fmt: skip


def test_the_receiver_refuses_to_start_without_a_secret_or_with_a_bad_one() -> None:
    done = _lading("receiver", "--database-url", "postgresql://nowhere/x", env={"LADING_RECEIVER_SECRETS": ""})
    assert done.returncode != 0
    assert "no signing secret" in done.stderr and "--secret-file" in done.stderr

    bad = "whsec_not*base64*at*all"
    done = _lading("receiver", "--database-url", "postgresql://nowhere/x", "--secret", "whsec_" + "QUJD",
                   env={"LADING_RECEIVER_SECRETS": f"whsec_QUJD,{bad}"})  # fmt: skip
    assert done.returncode != 0
    assert "bad signing secret ($LADING_RECEIVER_SECRETS item 2)" in done.stderr
    assert bad not in done.stderr + done.stdout and "QUJD" not in done.stderr + done.stdout
