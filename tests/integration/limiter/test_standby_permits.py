"""Standby permits (`LimiterSettings.standby_s`): while every slot is in use, an attempt waiting in a
process holding slots is granted a standby permit (a request and its tokens, no slot), and the slot
of a call ending in that process goes to it in memory; the database records the change of hands
in one statement, without the pool's row lock. Against real PostgreSQL."""

import asyncio
from collections.abc import AsyncIterator

import asyncpg
import pytest

from lading import limiting
from lading.db import pool as dbpool
from lading.ids import JobId, PoolName
from tests.support import factories, waiting

POOL = PoolName(factories.POOL)


@pytest.fixture
async def one_slot(db: asyncpg.Connection, database_url: str) -> AsyncIterator[limiting.PoolLimiter]:
    """A limiter of a pool with one slot whose asker never polls: only releases move it."""
    await factories.seed(db)
    pool = await dbpool.create_pool(database_url, min_size=1, max_size=10)
    made = limiting.PoolLimiter(
        pool, pool=POOL,
        limits=limiting.Limits(requests_per_minute=10_000, tokens_per_minute=10_000_000, max_concurrency=1),
        settings=limiting.LimiterSettings(concurrency_poll_s=30.0, burst_s=60, standby_s=30.0),
    )  # fmt: skip
    yield made
    await made.close()
    await pool.close()


async def _standby_of(db: asyncpg.Connection, job: int) -> int | None:
    """The standby permit of job `job`: granted, holding no slot, not given back."""
    found: int | None = await db.fetchval(
        "SELECT id FROM limiter_permits WHERE job_id = $1 AND expires_at <= acquired_at AND released_at IS NULL", job
    )
    return found


async def _held_once(lim: limiting.PoolLimiter) -> None:
    """One call held and ended: the limiter knows how long calls hold a slot here (about nothing)."""
    await lim.release(await lim.acquire(job_id=JobId(100), fence=1, tokens=1), tokens_used=1)


async def test_a_slot_ending_here_goes_to_the_standby_permit_of_a_waiting_attempt_without_a_grant(
        one_slot: limiting.PoolLimiter, db: asyncpg.Connection
) -> None:
    await _held_once(one_slot)
    held = await one_slot.acquire(job_id=JobId(1), fence=1, tokens=1)
    waiting_attempt = asyncio.create_task(one_slot.acquire(job_id=JobId(2), fence=1, tokens=7))

    async def standby_granted() -> bool:
        return await _standby_of(db, 2) is not None

    await waiting.until(standby_granted, timeout_s=10)
    standby = await _standby_of(db, 2)
    assert await limiting.usage(db, pool=POOL) == (3, 9, 1)  # a request and its tokens; no slot
    async with db.transaction():
        # Every grant locks the pool's row first: with it locked here, no grant can be made.
        await db.execute("SELECT 1 FROM pools WHERE name = $1 FOR UPDATE", POOL)
        async with asyncio.timeout(10):
            await one_slot.release(held, tokens_used=1)
            permit = await waiting_attempt
    assert permit.id == standby
    in_flight = await db.fetch("SELECT job_id FROM limiter_permits WHERE released_at IS NULL AND expires_at > now()")
    assert [r["job_id"] for r in in_flight] == [2]  # the slot changed hands: one in flight, the new one
    assert await limiting.usage(db, pool=POOL) == (3, 9, 1)
    await one_slot.release(permit, tokens_used=7)
    assert (await limiting.usage(db, pool=POOL))[2] == 0


async def test_a_standby_permit_counts_against_requests_per_minute(
        one_slot: limiting.PoolLimiter, db: asyncpg.Connection
) -> None:
    one_slot.limits = limiting.Limits(requests_per_minute=3, tokens_per_minute=10_000_000, max_concurrency=1)
    await _held_once(one_slot)
    held = await one_slot.acquire(job_id=JobId(1), fence=1, tokens=1)
    waiting_attempt = asyncio.create_task(one_slot.acquire(job_id=JobId(2), fence=1, tokens=1))

    async def standby_granted() -> bool:
        return await _standby_of(db, 2) is not None

    await waiting.until(standby_granted, timeout_s=10)
    refusal = await one_slot.try_acquire(job_id=JobId(3), fence=1, tokens=1)
    assert isinstance(refusal, limiting.Refusal) and refusal.reason == "requests"  # the minute is spent
    await one_slot.release(held, tokens_used=1)
    async with asyncio.timeout(10):
        await waiting_attempt  # on the request its standby permit counted
    assert (await limiting.usage(db, pool=POOL))[0] == 3


