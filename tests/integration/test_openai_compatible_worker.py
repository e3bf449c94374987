"""
A worker whose pool is an OpenAI-compatible endpoint: a real HTTP model server (the stub)
that reads the document out of the prompt and answers like a model that extracts well.
"""

from __future__ import annotations

import itertools

import asyncpg
from aiohttp import web
from lading_worker import running

from lading import accepting
from lading.db import registry
from lading.ids import PoolName
from lading.settings import AttemptSettings, ClaimerSettings, LeaseSettings, ReaperSettings, WorkerProcessSettings
from lading_demo import generator
from tests.support import factories, model_stub, waiting


async def test_jobs_run_through_an_openai_compatible_endpoint_with_the_pool_key(
        db: asyncpg.Connection, dbpool: asyncpg.Pool
) -> None:
    samples = [s for s in generator.generate(40, seed=11) if s.expected_state != "FAILED_TERMINAL"][:20]
    async with model_stub.running(model_stub.extracting()) as stub:
        await factories.seed(db)
        await registry.upsert_pool(
            db,
            name=PoolName(factories.POOL),
            provider="openai-compatible",
            model="qwen",
            spec={"endpoint": {"url": stub.url, "apiKeySecretRef": {"name": "k", "key": "apiKey"}}},
        )
        request = factories.batch_request(count=0)
        documents = [accepting.DocumentInput(key=s.key, text=s.text) for s in samples]
        await accepting.accept_batch(db, accepting.BatchRequest(**{**request.__dict__, "documents": documents}))
        settings = WorkerProcessSettings(
            pool=factories.POOL,
            lease=LeaseSettings(ttl_s=30, heartbeat_interval_s=1),
            claimer=ClaimerSettings(concurrency=8, poll_interval_s=0.05),
            reaper=ReaperSettings(interval_s=0.5),
            attempt=AttemptSettings(timeout_s=10),
        )
        worker = running.Worker(dbpool, settings=settings, api_key="sk-test-key")

        async def settled() -> bool:
            return await db.fetchval(
                "SELECT count(*) FROM extraction_jobs WHERE state IN ('SUCCEEDED', 'REVIEW_REQUIRED')"
            ) == len(samples)

        async with waiting.running(worker.run):
            await waiting.until(settled, timeout_s=30)

    states = {r["document_key"]: r["state"] for r in await db.fetch("SELECT document_key, state FROM extraction_jobs")}
    assert states == {s.key: s.expected_state for s in samples}
    assert len(stub.requests) == len(samples)  # one request per job: no client retries
    assert {r.headers["Authorization"] for r in stub.requests} == {"Bearer sk-test-key"}
    assert {r.body["temperature"] for r in stub.requests} == {0}
    tokens = await db.fetch("SELECT tokens_in, tokens_out FROM job_attempts")
    assert all(r["tokens_in"] and r["tokens_out"] for r in tokens)
    assert stub.max_concurrent <= 8


async def _run_one(db: asyncpg.Connection, dbpool: asyncpg.Pool, stub: model_stub.ModelStub) -> None:
    await factories.seed(db)
    await registry.upsert_pool(
        db, name=PoolName(factories.POOL), provider="openai-compatible", model="qwen",
        spec={"endpoint": {"url": stub.url}},
    )  # fmt: skip
    await accepting.accept_batch(db, factories.batch_request(count=1, max_attempts=5))
    settings = WorkerProcessSettings(
        pool=factories.POOL,
        claimer=ClaimerSettings(concurrency=2, poll_interval_s=0.05),
        reaper=ReaperSettings(interval_s=0.5),
        attempt=AttemptSettings(timeout_s=10, backoff_base_s=0.01, backoff_cap_s=0.02),
    )

    async def in_review() -> bool:
        return await db.fetchval("SELECT state FROM extraction_jobs") == "REVIEW_REQUIRED"

    async with waiting.running(running.Worker(dbpool, settings=settings).run):
        await waiting.until(in_review, timeout_s=30)


async def test_the_same_malformed_output_twice_goes_to_review_instead_of_burning_the_budget(
        db: asyncpg.Connection, dbpool: asyncpg.Pool
) -> None:
    async with model_stub.running(model_stub.completion('{"invoice_number": ')) as stub:
        await _run_one(db, dbpool, stub)
    assert len(stub.requests) == 2
    row = await db.fetchrow("SELECT attempt, last_error_class FROM extraction_jobs")
    assert row is not None and (row["attempt"], row["last_error_class"]) == (2, "REPEATED_INVALID_OUTPUT")
    assert await db.fetchval("SELECT result->>'raw_output' FROM results") == '{"invoice_number": '


async def test_a_truncated_answer_is_retried_once_with_a_larger_output_budget(
        db: asyncpg.Connection, dbpool: asyncpg.Pool
) -> None:
    truncated = iter(['{"invoice_number": "A', '{"invoice_number": "AB'])

    async def reply(stub: model_stub.ModelStub, request: web.Request) -> web.StreamResponse:
        return web.json_response(model_stub.completion_body(next(truncated), finish_reason="length"))

    async with model_stub.running(reply) as stub:
        await _run_one(db, dbpool, stub)
    budgets = [r.body["max_tokens"] for r in stub.requests]
    assert len(budgets) == 2 and budgets[1] == 2 * budgets[0]
    assert await db.fetchval("SELECT last_error_class FROM extraction_jobs") == "OUTPUT_TRUNCATED_AGAIN"


