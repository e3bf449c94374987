"""The distributed admission limiter against real PostgreSQL: several independent limiters
(one per simulated replica, each with its own connection pool) sharing one pool's limits."""

import asyncio
import itertools
from collections.abc import AsyncIterator

import asyncpg
import pytest

from lading import limiting, metrics
from lading.db import pool as dbpool
from lading.ids import JobId, PoolName
from lading.providers import base
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
    asking: list[int] = []
    original = lim.try_acquire_many

    async def counted(asked: list[tuple[JobId, int, int]]) -> tuple[list[limiting.Permit], limiting.Refusal | None]:
        asking.append(len(asked))
        return await original(asked)

    lim.try_acquire_many = counted  # type: ignore[method-assign]
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
