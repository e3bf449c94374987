"""`lading jobs list|show` and `lading status` as a user runs them: a real process against real PostgreSQL."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from typing import Any

import asyncpg
import pytest

from lading import accepting, ids
from lading.db import jobs
from lading.jobs import transitions
from tests.support import factories, processes

pytestmark = pytest.mark.slow

SECRET = "CONFIDENTIAL-INVOICE-TEXT"
WORKER = ids.WorkerId("w1")


def _lading(*args: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "from lading_cli.main import main; raise SystemExit(main())", *args],
        capture_output=True, text=True, timeout=timeout_s, env=processes.environment(), cwd=processes.ROOT,
    )  # fmt: skip


async def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(_lading, *args)


async def _json(database_url: str, *args: str) -> Any:
    done = await _run(*args, "--database-url", database_url, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


async def _setup(db: asyncpg.Connection) -> dict[str, list[int]]:
    """acme/b1 with 6 jobs: one SUCCEEDED, one REVIEW_REQUIRED, one RUNNING, three READY."""
    await factories.seed(db)
    accepted = await accepting.accept_batch(db, factories.batch_request(count=6, text_prefix=SECRET))
    ok, review, running = await jobs.claim_batch(db, pool=factories.POOL, worker_id=WORKER, limit=3, lease_ttl_s=600)
    await jobs.finish_many(
        db,
        [
            transitions.succeed(ok.id, ok.fence, result={"total": "12.50"}, validation={"passed": True}),
            transitions.needs_review(
                review.id, review.fence, result={"total": "99.00"},
                validation={"passed": False, "failed_checks": [{"check": "total_sum", "field": "total",
                                                                "message": "lines do not add up"}]},
            ),
        ],
        worker_id=WORKER,
    )  # fmt: skip
    return {
        "SUCCEEDED": [ok.id],
        "REVIEW_REQUIRED": [review.id],
        "RUNNING": [running.id],
        "READY": list(accepted.job_ids[3:]),
    }


async def test_jobs_list_prints_jobs_with_their_states_and_filters_them(
        db: asyncpg.Connection, database_url: str
) -> None:
    by_state = await _setup(db)
    listed = await _json(database_url, "jobs", "list")
    assert listed["next_after"] is None
    assert {j["id"]: j["state"] for j in listed["jobs"]} == {i: s for s, job_ids in by_state.items() for i in job_ids}
    first = listed["jobs"][0]
    assert (first["tenant"], first["batch"], first["attempt"], first["max_attempts"]) == ("acme", "acme/b1", 1, 5)
    assert first["updated_at"].endswith("Z")

    ready = await _json(database_url, "jobs", "list", "--state", "READY", "--batch", "acme/b1", "--tenant", "acme")
    assert [j["id"] for j in ready["jobs"]] == by_state["READY"]
    settled = await _json(database_url, "jobs", "list", "--state", "succeeded", "--state", "REVIEW_REQUIRED")
    assert [j["id"] for j in settled["jobs"]] == sorted(by_state["SUCCEEDED"] + by_state["REVIEW_REQUIRED"])
    assert (await _json(database_url, "jobs", "list", "--pool", "elsewhere/none"))["jobs"] == []


async def test_jobs_list_pages_with_after_until_no_next_page_is_left(db: asyncpg.Connection, database_url: str) -> None:
    by_state = await _setup(db)
    seen: list[int] = []
    after: list[str] = []
    while True:
        page = await _json(database_url, "jobs", "list", "--limit", "4", *after)
        seen.extend(j["id"] for j in page["jobs"])
        if page["next_after"] is None:
            break
        after = ["--after", str(page["next_after"])]
    assert seen == sorted(i for job_ids in by_state.values() for i in job_ids)

    table = await _run("jobs", "list", "--limit", "4", "--database-url", database_url)
    assert table.returncode == 0, table.stderr
    assert f"--after {seen[3]}" in table.stdout and "acme/b1" in table.stdout


async def test_jobs_list_refuses_an_unknown_state_naming_the_valid_ones(database_url: str) -> None:
    done = await _run("jobs", "list", "--state", "DONE", "--database-url", database_url)
    assert done.returncode == 2
    assert "invalid state 'DONE'; expected one of READY, RUNNING, RETRY_SCHEDULED" in done.stderr


async def test_jobs_show_prints_attempts_result_and_events_but_never_the_document(
        db: asyncpg.Connection, database_url: str
) -> None:
    by_state = await _setup(db)
    [review] = by_state["REVIEW_REQUIRED"]
    shown = await _json(database_url, "jobs", "show", str(review))
    assert (shown["job"]["id"], shown["job"]["state"], shown["job"]["batch"]) == (review, "REVIEW_REQUIRED", "acme/b1")
    assert [(a["attempt"], a["outcome"]) for a in shown["attempts"]] == [(1, "validation-failed")]
    assert shown["result"]["verdict"] == {
        "passed": False, "failed_checks": [{"check": "total_sum", "field": "total", "message": "lines do not add up"}]
    }  # fmt: skip
    assert shown["result"]["extracted"] == {"total": "99.00"}
    assert [e["type"] for e in shown["events"]] == ["extraction.review_required.v1"]
    assert "document" not in shown

    for args in (["--json"], []):
        done = await _run("jobs", "show", str(review), "--database-url", database_url, *args)
        assert done.returncode == 0, done.stderr
        assert SECRET not in done.stdout and SECRET not in done.stderr
    table = await _run("jobs", "show", str(review), "--database-url", database_url)
    assert "total_sum" in table.stdout and "extraction.review_required.v1" in table.stdout

    revealed = await _json(database_url, "jobs", "show", str(review), "--show-document")
    assert revealed["document"].startswith(SECRET)
    plain = await _run("jobs", "show", str(review), "--show-document", "--database-url", database_url)
    assert SECRET in plain.stdout


async def test_jobs_show_of_an_unknown_job_exits_1(db: asyncpg.Connection, database_url: str) -> None:
    await _setup(db)
    done = await _run("jobs", "show", "987654", "--database-url", database_url)
    assert done.returncode == 1
    assert "job 987654 not found" in done.stderr
    assert done.stdout == ""


async def test_status_reports_pools_batches_review_queue_and_outbox(db: asyncpg.Connection, database_url: str) -> None:
    await _setup(db)
    status = await _json(database_url, "status")
    [pool] = status["pools"]
    assert (pool["name"], pool["backlog"], pool["running"], pool["paused"]) == (factories.POOL, 3, 1, False)
    assert pool["oldest_eligible_at"].endswith("Z") and pool["oldest_eligible_age_s"] >= 0
    [batch] = status["batches_in_progress"]
    assert (batch["namespace"], batch["name"], batch["total"]) == ("acme", "b1", 6)
    assert {k: v for k, v in batch["counts"].items() if v} == {
        "READY": 3, "RUNNING": 1, "SUCCEEDED": 1, "REVIEW_REQUIRED": 1
    }  # fmt: skip
    # Its next job is the next the pool's claim takes; no model call finished there yet: no ETA.
    assert batch["queue_position"] == 0 and batch["eta_s"] is None
    assert status["review_queue"]["size"] == 1 and status["review_queue"]["oldest_at"].endswith("Z")
    assert status["outbox"]["unpublished"] == 3  # batch accepted, completed, review required
    assert status["stale_completions_last_hour"] == 0

    table = await _run("status", "--database-url", database_url)
    assert table.returncode == 0, table.stderr
    assert factories.POOL in table.stdout and "acme/b1" in table.stdout and "review queue:" in table.stdout
    assert "position" in table.stdout and "ETA" in table.stdout


def test_the_commands_need_a_database_url() -> None:
    env = processes.environment()
    env.pop("DATABASE_URL", None)
    done = subprocess.run(
        [sys.executable, "-c", "from lading_cli.main import main; raise SystemExit(main())", "status"],
        capture_output=True, text=True, timeout=60, env=env, cwd=processes.ROOT,
    )  # fmt: skip
    assert done.returncode == 2
    assert "--database-url or $DATABASE_URL is required" in done.stderr
