"""
Real worker processes, real signals: SIGKILL mid-attempt, SIGSTOP past the lease,
SIGTERM drain. Every job ends settled exactly once; no stale result is ever applied.
"""

from __future__ import annotations

import asyncio
import pathlib
import signal

import asyncpg
import pytest

from lading import accepting
from lading.db import registry
from lading.ids import PoolName
from lading_demo import generator
from tests.support import factories, processes, waiting

POOL = factories.POOL
FAST = ["--lease-ttl", "2", "--heartbeat-interval", "0.4", "--reaper-interval", "0.2", "--poll-interval", "0.1",
        "--backoff-base", "0.05"]  # fmt: skip

pytestmark = pytest.mark.slow


async def _setup(db: asyncpg.Connection, *, count: int, latency_ms: int) -> list[int]:
    await factories.seed(db)
    await registry.upsert_pool(
        db, name=PoolName(POOL), provider="builtin", model="lading-builtin", spec={"builtin": {"latencyMs": latency_ms}}
    )
    samples = [s for s in generator.generate(count * 3, seed=7) if s.expected_state == "SUCCEEDED"][:count]
    request = factories.batch_request(count=0)
    request = accepting.BatchRequest(
        **{**request.__dict__, "documents": [accepting.DocumentInput(key=s.key, text=s.text) for s in samples]}
    )
    result = await accepting.accept_batch(db, request)
    return list(result.job_ids)


async def _settled(db: asyncpg.Connection, n: int) -> bool:
    return await db.fetchval("SELECT count(*) FROM extraction_jobs WHERE state = 'SUCCEEDED'") == n


async def _open_attempts(db: asyncpg.Connection) -> int:
    return int(await db.fetchval("SELECT count(*) FROM job_attempts WHERE finished_at IS NULL"))


async def _assert_each_job_completed_once(db: asyncpg.Connection, n: int) -> None:
    assert await db.fetchval("SELECT count(*) FROM results") == n
    assert await db.fetchval("SELECT count(*) FROM outbox_events WHERE type = 'extraction.completed.v1'") == n
    # The stored result always comes from the attempt that owned the job when it finished.
    assert await db.fetchval(
        "SELECT count(*) FROM results r JOIN extraction_jobs j ON j.id = r.job_id WHERE r.fence <> j.fence"
    ) == 0


async def test_a_worker_killed_mid_attempt_leaves_the_job_to_be_reclaimed_and_completed_once(
        db: asyncpg.Connection, database_url: str, tmp_path: pathlib.Path
) -> None:
    job_ids = await _setup(db, count=5, latency_ms=0)
    doomed = await processes.start_worker(
        database_url, POOL, args=[*FAST, "--concurrency", "1"],
        failpoints="worker.after_model_before_commit=kill", log=tmp_path / "doomed.log",
    )  # fmt: skip
    try:
        assert await asyncio.wait_for(doomed.wait(), 30) == -signal.SIGKILL
    finally:
        await processes.stop(doomed)
    assert await db.fetchval("SELECT count(*) FROM extraction_jobs WHERE state = 'RUNNING'") == 1

    survivor = await processes.start_worker(database_url, POOL, args=FAST, log=tmp_path / "survivor.log")
    try:
        await waiting.until(lambda: _settled(db, len(job_ids)), timeout_s=60)
    finally:
        survivor.send_signal(signal.SIGTERM)
        await asyncio.wait_for(survivor.wait(), 30)
    await _assert_each_job_completed_once(db, len(job_ids))
    rescued = await db.fetch(
        "SELECT job_id, array_agg(outcome ORDER BY fence) AS outcomes FROM job_attempts GROUP BY job_id"
        " HAVING count(*) > 1"
    )
    assert [r["outcomes"] for r in rescued] == [["lease-expired", "ok"]]


async def test_a_paused_worker_past_its_lease_cannot_overwrite_the_new_owner(
        db: asyncpg.Connection, database_url: str, tmp_path: pathlib.Path
) -> None:
    job_ids = await _setup(db, count=1, latency_ms=1500)
    zombie = await processes.start_worker(database_url, POOL, args=FAST, log=tmp_path / "zombie.log")
    try:
        await waiting.until(lambda: _has_open_attempt(db), timeout_s=30)
        zombie.send_signal(signal.SIGSTOP)
        survivor = await processes.start_worker(database_url, POOL, args=FAST, log=tmp_path / "survivor.log")
        try:
            await waiting.until(lambda: _settled(db, 1), timeout_s=60)
        finally:
            survivor.send_signal(signal.SIGTERM)
            await asyncio.wait_for(survivor.wait(), 30)
        # The zombie wakes up mid-attempt with a lost lease; SIGTERM makes it finish or drop that
        # attempt before exiting, so whatever it would write has been tried once it is gone.
        zombie.send_signal(signal.SIGCONT)
        zombie.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(zombie.wait(), 30) == 0
    finally:
        await processes.stop(zombie)
    await _assert_each_job_completed_once(db, len(job_ids))
    attempts = await db.fetch("SELECT fence, outcome FROM job_attempts ORDER BY fence")
    assert [r["outcome"] for r in attempts] == ["lease-expired", "ok"]


async def _has_open_attempt(db: asyncpg.Connection) -> bool:
    return await _open_attempts(db) == 1


async def test_sigterm_lets_in_flight_attempts_finish_before_the_worker_exits(
        db: asyncpg.Connection, database_url: str, tmp_path: pathlib.Path
) -> None:
    job_ids = await _setup(db, count=4, latency_ms=1500)
    worker = await processes.start_worker(
        database_url, POOL, args=[*FAST, "--lease-ttl", "30", "--concurrency", "4", "--grace", "20"],
        log=tmp_path / "worker.log",
    )  # fmt: skip
    try:
        async def four_running() -> bool:
            return await _open_attempts(db) == 4

        await waiting.until(four_running, timeout_s=30)
        worker.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(worker.wait(), 30) == 0
    finally:
        await processes.stop(worker)
    assert await _settled(db, len(job_ids))
    assert await db.fetchval("SELECT max(attempt) FROM extraction_jobs") == 1
