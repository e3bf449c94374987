"""The distributed admission limiter against real PostgreSQL: several independent limiters
(one per simulated replica, each with its own connection pool) sharing one pool's limits."""

import asyncio
import dataclasses
import datetime as dt
import itertools
import math
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import asyncpg
import pytest
from lading_worker import executing

from lading import limiting, metrics
from lading.db import jobs as db_jobs
from lading.db import pool as dbpool
from lading.ids import BatchId, Fence, JobId, PoolName
from lading.providers import base
from lading.settings import AttemptSettings
from tests.support import factories, waiting

POOL = PoolName(factories.POOL)
_job_ids = itertools.count(1)
_made: list[limiting.PoolLimiter] = []


def limiter(db: asyncpg.Pool, *, rpm: int = 10_000, tpm: int = 10_000_000, concurrency: int = 1000,
            ttl_s: float = 60.0, burst_s: float = 60.0,
            accounting: limiting.TokenAccounting = limiting.TokenAccounting.RESERVED) -> limiting.PoolLimiter:
    made = limiting.PoolLimiter(
        db,
        pool=POOL,
        limits=limiting.Limits(requests_per_minute=rpm, tokens_per_minute=tpm, max_concurrency=concurrency,
                               token_accounting=accounting),
        settings=limiting.LimiterSettings(permit_ttl_s=ttl_s, concurrency_poll_s=0.01, burst_s=burst_s),
    )
    _made.append(made)
    return made


def counting_asks(lim: limiting.PoolLimiter) -> list[int]:
    """The sizes of the asks `lim`'s asker makes from now on (one query each)."""
    asked: list[int] = []
    original = lim._ask

    async def counted(batch: Sequence[Any]) -> Any:
        asked.append(len(batch))
        return await original(batch)

    lim._ask = counted  # type: ignore[method-assign]
    return asked


async def ask(lim: limiting.PoolLimiter, tokens: int = 100) -> limiting.Permit | limiting.Refusal:
    return await lim.try_acquire(job_id=JobId(next(_job_ids)), fence=1, tokens=tokens)


@pytest.fixture
async def replicas(db: asyncpg.Connection, database_url: str) -> AsyncIterator[list[asyncpg.Pool]]:
    await factories.seed(db)
    pools = [await dbpool.create_pool(database_url, min_size=1, max_size=10) for _ in range(3)]
    yield pools
    while _made:
        await _made.pop().close()  # their LISTEN connections go back before the pools close
    for p in pools:
        await p.close()


async def test_concurrency_is_never_exceeded_across_replicas(replicas: list[asyncpg.Pool]) -> None:
    limit = 7
    limiters = [limiter(p, concurrency=limit) for p in replicas]
    holding = 0
    most = 0
    release = asyncio.Event()  # the "model calls" hold their permits until the limit has been reached

    async def attempt(lim: limiting.PoolLimiter) -> None:
        nonlocal holding, most
        permit = await lim.acquire(job_id=JobId(next(_job_ids)), fence=1, tokens=10)
        holding += 1
        most = max(most, holding)
        await release.wait()
        await asyncio.sleep(0.005)
        holding -= 1
        await lim.release(permit, tokens_used=10)

    async with asyncio.timeout(60):
        tasks = [asyncio.create_task(attempt(limiters[i % 3])) for i in range(60)]

        async def saturated() -> bool:
            return holding == limit

        await waiting.until(saturated, timeout_s=30)
        release.set()
        await asyncio.gather(*tasks)
    assert most == limit  # reached, never passed


async def test_requests_per_minute_is_exact_across_replicas(replicas: list[asyncpg.Pool]) -> None:
    limiters = [limiter(p, rpm=25) for p in replicas]

    async def burst(lim: limiting.PoolLimiter) -> int:
        answers = [await ask(lim) for _ in range(20)]
        return sum(isinstance(a, limiting.Permit) for a in answers)

    granted = await asyncio.gather(*(burst(lim) for lim in limiters))
    assert sum(granted) == 25
    refusal = await ask(limiters[0])
    assert isinstance(refusal, limiting.Refusal) and refusal.reason == "requests"
    assert 0 < refusal.retry_in_s <= 1.0


