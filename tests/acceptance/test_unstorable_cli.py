"""
What a user sees of values PostgreSQL cannot store, through the real CLI: an attempt the
committer had to end as UNSTORABLE in `lading jobs show`, and a correction holding NUL refused
by `lading review correct` naming the field.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import asyncpg
import pytest
from lading_worker import committing

from lading import accepting, ids, storable
from lading.db import jobs
from lading.jobs import transitions
from lading.settings import ClaimerSettings
from tests.support import factories, processes

pytestmark = pytest.mark.slow

WORKER = ids.WorkerId("w1")


def _lading(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "from lading_cli.main import main; raise SystemExit(main())", *args],
        input=stdin, capture_output=True, text=True, timeout=60, env=processes.environment(), cwd=processes.ROOT,
    )  # fmt: skip


async def test_jobs_show_names_an_unstorable_attempt_and_review_correct_refuses_a_nul(
        db: asyncpg.Connection, dbpool: asyncpg.Pool, database_url: str
) -> None:
    await factories.seed(db)
    await accepting.accept_batch(db, factories.batch_request(count=2))
    bad, good = await jobs.claim_batch(db, pool=factories.POOL, worker_id=WORKER, limit=2, lease_ttl_s=600)
    committer = committing.Committer(dbpool, worker_id=WORKER, pool=factories.POOL, settings=ClaimerSettings())
    submitted = [
        asyncio.create_task(committer.submit(transitions.succeed(
            bad.id, bad.fence, result={"supplier": {"name": "Acme\x00"}}, validation={"passed": True}
        ))),
        asyncio.create_task(committer.submit(transitions.succeed(
            good.id, good.fence, result={"total": "1.00"}, validation={"passed": True}
        ))),
    ]  # fmt: skip
    await asyncio.sleep(0)
    await committer.run_once()
    assert await asyncio.gather(*submitted) == [True, True]

    shown = await asyncio.to_thread(_lading, "jobs", "show", str(bad.id), "--database-url", database_url, "--json")
    assert shown.returncode == 0, shown.stderr
    job = json.loads(shown.stdout)["job"]
    assert (job["state"], job["last_error_class"]) == ("FAILED_TERMINAL", storable.UNSTORABLE)
    assert "result.supplier.name: contains U+0000" in job["last_error"]
    table = await asyncio.to_thread(_lading, "jobs", "show", str(bad.id), "--database-url", database_url)
    assert table.returncode == 0, table.stderr
    assert storable.UNSTORABLE in table.stdout and "Acme" not in table.stdout

    corrected = json.dumps({"invoice_number": "INV-1", "supplier": {"name": "Acme\x00"}})  # written as \u0000
    refused = await asyncio.to_thread(
        _lading, "review", "correct", str(good.id), "--file", "-", "--reviewer", "bob", "--reason", "fixed",
        "--database-url", database_url, stdin=corrected,
    )  # fmt: skip
    assert refused.returncode != 0
    assert "correction.supplier.name: contains U+0000 (NUL)" in refused.stderr