async def test_a_standby_permit_older_than_standby_s_takes_no_slot_and_goes_back(
        one_slot: limiting.PoolLimiter, db: asyncpg.Connection
) -> None:
    # Its request was counted when it was granted: sent much later, the provider would count it later
    # than the window does.
    one_slot.settings = limiting.LimiterSettings(concurrency_poll_s=30.0, burst_s=60, standby_s=1e-9)
    await _held_once(one_slot)
    held = await one_slot.acquire(job_id=JobId(1), fence=1, tokens=1)
    waiting_attempt = asyncio.create_task(one_slot.acquire(job_id=JobId(2), fence=1, tokens=5))

    async def standby_granted() -> bool:
        return bool(await db.fetchval("SELECT count(*) FROM limiter_permits WHERE job_id = 2"))

    await waiting.until(standby_granted, timeout_s=10)
    standby = await db.fetchval("SELECT id FROM limiter_permits WHERE job_id = 2")
    await one_slot.release(held, tokens_used=1)
    async with asyncio.timeout(10):
        permit = await waiting_attempt
    assert permit.id != standby  # granted by the release, in the database

    async def given_back() -> bool:
        return bool(await db.fetchval(
            "SELECT released_at IS NOT NULL AND tokens_used = 0 FROM limiter_permits WHERE id = $1", standby
        ))

    await waiting.until(given_back, timeout_s=10)  # it never reached the provider: no tokens
    assert await limiting.usage(db, pool=POOL) == (4, 1 + 1 + 0 + 5, 1)


async def test_no_standby_permit_is_used_once_the_pool_cools_down(
        one_slot: limiting.PoolLimiter, db: asyncpg.Connection
) -> None:
    # Granted before the provider's 429, it must not send during the cooldown that followed.
    await _held_once(one_slot)
    held = await one_slot.acquire(job_id=JobId(1), fence=1, tokens=1)
    waiting_attempt = asyncio.create_task(one_slot.acquire(job_id=JobId(2), fence=1, tokens=5))

    async def standby_granted() -> bool:
        return await _standby_of(db, 2) is not None

    await waiting.until(standby_granted, timeout_s=10)
    standby = await _standby_of(db, 2)
    await one_slot.cool_down(30.0)
    await one_slot.release(held, tokens_used=1)
    assert not waiting_attempt.done()  # no slot in memory, and no grant while the pool cools down

    async def given_back() -> bool:
        return bool(await db.fetchval(
            "SELECT released_at IS NOT NULL AND tokens_used = 0 FROM limiter_permits WHERE id = $1", standby
        ))

    await waiting.until(given_back, timeout_s=10)
    assert (await limiting.usage(db, pool=POOL))[2] == 0
    waiting_attempt.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting_attempt


async def test_an_attempt_holding_a_standby_permit_is_asked_for_when_a_slot_is_freed_for_every_replica(
        one_slot: limiting.PoolLimiter, db: asyncpg.Connection
) -> None:
    # No hand-over here (handoff_streak 0): the release frees the slot and NOTIFYs every replica. The
    # attempt with a standby permit must be asked for at once, not left until its standby goes stale.
    one_slot.settings = limiting.LimiterSettings(concurrency_poll_s=30.0, burst_s=60, standby_s=30.0,
                                                 handoff_streak=0)
    await _held_once(one_slot)
    held = await one_slot.acquire(job_id=JobId(1), fence=1, tokens=1)
    waiting_attempt = asyncio.create_task(one_slot.acquire(job_id=JobId(2), fence=1, tokens=5))

    async def standby_granted() -> bool:
        return await _standby_of(db, 2) is not None

    await waiting.until(standby_granted, timeout_s=10)
    standby = await _standby_of(db, 2)
    await one_slot.release(held, tokens_used=1)
    async with asyncio.timeout(10):
        permit = await waiting_attempt
    assert permit.id != standby

    async def given_back() -> bool:
        return bool(await db.fetchval("SELECT released_at IS NOT NULL FROM limiter_permits WHERE id = $1", standby))

    await waiting.until(given_back, timeout_s=10)
    assert (await limiting.usage(db, pool=POOL))[2] == 1