async def test_requests_are_paced_over_the_minute(replicas: list[asyncpg.Pool]) -> None:
    limiters = [limiter(p, rpm=600, burst_s=1.0) for p in replicas]  # 10 per second
    answers = await asyncio.gather(*(ask(limiters[i % 3]) for i in range(30)))
    granted = sum(isinstance(a, limiting.Permit) for a in answers)
    refusals = {a.reason for a in answers if isinstance(a, limiting.Refusal)}
    assert granted == 10 and refusals == {"pace"}
    refusal = next(a for a in answers if isinstance(a, limiting.Refusal))
    assert 0 < refusal.retry_in_s <= 1.0


async def test_a_release_in_another_replica_wakes_a_waiting_acquirer(replicas: list[asyncpg.Pool]) -> None:
    holder, waiter = limiter(replicas[0], concurrency=1), limiter(replicas[1], concurrency=1)
    waiter.settings = limiting.LimiterSettings(concurrency_poll_s=30.0, burst_s=60)  # only a NOTIFY can wake it
    held = await holder.acquire(job_id=JobId(1), fence=1, tokens=1)
    waiting_task = asyncio.create_task(waiter.acquire(job_id=JobId(2), fence=1, tokens=1))

    async def refused_once() -> bool:
        return metrics.REGISTRY.get_sample_value(
            "lading_limiter_refusals_total", {"pool": POOL, "reason": "concurrency"}
        ) not in (None, refused_before)

    refused_before = metrics.REGISTRY.get_sample_value(
        "lading_limiter_refusals_total", {"pool": POOL, "reason": "concurrency"}
    )
    await waiting.until(refused_once, timeout_s=10)  # the waiter asked and was refused ...
    assert not waiting_task.done()
    await holder.release(held, tokens_used=1)  # ... then hears the other replica's release
    async with asyncio.timeout(10):
        assert (await waiting_task).tokens_reserved == 1


async def test_all_or_nothing_a_token_refusal_takes_no_request(
        replicas: list[asyncpg.Pool], db: asyncpg.Connection
) -> None:
    lim = limiter(replicas[0], rpm=100, tpm=1000)
    assert isinstance(await ask(lim, tokens=900), limiting.Permit)
    refusal = await ask(lim, tokens=200)
    assert isinstance(refusal, limiting.Refusal) and refusal.reason == "tokens"
    assert await limiting.usage(db, pool=POOL) == (1, 900, 1)


async def test_reconciling_returns_unused_tokens_and_timeouts_keep_theirs(
        replicas: list[asyncpg.Pool], db: asyncpg.Connection
) -> None:
    lim = limiter(replicas[0], tpm=1000)
    used = await ask(lim, tokens=600)
    ambiguous = await ask(lim, tokens=300)
    assert isinstance(used, limiting.Permit) and isinstance(ambiguous, limiting.Permit)
    await lim.release(used, tokens_used=150)  # the provider reported 150
    await lim.release(ambiguous, tokens_used=None)  # sent, no answer: may have been billed
    assert await limiting.usage(db, pool=POOL) == (2, 450, 0)
    assert isinstance(await ask(lim, tokens=550), limiting.Permit)  # room made by reconciling


async def test_permits_of_a_crashed_worker_expire(replicas: list[asyncpg.Pool], db: asyncpg.Connection) -> None:
    crashed = limiter(replicas[0], concurrency=2, ttl_s=0.5)
    for _ in range(2):
        assert isinstance(await ask(crashed), limiting.Permit)  # never released: the worker died
    survivor = limiter(replicas[1], concurrency=2)
    refusal = await ask(survivor)
    assert isinstance(refusal, limiting.Refusal) and refusal.reason == "concurrency"
    await waiting.until(lambda: _granted(survivor), timeout_s=10)


