"""The Worker in-process: attempts run concurrently, commit under the fence, drain on stop."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest
from lading_worker import running

from lading import accepting
from lading.db import jobs
from lading.ids import WorkerId
from lading.providers import base
from lading.settings import AttemptSettings, ClaimerSettings, LeaseSettings, ReaperSettings, WorkerProcessSettings
from tests.support import factories, providers, waiting

TERMINAL_OUTCOME = base.Outcome.failed(base.OutcomeClass.TERMINAL, error_class="UNREADABLE_DOCUMENT", error="x")


def _settings(**overrides: object) -> WorkerProcessSettings:
    defaults: dict[str, object] = {
        "pool": factories.POOL,
        "lease": LeaseSettings(ttl_s=10, heartbeat_interval_s=0.05),
        "claimer": ClaimerSettings(concurrency=20, batch_size=10, poll_interval_s=0.05),
        "reaper": ReaperSettings(interval_s=0.05),
        "attempt": AttemptSettings(backoff_base_s=0.01, backoff_cap_s=0.02, timeout_s=5),
        "shutdown_grace_s": 5.0,
    }
    defaults.update(overrides)
    return WorkerProcessSettings(**defaults)  # type: ignore[arg-type]


async def _states(db: asyncpg.Connection) -> dict[str, int]:
    rows = await db.fetch("SELECT state, count(*)::int AS n FROM extraction_jobs GROUP BY state")
    return {r["state"]: r["n"] for r in rows}


async def test_a_worker_settles_every_job_with_bounded_concurrency(
        db: asyncpg.Connection, dbpool: asyncpg.Pool
) -> None:
    await factories.seed(db)
    await accepting.accept_batch(db, factories.batch_request(count=60))
    in_flight, peak = 0, 0

    def reply(_: base.Document) -> base.Outcome:
        return TERMINAL_OUTCOME

    class Counting(providers.ScriptedProvider):
        async def extract(self, document: base.Document, *, schema: str, policy: str) -> base.Outcome:
            nonlocal in_flight, peak
            in_flight += 1
            peak = max(peak, in_flight)
            try:
                await asyncio.sleep(0.02)
                return reply(document)
            finally:
                in_flight -= 1

    worker = running.Worker(dbpool, settings=_settings(), provider=Counting(reply))
    async with waiting.running(worker.run):
        await waiting.until(lambda: _all_settled(db, 60), timeout_s=30)
    assert await _states(db) == {"FAILED_TERMINAL": 60}
    assert 1 < peak <= 20
    assert await db.fetchval("SELECT count(*) FROM job_attempts WHERE outcome = 'terminal'") == 60


async def _all_settled(db: asyncpg.Connection, n: int) -> bool:
    return await db.fetchval(
        "SELECT count(*) FROM extraction_jobs WHERE state IN ('SUCCEEDED','FAILED_TERMINAL','REVIEW_REQUIRED')"
    ) == n


async def test_transient_failures_are_retried_and_the_attempt_history_is_kept(
        db: asyncpg.Connection, dbpool: asyncpg.Pool
) -> None:
    await factories.seed(db)
    await accepting.accept_batch(db, factories.batch_request(count=1, max_attempts=3))
    provider = providers.ScriptedProvider(
        providers.always(base.Outcome.failed(base.OutcomeClass.TRANSIENT, error_class="RateLimited", error="429"))
    )
    async with waiting.running(running.Worker(dbpool, settings=_settings(), provider=provider).run):
        await waiting.until(lambda: _all_settled(db, 1), timeout_s=30)
    row = await db.fetchrow("SELECT state, attempt, last_error_class FROM extraction_jobs")
    assert row is not None
    assert (row["state"], row["attempt"], row["last_error_class"]) == ("FAILED_TERMINAL", 3, "ATTEMPTS_EXHAUSTED")
    outcomes = await db.fetch("SELECT outcome, error_class FROM job_attempts ORDER BY fence")
    assert [(r["outcome"], r["error_class"]) for r in outcomes] == [("transient", "RateLimited")] * 2 + [
        ("transient", "ATTEMPTS_EXHAUSTED")
    ]
    assert len(provider.calls) == 3


async def test_an_invalid_answer_is_retried_at_once_whatever_the_backoff(
        db: asyncpg.Connection, dbpool: asyncpg.Pool
) -> None:
    # A retry policy whose backoff would wait up to an hour: a transient failure would not be tried
    # again within this test's wait, an answer that failed validation is.
    await factories.seed(db)
    await accepting.accept_batch(db, factories.batch_request(count=1, max_attempts=3))
    answers = iter([
        base.Outcome.failed(base.OutcomeClass.INVALID_OUTPUT, error_class="MALFORMED_OUTPUT", error="not JSON",
                            raw_output="{oops"),
        TERMINAL_OUTCOME,
    ])  # fmt: skip
    provider = providers.ScriptedProvider(lambda _: next(answers))
    settings = _settings(attempt=AttemptSettings(backoff_base_s=3600, backoff_cap_s=3600, timeout_s=5))
    async with waiting.running(running.Worker(dbpool, settings=settings, provider=provider).run):
        await waiting.until(lambda: _all_settled(db, 1), timeout_s=30)
    outcomes = await db.fetch("SELECT outcome, error_class FROM job_attempts ORDER BY fence")
    assert [(r["outcome"], r["error_class"]) for r in outcomes] == [
        ("invalid-output", "MALFORMED_OUTPUT"), ("terminal", "UNREADABLE_DOCUMENT")
    ]
    assert len(provider.calls) == 2


async def test_an_attempt_whose_lease_is_lost_is_cancelled_and_never_commits(
        db: asyncpg.Connection, dbpool: asyncpg.Pool
) -> None:
    await factories.seed(db)
    result = await accepting.accept_batch(db, factories.batch_request(count=1))
    gate = asyncio.Event()
    provider = providers.ScriptedProvider(providers.always(TERMINAL_OUTCOME), gate=gate)
    async with waiting.running(running.Worker(dbpool, settings=_settings(), provider=provider).run):
        await asyncio.wait_for(provider.started.wait(), 10)
        await jobs.cancel(db, job_id=result.job_ids[0], reason="batch deleted")

        async def cancelled() -> bool:
            return provider.cancelled == 1

        await waiting.until(cancelled, timeout_s=10)
        gate.set()
    assert await db.fetchval("SELECT state FROM extraction_jobs") == "CANCELLED"
    assert await db.fetchval("SELECT count(*) FROM job_attempts WHERE finished_at IS NOT NULL") == 0
    assert await db.fetchval("SELECT count(*) FROM stale_completions") == 0


async def test_stop_drains_in_flight_attempts_before_returning(
        db: asyncpg.Connection, dbpool: asyncpg.Pool
) -> None:
    await factories.seed(db)
    await accepting.accept_batch(db, factories.batch_request(count=5))
    gate = asyncio.Event()
    provider = providers.ScriptedProvider(providers.always(TERMINAL_OUTCOME), gate=gate)
    stop = asyncio.Event()
    worker = running.Worker(dbpool, settings=_settings(), provider=provider)
    task = asyncio.create_task(worker.run(stop))
    try:
        async def five_running() -> bool:
            return len(provider.calls) == 5

        await waiting.until(five_running, timeout_s=10)
        stop.set()
        # The worker stopped claiming and waits for its attempts; it has not returned.
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(asyncio.shield(task), 0.3)
        gate.set()
    finally:
        stop.set()
        gate.set()
        await asyncio.wait_for(task, 10)
    assert await _states(db) == {"FAILED_TERMINAL": 5}


async def test_attempts_still_running_after_the_grace_period_are_left_to_lease_expiry(
        db: asyncpg.Connection, dbpool: asyncpg.Pool
) -> None:
    await factories.seed(db)
    await accepting.accept_batch(db, factories.batch_request(count=2))
    provider = providers.ScriptedProvider(providers.always(TERMINAL_OUTCOME), gate=asyncio.Event())
    async with waiting.running(running.Worker(dbpool, settings=_settings(shutdown_grace_s=0.1), provider=provider).run):

        async def two_running() -> bool:
            return len(provider.calls) == 2

        await waiting.until(two_running, timeout_s=10)
    assert await _states(db) == {"RUNNING": 2}
    assert provider.cancelled == 2


async def test_prefetched_jobs_wait_for_a_slot_and_are_released_unstarted_on_stop(
        db: asyncpg.Connection, dbpool: asyncpg.Pool
) -> None:
    await factories.seed(db)
    await accepting.accept_batch(db, factories.batch_request(count=10))
    gate = asyncio.Event()
    provider = providers.ScriptedProvider(providers.always(TERMINAL_OUTCOME), gate=gate)
    settings = _settings(claimer=ClaimerSettings(concurrency=2, batch_size=10, prefetch=3, poll_interval_s=0.05))
    stop = asyncio.Event()
    task = asyncio.create_task(running.Worker(dbpool, settings=settings, provider=provider).run(stop))
    try:
        async def five_claimed_two_running() -> bool:
            claimed = await db.fetchval("SELECT count(*) FROM extraction_jobs WHERE state = 'RUNNING'")
            return claimed == 5 and len(provider.calls) == 2

        await waiting.until(five_claimed_two_running, timeout_s=10)  # three wait, claimed ahead
        stop.set()

        async def three_released() -> bool:
            return await db.fetchval("SELECT count(*) FROM job_attempts WHERE outcome = 'cancelled'") == 3

        await waiting.until(three_released, timeout_s=10)
        gate.set()
        await asyncio.wait_for(task, 10)
    finally:
        stop.set()
        gate.set()
        await asyncio.wait_for(task, 10)
    assert len(provider.calls) == 2
    assert await _states(db) == {"FAILED_TERMINAL": 2, "RETRY_SCHEDULED": 3, "READY": 5}
    released = await db.fetch("SELECT attempt, fence FROM extraction_jobs WHERE state = 'RETRY_SCHEDULED'")
    assert {(r["attempt"], r["fence"]) for r in released} == {(0, 2)}  # the unstarted attempt given back
    claimable = await jobs.claim_batch(db, pool=factories.POOL, worker_id=WorkerId("next"), limit=10, lease_ttl_s=5)
    assert len(claimable) == 8


async def test_slots_refill_from_the_prefetch_queue_until_every_job_is_done(
        db: asyncpg.Connection, dbpool: asyncpg.Pool
) -> None:
    await factories.seed(db)
    await accepting.accept_batch(db, factories.batch_request(count=40))
    in_flight, peak = 0, 0

    class Counting(providers.ScriptedProvider):
        async def extract(self, document: base.Document, *, schema: str, policy: str) -> base.Outcome:
            nonlocal in_flight, peak
            in_flight += 1
            peak = max(peak, in_flight)
            try:
                await asyncio.sleep(0.01)
                return TERMINAL_OUTCOME
            finally:
                in_flight -= 1

    settings = _settings(claimer=ClaimerSettings(concurrency=4, batch_size=8, prefetch=8, poll_interval_s=0.05))
    worker = running.Worker(dbpool, settings=settings, provider=Counting(providers.always(TERMINAL_OUTCOME)))
    async with waiting.running(worker.run):
        await waiting.until(lambda: _all_settled(db, 40), timeout_s=30)
    assert peak == 4
    assert await db.fetchval("SELECT max(attempt) FROM extraction_jobs") == 1
