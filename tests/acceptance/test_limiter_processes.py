"""
Three real worker processes, 100 concurrent attempts each, against one stub model server that
enforces the same limits as the pool: the shared limiter keeps them together within the limits
(no 429 ever), and a 429 the server forces pauses every worker until its cooldown ends.

The hosted-API tests run the stub the way hosted APIs count (a request counts prompt +
max_tokens when it arrives, for the whole window, refused requests too) over a window scaled
down to 6 s; the workers scale their minute the same way (`LADING_LIMITER_MINUTE_S`).
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
from lading_demo import generator
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
async def workers(
        database_url: str, log_dir: pathlib.Path, n: int = 3, *, minute_s: float | None = None
) -> AsyncIterator[None]:
    env = {} if minute_s is None else {"LADING_LIMITER_MINUTE_S": str(minute_s)}
    started = [
        await processes.start_worker(database_url, POOL, args=FAST, log=log_dir / f"worker-{i}.log", env=env)
        for i in range(n)
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


MINUTE_S = 6
"""The scaled minute of the hosted-API tests: the stub's window and the workers' minute."""


async def _setup_invoices(
        db: asyncpg.Connection, *, url: str, rpm: int, tpm: int, concurrency: int, documents: int, max_attempts: int
) -> None:
    await factories.seed(db)
    await registry.upsert_pool(
        db, name=POOL, provider="openai-compatible", model="stub-model",
        spec={"endpoint": {"url": url},
              "limits": {"requestsPerMinute": rpm, "tokensPerMinute": tpm, "maxConcurrency": concurrency,
                         "tokenAccounting": "reserved"}},
    )  # fmt: skip
    request = factories.batch_request(count=0, max_attempts=max_attempts)
    texts = [s.text for s in generator.generate(documents, seed=3)]
    inputs = [accepting.DocumentInput(key=f"inv-{i:04d}", text=t) for i, t in enumerate(texts)]
    batch = accepting.BatchRequest(**{**request.__dict__, "documents": inputs})
    await accepting.accept_batch(db, batch)


async def _all_settled(db: asyncpg.Connection) -> bool:
    return not await db.fetchval(
        "SELECT count(*) FROM extraction_jobs WHERE state IN ('READY', 'RUNNING', 'RETRY_SCHEDULED')"
    )


async def test_against_a_hosted_api_counting_reservations_nothing_is_refused(
        db: asyncpg.Connection, database_url: str, tmp_path: pathlib.Path
) -> None:
    # The tokens bind: each request reserves its prompt plus 4,096 output tokens (8,192 on the
    # retry after a truncated answer), and the stub counts exactly that, strictly. Reconciling a
    # reservation down to the usage the answer reported (as the limiter once did) draws 429s here.
    rpm, tpm, concurrency, documents, truncated = 60, 240_000, 16, 60, 12
    hosted = ("--accounting", "reserved", "--strict", "--window-s", str(MINUTE_S), "--latency-ms", "50",
              "--rpm", str(rpm), "--tpm", str(tpm), "--concurrency", str(concurrency))
    async with stub_model.running(*hosted) as stub:
        await stub.fault("truncated", count=truncated)
        await _setup_invoices(db, url=stub.url, rpm=rpm, tpm=tpm, concurrency=concurrency, documents=documents,
                              max_attempts=3)
        async with workers(database_url, tmp_path, minute_s=MINUTE_S):
            await waiting.until(lambda: _all_settled(db), timeout_s=180)
        stats = await stub.stats()
    failed = await db.fetch(
        "SELECT document_key, last_error_class FROM extraction_jobs WHERE state = 'FAILED_TERMINAL'"
    )
    limited = await db.fetchval("SELECT count(*) FROM job_attempts WHERE error_class = 'RATE_LIMITED'")
    assert stats["statuses"].get("429", 0) == 0 and stats["refusals"] == {}  # the server never had to refuse
    assert stats["bad_answers"] == {"truncated": truncated}
    # Each job truncated once was retried with a doubled budget (a retry truncated again is not retried).
    truncated_jobs = await db.fetchval(
        "SELECT count(DISTINCT job_id) FROM job_attempts WHERE error_class = 'OUTPUT_TRUNCATED'"
    )
    assert stats["budgets"]["8192"] == truncated_jobs >= truncated // 2
    assert stats["budgets"]["4096"] >= documents
    assert (failed, limited) == ([], 0)
    assert stats["max_window_tokens"] <= tpm and stats["max_window_requests"] <= rpm
    # The workers learned that the stub counts fewer prompt tokens than 3 characters per token
    # (it counts 4) and recorded it for the next worker to start from.
    factor = await db.fetchval("SELECT factor FROM limiter_estimates WHERE pool = $1 AND schema = 'invoice.v1'", POOL)
    assert factor is not None and 0.5 <= factor < 1.0


async def test_a_forced_429_storm_fails_no_job_and_every_job_finishes_after_it(
        db: asyncpg.Connection, database_url: str, tmp_path: pathlib.Path
) -> None:
    # Two attempts per job, and a storm of 429s longer than that: every refused attempt is given back.
    storm, documents, concurrency = 60, 60, 16
    hosted = ("--accounting", "reserved", "--strict", "--window-s", str(MINUTE_S), "--latency-ms", "50",
              "--concurrency", str(concurrency))
    async with stub_model.running(*hosted) as stub:
        await stub.fault("429", count=storm, retry_after=1)
        await _setup_invoices(db, url=stub.url, rpm=100_000, tpm=100_000_000, concurrency=concurrency,
                              documents=documents, max_attempts=2)
        async with workers(database_url, tmp_path, minute_s=MINUTE_S):
            await waiting.until(lambda: _all_settled(db), timeout_s=180)
        stats = await stub.stats()
    assert stats["statuses"].get("429", 0) == storm and stats["faults_left"] == 0
    states = dict(await db.fetch("SELECT state, count(*) FROM extraction_jobs GROUP BY state"))
    assert "FAILED_TERMINAL" not in states and sum(states.values()) == documents
    limited = await db.fetchval("SELECT count(*) FROM job_attempts WHERE error_class = 'RATE_LIMITED'")
    assert limited == storm  # each refusal recorded as an attempt ...
    most = await db.fetchval("SELECT max(n) FROM (SELECT count(*) AS n FROM job_attempts GROUP BY job_id) a")
    assert most > 2  # ... and some job was refused more often than its budget of two allows
    assert await db.fetchval("SELECT max(attempt) FROM extraction_jobs") <= 2
    # Every job finished after the storm: the stub refused its first `storm` requests, and answered
    # every job after them.
    assert stats["statuses"].get("200", 0) >= documents