async def _granted(lim: limiting.PoolLimiter) -> bool:
    return isinstance(await ask(lim), limiting.Permit)


async def test_a_429_cools_every_replica_down(replicas: list[asyncpg.Pool]) -> None:
    first, second = limiter(replicas[0]), limiter(replicas[1])
    await first.cool_down(1.0)
    refusal = await ask(second)
    assert isinstance(refusal, limiting.Refusal) and refusal.reason == "cooldown"
    assert 0 < refusal.retry_in_s <= 1.0
    async with asyncio.timeout(10):
        permit = await second.acquire(job_id=JobId(1), fence=1, tokens=1)  # waits out the cooldown
    assert permit.tokens_reserved == 1


async def test_a_document_larger_than_the_minute_budget_is_still_admitted_alone(replicas: list[asyncpg.Pool]) -> None:
    lim = limiter(replicas[0], tpm=1000)
    async with asyncio.timeout(10):
        permit = await lim.acquire(job_id=JobId(1), fence=1, tokens=50_000)
    assert permit.tokens_reserved == 1000


async def test_changed_limits_reach_a_running_limiter(replicas: list[asyncpg.Pool], db: asyncpg.Connection) -> None:
    lim = limiter(replicas[0], concurrency=1)
    assert isinstance(await ask(lim), limiting.Permit)
    assert isinstance(await ask(lim), limiting.Refusal)
    await db.execute("UPDATE pools SET spec = $1 WHERE name = $2",
                     {"limits": {"requestsPerMinute": 10_000, "tokensPerMinute": 10_000_000, "maxConcurrency": 3}},
                     POOL)  # fmt: skip
    await lim.refresh_limits(db)  # what the limiter does by itself every prune_every_s
    assert lim.limits.max_concurrency == 3
    assert isinstance(await ask(lim), limiting.Permit)



async def test_one_query_grants_the_waiting_attempts_that_fit_in_arrival_order(
        replicas: list[asyncpg.Pool], db: asyncpg.Connection
) -> None:
    lim = limiter(replicas[0], tpm=1000)
    asked = [(JobId(next(_job_ids)), 1, t) for t in (300, 300, 600, 100)]
    permits, refusal = await lim.try_acquire_many(asked)
    # The first two fit; the third does not, and the fourth, which would, is not served before it.
    assert [p.tokens_reserved for p in permits] == [300, 300]
    assert refusal is not None and refusal.reason == "tokens"
    assert await limiting.usage(db, pool=POOL) == (2, 600, 2)


async def test_concurrent_attempts_in_one_process_are_granted_in_batches(
        replicas: list[asyncpg.Pool], db: asyncpg.Connection
) -> None:
    lim = limiter(replicas[0], rpm=50)
    asking = counting_asks(lim)
    async with asyncio.timeout(30):
        permits = await asyncio.gather(*(lim.acquire(job_id=JobId(i), fence=1, tokens=10) for i in range(40)))
    assert len({p.id for p in permits}) == 40
    assert len(asking) < 40 and max(asking) > 1  # fewer queries than grants
    assert await limiting.usage(db, pool=POOL) == (40, 400, 40)


async def test_the_per_second_rollup_agrees_with_the_permits(
        replicas: list[asyncpg.Pool], db: asyncpg.Connection
) -> None:
    lim = limiter(replicas[0], accounting=limiting.TokenAccounting.USED)
    permits = []
    for _ in range(30):
        permit = await ask(lim, tokens=100)
        assert isinstance(permit, limiting.Permit)
        permits.append(permit)
    for i, permit in enumerate(permits[:20]):
        await lim.release(permit, tokens_used=i)  # reconciled down (used accounting) ...
    await lim.release(permits[20], tokens_used=None)  # ... or the reservation kept
    rolled = await db.fetchrow("SELECT sum(requests) AS r, sum(tokens) AS t FROM limiter_seconds")
    logged = await db.fetchrow(
        "SELECT count(*) AS r, sum(coalesce(tokens_used, tokens_reserved)) AS t FROM limiter_permits"
    )
    assert (rolled["r"], rolled["t"]) == (logged["r"], logged["t"]) == (30, sum(range(20)) + 10 * 100)
    assert await limiting.usage(db, pool=POOL) == (30, sum(range(20)) + 1000, 9)


