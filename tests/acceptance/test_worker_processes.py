"""
`lading worker --processes 2`: a real supervisor and its two real worker processes. They drain a
batch with every job completed once and /metrics adding both up; a worker process killed by
SIGKILL is restarted and its jobs are reclaimed after their lease; SIGTERM to the supervisor
drains both within the grace period and ends with status 0.
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import signal
import socket

import aiohttp
import asyncpg
import pytest
from prometheus_client import parser as prom_parser

from lading import accepting
from lading.db import registry
from lading.ids import PoolName
from lading_demo import generator
from tests.support import factories, processes, waiting

POOL = factories.POOL
FAST = ["--heartbeat-interval", "0.4", "--reaper-interval", "0.2", "--poll-interval", "0.1", "--backoff-base", "0.05"]

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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _get(port: int, path: str) -> tuple[int, str] | None:
    try:
        async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}{path}") as response:
            return response.status, await response.text()
    except aiohttp.ClientError:
        return None


def _sample_sum(text: str, name: str) -> float:
    return sum(
        sample.value
        for family in prom_parser.text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    )


async def _settled(db: asyncpg.Connection, n: int) -> bool:
    return await db.fetchval("SELECT count(*) FROM extraction_jobs WHERE state = 'SUCCEEDED'") == n


async def _assert_each_job_completed_once(db: asyncpg.Connection, n: int) -> None:
    assert await db.fetchval("SELECT count(*) FROM results") == n
    assert await db.fetchval("SELECT count(*) FROM outbox_events WHERE type = 'extraction.completed.v1'") == n
    assert await db.fetchval(
        "SELECT count(*) FROM results r JOIN extraction_jobs j ON j.id = r.job_id WHERE r.fence <> j.fence"
    ) == 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return pathlib.Path(f"/proc/{pid}/stat").exists() and " Z " not in pathlib.Path(f"/proc/{pid}/stat").read_text()


async def _stop_supervisor(supervisor: asyncio.subprocess.Process, children: set[int]) -> int:
    supervisor.send_signal(signal.SIGTERM)
    code = await asyncio.wait_for(supervisor.wait(), 60)
    assert not [pid for pid in children if _alive(pid)], "every worker process ended with its supervisor"
    return code


async def test_two_worker_processes_drain_a_batch_once_and_metrics_add_both_up(
        db: asyncpg.Connection, database_url: str, tmp_path: pathlib.Path
) -> None:
    job_ids = await _setup(db, count=40, latency_ms=100)
    port = _free_port()
    supervisor = await processes.start_worker(
        database_url, POOL, args=[*FAST, "--processes", "2", "--concurrency", "4", "--http", f"127.0.0.1:{port}"],
        log=tmp_path / "supervisor.log",
    )  # fmt: skip
    try:
        await waiting.until(lambda: _settled(db, len(job_ids)), timeout_s=120)
        children = processes.children_of(supervisor.pid)
        assert len(children) == 2
        # Both claimed (the builtin's 100 ms keep 2 slots each busy), and /metrics counts both.
        assert await db.fetchval("SELECT count(DISTINCT worker_id) FROM job_attempts") == 2

        async def metrics_counted_every_job() -> bool:
            answer = await _get(port, "/metrics")
            return answer is not None and _sample_sum(answer[1], "lading_attempts_finished_total") == len(job_ids)

        await waiting.until(metrics_counted_every_job, timeout_s=30)
        answer = await _get(port, "/metrics")
        assert answer is not None
        assert _sample_sum(answer[1], "lading_jobs_claimed_total") == len(job_ids)
        assert _sample_sum(answer[1], "lading_attempts_in_flight") == 0
        assert await _get(port, "/healthz") == (200, "2 of 2 worker processes running\n")
        assert await _get(port, "/readyz") == (200, "ok\n")
        assert await _stop_supervisor(supervisor, children) == 0
    finally:
        await processes.stop(supervisor)
    await _assert_each_job_completed_once(db, len(job_ids))
    assert await db.fetchval("SELECT max(attempt) FROM extraction_jobs") == 1


async def test_a_killed_worker_process_is_restarted_and_its_jobs_are_reclaimed_after_the_lease(
        db: asyncpg.Connection, database_url: str, tmp_path: pathlib.Path
) -> None:
    job_ids = await _setup(db, count=8, latency_ms=2500)
    port = _free_port()
    supervisor = await processes.start_worker(
        database_url, POOL,
        args=[*FAST, "--lease-ttl", "2", "--processes", "2", "--concurrency", "4", "--http", f"127.0.0.1:{port}"],
        log=tmp_path / "supervisor.log",
    )  # fmt: skip
    try:

        async def both_running_attempts() -> bool:
            held = await db.fetchval("SELECT count(DISTINCT worker_id) FROM job_attempts WHERE finished_at IS NULL")
            return held == 2 and len(processes.children_of(supervisor.pid)) == 2

        await waiting.until(both_running_attempts, timeout_s=60)
        doomed = min(processes.children_of(supervisor.pid))
        os.kill(doomed, signal.SIGKILL)

        async def restarted() -> bool:
            now = processes.children_of(supervisor.pid)
            return len(now) == 2 and doomed not in now

        await waiting.until(restarted, timeout_s=60)
        await waiting.until(lambda: _settled(db, len(job_ids)), timeout_s=120)

        async def healthy() -> bool:
            return await _get(port, "/healthz") == (200, "2 of 2 worker processes running\n")

        await waiting.until(healthy, timeout_s=30)
        assert await _stop_supervisor(supervisor, processes.children_of(supervisor.pid)) == 0
    finally:
        await processes.stop(supervisor)
    await _assert_each_job_completed_once(db, len(job_ids))
    # What the killed process held was rescued after its lease and completed once, by another.
    held = await db.fetch(
        "SELECT job_id, outcome FROM job_attempts WHERE worker_id LIKE '%-' || $1::text || '-%' ORDER BY job_id",
        str(doomed),
    )
    lost = [r["job_id"] for r in held if r["outcome"] != "ok"]
    assert lost and {r["outcome"] for r in held} <= {"ok", "lease-expired"}
    rescued = await db.fetch(
        "SELECT job_id, array_agg(outcome ORDER BY fence) AS outcomes FROM job_attempts GROUP BY job_id"
        " HAVING count(*) > 1 ORDER BY job_id"
    )
    assert [r["job_id"] for r in rescued] == lost
    assert {tuple(r["outcomes"]) for r in rescued} == {("lease-expired", "ok")}
    assert "restarting it in" in (tmp_path / "supervisor.log").read_text()


async def test_sigterm_to_the_supervisor_drains_every_worker_process_and_exits_0(
        db: asyncpg.Connection, database_url: str, tmp_path: pathlib.Path
) -> None:
    job_ids = await _setup(db, count=4, latency_ms=1500)
    supervisor = await processes.start_worker(
        database_url, POOL,
        args=[*FAST, "--lease-ttl", "30", "--processes", "2", "--concurrency", "4", "--grace", "20"],
        log=tmp_path / "supervisor.log",
    )  # fmt: skip
    try:

        async def four_running_in_two_processes() -> bool:
            row = await db.fetchrow(
                "SELECT count(*) AS attempts, count(DISTINCT worker_id) AS workers FROM job_attempts"
                " WHERE finished_at IS NULL"
            )
            return (row["attempts"], row["workers"]) == (4, 2)

        await waiting.until(four_running_in_two_processes, timeout_s=60)
        assert await _stop_supervisor(supervisor, processes.children_of(supervisor.pid)) == 0
    finally:
        await processes.stop(supervisor)
    assert await _settled(db, len(job_ids))
    assert await db.fetchval("SELECT max(attempt) FROM extraction_jobs") == 1