async def test_a_refused_key_pauses_the_pool_without_spending_the_jobs_attempts(
        db: asyncpg.Connection, dbpool: asyncpg.Pool
) -> None:
    samples = [s for s in generator.generate(20, seed=5) if s.expected_state == "SUCCEEDED"][:5]
    async with model_stub.running(model_stub.status(401, headers={"Retry-After": "600"})) as stub:
        await factories.seed(db)
        await registry.upsert_pool(
            db, name=PoolName(factories.POOL), provider="openai-compatible", model="qwen",
            spec={"endpoint": {"url": stub.url}},
        )  # fmt: skip
        request = factories.batch_request(count=0, max_attempts=1)
        documents = [accepting.DocumentInput(key=s.key, text=s.text) for s in samples]
        await accepting.accept_batch(db, accepting.BatchRequest(**{**request.__dict__, "documents": documents}))
        settings = WorkerProcessSettings(
            pool=factories.POOL,
            claimer=ClaimerSettings(concurrency=1, batch_size=1, poll_interval_s=0.05),
            reaper=ReaperSettings(interval_s=0.5),
            attempt=AttemptSettings(timeout_s=10),
        )

        async def paused() -> bool:
            return bool(await db.fetchval("SELECT paused_until > clock_timestamp() FROM pools"))

        async with waiting.running(running.Worker(dbpool, settings=settings).run):
            await waiting.until(paused, timeout_s=30)
            # Paused: the claimer leaves the pool alone, however often it polls.
            assert await db.fetchval("SELECT count(*) FROM extraction_jobs WHERE state = 'READY'") == 4
        assert len(stub.requests) == 1
        refused = await db.fetchrow(
            "SELECT attempt, state, last_error_class FROM extraction_jobs WHERE state <> 'READY'"
        )
        assert refused is not None
        assert (refused["attempt"], refused["state"], refused["last_error_class"]) == (
            0, "RETRY_SCHEDULED", "AUTH_FAILED"
        )  # its one attempt was given back

        # The key is fixed and the pause lifted: every job, the refused one too, runs on its budget of 1.
        stub.reply = model_stub.extracting()
        await db.execute("UPDATE pools SET paused_until = NULL, paused_reason = NULL")
        await db.execute("UPDATE extraction_jobs SET available_at = clock_timestamp()")

        async def all_succeeded() -> bool:
            return await db.fetchval("SELECT count(*) FROM extraction_jobs WHERE state = 'SUCCEEDED'") == 5

        async with waiting.running(running.Worker(dbpool, settings=settings, api_key="fixed").run):
            await waiting.until(all_succeeded, timeout_s=30)
    assert await db.fetchval("SELECT max(attempt) FROM extraction_jobs") == 1


async def test_rate_limited_and_overloaded_attempts_are_given_back_not_counted(
        db: asyncpg.Connection, dbpool: asyncpg.Pool
) -> None:
    # A malformed first answer, then four refusals for congestion: with maxAttempts 2 the job
    # used to end FAILED_TERMINAL: ATTEMPTS_EXHAUSTED at its first 429.
    sample = next(s for s in generator.generate(20, seed=5) if s.expected_state == "SUCCEEDED")
    replies = iter([
        model_stub.completion("this is not json"),
        model_stub.rate_limited(retry_after="1"),
        model_stub.status(503, text="overloaded", headers={"Retry-After": "1"}),
        model_stub.rate_limited(retry_after="1"),
        model_stub.rate_limited(retry_after="1"),
    ])

    async def reply(stub: model_stub.ModelStub, request: web.Request) -> web.StreamResponse:
        return await next(replies, model_stub.extracting())(stub, request)

    async with model_stub.running(reply) as stub:
        await factories.seed(db)
        await registry.upsert_pool(
            db, name=PoolName(factories.POOL), provider="openai-compatible", model="qwen",
            spec={"endpoint": {"url": stub.url}},
        )  # fmt: skip
        request = factories.batch_request(count=0, max_attempts=2)
        documents = [accepting.DocumentInput(key=sample.key, text=sample.text)]
        await accepting.accept_batch(db, accepting.BatchRequest(**{**request.__dict__, "documents": documents}))
        settings = WorkerProcessSettings(
            pool=factories.POOL,
            claimer=ClaimerSettings(concurrency=2, poll_interval_s=0.05),
            reaper=ReaperSettings(interval_s=0.5),
            attempt=AttemptSettings(timeout_s=10, backoff_base_s=0.01, backoff_cap_s=0.02),
        )

        async def settled() -> bool:
            return await db.fetchval("SELECT state FROM extraction_jobs") in ("SUCCEEDED", "FAILED_TERMINAL")

        async with waiting.running(running.Worker(dbpool, settings=settings).run):
            await waiting.until(settled, timeout_s=60)
        arrivals = [r.received_at for r in stub.requests]

    job = await db.fetchrow("SELECT state, attempt, last_error_class FROM extraction_jobs")
    assert job is not None and (job["state"], job["attempt"]) == ("SUCCEEDED", 2)
    attempts = await db.fetch("SELECT outcome, error_class FROM job_attempts ORDER BY fence")
    assert [(a["outcome"], a["error_class"]) for a in attempts] == [
        ("invalid-output", "MALFORMED_OUTPUT"),
        ("transient", "RATE_LIMITED"),
        ("transient", "SERVER_OVERLOADED"),
        ("transient", "RATE_LIMITED"),
        ("transient", "RATE_LIMITED"),
        ("ok", None),
    ]  # every attempt recorded; only two counted
    # Each refusal cooled the pool for its Retry-After: nothing was sent again before it ended.
    gaps = [later - earlier for earlier, later in itertools.pairwise(arrivals[1:])]
    assert len(gaps) == 4 and min(gaps) >= 0.95