async def test_reserved_accounting_never_gives_a_reservation_back(replicas: list[asyncpg.Pool]) -> None:
    lim = limiter(replicas[0])
    permit = limiting.Permit(id=1, tokens_reserved=5000)
    reservation = limiting.Reservation(prompt_tokens=1000, output_tokens=4000)

    def counted(**usage: int | None) -> int | None:
        return lim.counted_tokens(permit, reservation, sent_and_lost=False, **usage)  # type: ignore[arg-type]

    assert counted(tokens_in=900, tokens_out=50) is None  # the provider counted 900 + 4000: less than reserved
    assert counted(tokens_in=1500, tokens_out=50) == 5500  # a longer prompt than estimated: counted in full
    assert counted(tokens_in=None, tokens_out=None) is None
    used = limiter(replicas[0], accounting=limiting.TokenAccounting.USED)
    assert used.counted_tokens(permit, reservation, tokens_in=900, tokens_out=50, sent_and_lost=False) == 950
    assert used.counted_tokens(permit, reservation, tokens_in=900, tokens_out=50, sent_and_lost=True) is None


async def test_the_providers_rate_limit_headers_tighten_the_local_view_until_they_reset(
        replicas: list[asyncpg.Pool], db: asyncpg.Connection
) -> None:
    lim = limiter(replicas[0], rpm=100, tpm=10_000)
    assert isinstance(await ask(lim, tokens=1000), limiting.Permit)
    # The provider has seen more than this pool sent (another client, or its own count): 500 left.
    added = await lim.observe(base.RateLimitView(remaining_tokens=500, tokens_reset_s=1.0,
                                                 remaining_requests=98, requests_reset_s=1.0))
    assert added == (1, 8500)
    assert (await limiting.usage(db, pool=POOL))[:2] == (100 - 98, 10_000 - 500)
    refusal = await ask(lim, tokens=1000)
    assert isinstance(refusal, limiting.Refusal) and refusal.reason == "tokens"
    assert await lim.observe(base.RateLimitView(remaining_tokens=9000)) == (0, 0)  # looser: changes nothing
    await waiting.until(lambda: _granted(lim), timeout_s=10)  # room again once the provider's window resets


async def test_a_cooldown_reports_how_long_the_pool_now_cools(replicas: list[asyncpg.Pool]) -> None:
    lim = limiter(replicas[0])
    assert 9 < await lim.cool_down(10.0) <= 10.0
    assert 9 < await lim.cool_down(1.0) <= 10.0  # a longer cooldown already set is kept


def _concurrency_refusals() -> float:
    return metrics.REGISTRY.get_sample_value(
        "lading_limiter_refusals_total", {"pool": POOL, "reason": "concurrency"}
    ) or 0.0


