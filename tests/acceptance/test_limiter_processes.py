"""
Three real worker processes, 100 concurrent attempts each, against one stub model server that
enforces the same limits as the pool: the shared limiter keeps them together within the limits
(no 429 ever), and a 429 the server forces pauses every worker until its cooldown ends.
"""

from __future__ import annotations

import contextlib
import pathlib
from collections.abc import AsyncIterator

import asyncpg
import pytest

from lading import accepting
from lading.db import registry
from lading.ids import PoolName
from tests.support import factories, processes, stub_model, waiting

pytestmark = pytest.mark.slow

POOL = PoolName(factories.POOL)
FAST = ["--poll-interval", "0.1", "--backoff-base", "0.05", "--concurrency", "100"]


async def _setup(db: asyncpg.Connection, *, url: str, rpm: int, concurrency: int, documents: int) -> None:
    await factories.seed(db)
    await registry.upsert_pool(
        db, name=POOL, provider="openai-compatible", model="stub-model",
        spec={"endpoint": {"url": url},
              "limits": {"requestsPerMinute": rpm, "tokensPerMinute": 100_000_000, "maxConcurrency": concurrency}},
    )  # fmt: skip
    await accepting.accept_batch(db, factories.batch_request(count=documents))


@contextlib.asynccontextmanager
async def workers(database_url: str, log_dir: pathlib.Path, n: int = 3) -> AsyncIterator[None]:
    started = [
        await processes.start_worker(database_url, POOL, args=FAST, log=log_dir / f"worker-{i}.log") for i in range(n)
    ]
    try:
        yield
    finally:
        for process in started:
            await processes.stop(process)


async def test_three_workers_together_stay_within_the_pools_limits(
        db: asyncpg.Connection, database_url: str, tmp_path: pathlib.Path
) -> None:
    # 600 requests/min is paced to 10 grants in any second; unthrottled, these workers would send 80
    # a second. The server enforces the minute, the concurrency and (like hosted APIs do, loosely)
    # a short-period rate; network jitter between a grant and its arrival may bunch a few.
    rpm, per_second, concurrency = 600, 10, 4
    limits = ("--rpm", str(rpm), "--rps", str(2 * per_second), "--concurrency", str(concurrency))
    async with stub_model.running("--latency-ms", "50", *limits) as stub:
        await _setup(db, url=stub.url, rpm=rpm, concurrency=concurrency, documents=300)
        async with workers(database_url, tmp_path):

            async def served_and_others_waiting() -> bool:
                waiting_jobs = await db.fetchval("SELECT count(*) FROM extraction_jobs WHERE state = 'RUNNING'")
                return (await stub.stats())["requests"] >= 5 * per_second and waiting_jobs >= 200

            await waiting.until(served_and_others_waiting, timeout_s=60)
            claimers = await db.fetchval("SELECT count(DISTINCT worker_id) FROM job_attempts")
        stats = await stub.stats()
    most_in_a_second = await db.fetchval(
        "SELECT max((SELECT count(*) FROM limiter_permits q"
        "             WHERE q.acquired_at > p.acquired_at - interval '1 second' AND q.acquired_at <= p.acquired_at))"
        "  FROM limiter_permits p"
    )
    assert claimers == 3  # all three workers took part
    assert most_in_a_second == per_second  # the pace was reached, never passed, across all three
    assert stats["statuses"].get("429", 0) == 0  # the server never had to refuse anything
    assert stats["max_concurrent"] <= concurrency


async def test_a_forced_429_pauses_every_worker_until_the_cooldown_ends(
        db: asyncpg.Connection, database_url: str, tmp_path: pathlib.Path
) -> None:
    cooldown_s = 3
    async with stub_model.running("--latency-ms", "100", "--concurrency", "8") as stub:
        await _setup(db, url=stub.url, rpm=100_000, concurrency=8, documents=600)
        async with workers(database_url, tmp_path):

            async def requests_at_least(n: int) -> bool:
                return (await stub.stats())["requests"] >= n

            await waiting.until(lambda: requests_at_least(10), timeout_s=60)
            await stub.fault("429", retry_after=cooldown_s)

            async def answered_429() -> bool:
                return (await stub.stats())["statuses"].get("429", 0) == 1

            await waiting.until(answered_429, timeout_s=30, every_s=0.02)

            async def cooling() -> bool:
                return await db.fetchval("SELECT cooldown_until IS NOT NULL FROM pools WHERE name = $1", POOL)

            await waiting.until(cooling, timeout_s=30, every_s=0.02)
            cooldown_until = await db.fetchval(
                "SELECT extract(epoch FROM cooldown_until)::float8 FROM pools WHERE name = $1", POOL
            )
            before = (await stub.stats())["requests"]
            await waiting.until(lambda: requests_at_least(before + 10), timeout_s=60)  # work resumed
        arrivals = (await stub.stats())["arrivals"]
    cooling_from = cooldown_until - cooldown_s
    # No replica was granted a permit while the pool cooled down ...
    granted_while_cooling = await db.fetchval(
        "SELECT count(*) FROM limiter_permits WHERE acquired_at > to_timestamp($1) AND acquired_at < to_timestamp($2)",
        cooling_from + 0.05, cooldown_until,
    )
    assert granted_while_cooling == 0
    # ... so, once calls already on the wire have landed, nothing reached the server until it ended.
    assert [t for t in arrivals if cooling_from + 1.0 < t < cooldown_until - 0.1] == []
    assert any(t >= cooldown_until for t in arrivals)
