"""`lading deliveries list|show|redeliver|resolve` as an operator runs them, after a real
UNKNOWN_EXTERNAL: a real process against real PostgreSQL, a real receiver that hung, then answers."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import asyncpg
import pytest

from lading.settings import DeliverySettings
from tests.integration.delivery import helpers
from tests.support import erp_stub, processes

pytestmark = pytest.mark.slow


async def _lading(*args: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", "from lading_cli.main import main; raise SystemExit(main())", *args],
        capture_output=True, text=True, timeout=60, env=processes.environment(), cwd=processes.ROOT,
    )  # fmt: skip


async def test_the_unknown_external_runbook_lists_shows_redelivers_with_the_same_id_and_resolves(
        db: asyncpg.Connection, dbpool: asyncpg.Pool, database_url: str,
) -> None:
    url = ("--database-url", database_url)
    settings = DeliverySettings(**{**helpers.FAST.__dict__, "read_timeout_s": 0.3, "total_timeout_s": 0.5})
    async with erp_stub.running() as erp:
        erp.reply = erp_stub.hang()
        await helpers.register(db, erp.webhook_url, max_attempts=1)
        lost, found = await helpers.succeed(db, count=2)
        async with helpers.dispatcher(dbpool, settings=settings) as d:
            await d.run_once()
            lost_id = str((await helpers.delivery_of(db, lost)).id)
            found_id = str((await helpers.delivery_of(db, found)).id)

            listed = await _lading("deliveries", "list", "--state", "UNKNOWN_EXTERNAL", "--json", *url)
            assert listed.returncode == 0, listed.stderr
            rows = json.loads(listed.stdout)["deliveries"]
            assert {r["delivery_id"] for r in rows} == {lost_id, found_id}
            assert {r["last_error_class"] for r in rows} == {"OutcomeUnknown"}

            shown = await _lading("deliveries", "show", lost_id, "--json", *url)
            assert shown.returncode == 0, shown.stderr
            assert [a["outcome"] for a in json.loads(shown.stdout)["attempts"]] == ["unknown"]

            redelivered = await _lading("deliveries", "redeliver", lost_id, "--operator", "ops-amy",
                                        "--reason", "no such invoice in the ERP", *url)  # fmt: skip
            assert redelivered.returncode == 0, redelivered.stderr
            assert f"delivery {lost_id}: due again" in redelivered.stdout
            erp.reply = erp_stub.status(200)
            assert (await d.run_once()).delivered == 1

            resolved = await _lading("deliveries", "resolve", found_id, "--operator", "ops-amy",
                                     "--reason", "ERP booked it as 4711", "--json", *url)  # fmt: skip
            assert resolved.returncode == 0, resolved.stderr
            assert json.loads(resolved.stdout) == {"resolved": [found_id], "refused": []}

            again = await _lading("deliveries", "resolve", found_id, "--operator", "x", "--reason", "y", *url)
            assert again.returncode == 1
            assert "is DELIVERED; resolve applies to UNKNOWN_EXTERNAL only; nothing was changed" in again.stderr

    assert erp.ids().count(lost_id) == 2, "the redelivery carried the same webhook-id"
    assert erp.ids().count(found_id) == 1, "resolving sends nothing"
    lost_row = await helpers.delivery_of(db, lost)
    assert lost_row.state == "DELIVERED"
    found_row = await helpers.delivery_of(db, found)
    assert (found_row.state, found_row.resolved_by, found_row.resolved_reason) == (
        "DELIVERED", "ops-amy", "ERP booked it as 4711"
    )


async def test_bad_ids_and_missing_sign_off_are_usage_errors_that_touch_nothing(database_url: str) -> None:
    bad = await _lading("deliveries", "show", "not-a-uuid", "--database-url", database_url)
    assert bad.returncode == 2 and "is not a delivery id" in bad.stderr
    blank = await _lading("deliveries", "redeliver", "0b6f0c52-7a4c-4c52-9a57-3e8e9f0c1d2e", "--operator", " ",
                          "--reason", "r", "--database-url", database_url)  # fmt: skip
    assert blank.returncode == 2 and "an operator is required" in blank.stderr
    missing = await _lading("deliveries", "resolve", "0b6f0c52-7a4c-4c52-9a57-3e8e9f0c1d2e", "--operator", "o",
                            "--reason", "r", "--database-url", database_url)  # fmt: skip
    assert missing.returncode == 1 and "not found" in missing.stderr