async def test_a_release_hands_its_slot_to_a_waiting_attempt_of_its_own_process_in_the_same_call(
        replicas: list[asyncpg.Pool], db: asyncpg.Connection
) -> None:
    # One slot, held here; an attempt waits here and one in another replica. Neither polls: only a
    # release can get them a permit.
    here, elsewhere = limiter(replicas[0], concurrency=1), limiter(replicas[1], concurrency=1)
    for lim in (here, elsewhere):
        lim.settings = limiting.LimiterSettings(concurrency_poll_s=30.0, burst_s=60)
    asked = counting_asks(here)
    held = await here.acquire(job_id=JobId(1), fence=1, tokens=1)
    refused_before = _concurrency_refusals()
    mine = asyncio.create_task(here.acquire(job_id=JobId(2), fence=1, tokens=1))
    theirs = asyncio.create_task(elsewhere.acquire(job_id=JobId(3), fence=1, tokens=1))

    async def both_refused() -> bool:
        return _concurrency_refusals() >= refused_before + 2

    await waiting.until(both_refused, timeout_s=10)
    asks_before = len(asked)
    await here.release(held, tokens_used=1)
    async with asyncio.timeout(10):
        permit = await mine  # granted by the release itself ...
    assert len(asked) == asks_before  # ... without an ask of its own
    assert not theirs.done()  # the slot was never free: the other replica was not woken
    assert await limiting.usage(db, pool=POOL) == (2, 2, 1)
    await here.release(permit, tokens_used=1)  # nothing waits here: the slot is freed for every replica
    async with asyncio.timeout(10):
        assert (await theirs).tokens_reserved == 1


async def test_a_permit_a_release_grants_to_an_attempt_cancelled_meanwhile_goes_back(
        replicas: list[asyncpg.Pool], db: asyncpg.Connection
) -> None:
    lim = limiter(replicas[0], concurrency=1)
    lim.settings = limiting.LimiterSettings(concurrency_poll_s=30.0, burst_s=60)
    held = await lim.acquire(job_id=JobId(1), fence=1, tokens=1)
    refused_before = _concurrency_refusals()
    cancelled = asyncio.create_task(lim.acquire(job_id=JobId(2), fence=1, tokens=1))

    async def refused() -> bool:
        return _concurrency_refusals() > refused_before

    await waiting.until(refused, timeout_s=10)
    releasing = asyncio.create_task(lim.release(held, tokens_used=1))
    await asyncio.sleep(0)  # the release has taken the waiting attempt into its ask ...
    cancelled.cancel()  # ... which is cancelled before the answer (lease lost, shutdown)
    await releasing
    with pytest.raises(asyncio.CancelledError):
        await cancelled

    async def nothing_in_flight() -> bool:
        return (await limiting.usage(db, pool=POOL))[2] == 0

    await waiting.until(nothing_in_flight, timeout_s=10)  # the permit it was granted went back
    assert (await limiting.usage(db, pool=POOL))[0] == 2


async def test_a_replica_that_keeps_its_slot_busy_does_not_starve_another_replicas_attempt(
        replicas: list[asyncpg.Pool], db: asyncpg.Connection
) -> None:
    busy, other = limiter(replicas[0], concurrency=1), limiter(replicas[1], concurrency=1)
    busy.settings = limiting.LimiterSettings(concurrency_poll_s=30.0, burst_s=60, handoff_streak=3)
    other.settings = limiting.LimiterSettings(concurrency_poll_s=30.0, burst_s=60)
    stop = asyncio.Event()

    async def attempts() -> None:  # three attempts at a time, each released as soon as it is granted
        while not stop.is_set():
            permit = await busy.acquire(job_id=JobId(next(_job_ids)), fence=1, tokens=1)
            await busy.release(permit, tokens_used=1)

    loops = [asyncio.create_task(attempts()) for _ in range(3)]

    async def cycling() -> bool:
        return bool(await db.fetchval("SELECT count(*) >= 20 FROM limiter_permits"))

    await waiting.until(cycling, timeout_s=20)
    async with asyncio.timeout(20):
        permit = await other.acquire(job_id=JobId(0), fence=1, tokens=1)  # let in at the end of a streak
    stop.set()
    await other.release(permit, tokens_used=1)
    async with asyncio.timeout(20):
        await asyncio.gather(*loops)


async def test_what_one_worker_learned_of_the_providers_count_is_where_the_next_one_starts(
        replicas: list[asyncpg.Pool]
) -> None:
    first = limiter(replicas[0])
    estimated = limiting.Reservation(prompt_tokens=1000, output_tokens=500)
    reserved = await first.estimate(estimated, schema="invoice.v1")
    assert (reserved.prompt_tokens, reserved.estimated_prompt_tokens) == (1000, 1000)  # nothing learned: the estimate
    for reported in (740, 750, 745, 730, 748, 742, 739):  # the provider counts about 3/4 of the estimate ...
        first.learn(await first.estimate(estimated, schema="invoice.v1"), schema="invoice.v1", tokens_in=reported)
    assert (await first.estimate(estimated, schema="invoice.v1")).prompt_tokens == 1000  # ... not enough answers yet
    first.learn(await first.estimate(estimated, schema="invoice.v1"), schema="invoice.v1", tokens_in=744)
    learned = await first.estimate(estimated, schema="invoice.v1")
    assert (learned.prompt_tokens, learned.output_tokens) == (math.ceil(1000 * 0.75 * 1.01), 500)
    await first.close()  # records what it learned
    second = limiter(replicas[1])
    assert (await second.estimate(estimated, schema="invoice.v1")).prompt_tokens == learned.prompt_tokens
    assert (await second.estimate(estimated, schema="invoice.v2")).prompt_tokens == 1000  # another schema: not learned


class _HostedProvider:
    """Estimates its request at 400 + 100 tokens; the provider counts 300 for the prompt and says, in
    its x-ratelimit-* headers, that less is left of its minute than the limiter counts."""

    max_output_tokens = 100

    def reservation(self, document: base.Document, *, schema: str, policy: str) -> limiting.Reservation:
        return limiting.Reservation(prompt_tokens=400, output_tokens=100)

    async def extract(self, document: base.Document, *, schema: str, policy: str) -> base.Outcome:
        answer = base.Outcome.ok({}, tokens_in=300, tokens_out=20)
        return dataclasses.replace(answer, rate_limit=base.RateLimitView(remaining_tokens=900_000, tokens_reset_s=30))


async def test_an_attempt_learns_the_providers_prompt_count_and_its_rate_limit_headers_tighten_the_window(
        replicas: list[asyncpg.Pool], db: asyncpg.Connection
) -> None:
    lim = limiter(replicas[0], tpm=1_000_000)
    executor = executing.Executor(provider=_HostedProvider(), settings=AttemptSettings(timeout_s=5), limiter=lim)
    for i in range(limiting.ESTIMATE_MIN_SAMPLES + 1):
        job = dataclasses.replace(_claimed(), id=JobId(i + 1))
        await executor.run(job, claimed_mono=time.monotonic())
    reserved = [r["tokens_reserved"] for r in await db.fetch("SELECT tokens_reserved FROM limiter_permits ORDER BY id")]
    # The first eight reserve the estimate; the ninth what the provider counted (300 of 400) plus 1 %.
    assert reserved == [500] * limiting.ESTIMATE_MIN_SAMPLES + [math.ceil(400 * 0.75 * 1.01) + 100]
    # After the first call the headers said 900,000 of the minute's 1,000,000 tokens were left: the
    # window counts the 100,000 the provider counted, not only this pool's 500; later answers said
    # no less than the window already counted.
    requests, tokens, in_flight = await limiting.usage(db, pool=POOL)
    assert (requests, in_flight) == (9, 0) and tokens == 100_000 + 7 * 500 + reserved[-1]


def _claimed() -> db_jobs.ClaimedJob:
    now = dt.datetime.now(dt.UTC)
    return db_jobs.ClaimedJob(
        id=JobId(1), tenant="acme", batch_id=BatchId(1), document_key="k", attempt=1, max_attempts=5,
        fence=Fence(1), lease_until=now, deadline_at=now + dt.timedelta(hours=1), schema="invoice.v1",
        validation_policy="invoice-strict-v1", pool=POOL, text="text", claimed_at=now,
    )  # fmt: skip
