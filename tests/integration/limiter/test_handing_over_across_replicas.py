"""A release hands its slot to the longest-waiting attempt of another replica in its own transaction
(migration 0033): the attempt's replica hears the grant (NOTIFY) and asks nothing.

Replicas here never poll (`concurrency_poll_s` 30 s): only a release can get their attempts a permit.
The last test runs the waiting replica as a real process."""

import asyncio
import sys
import textwrap
from collections.abc import AsyncIterator, Sequence
from typing import Any

import asyncpg
import pytest

from lading import limiting
from lading.db import pool as dbpool
from lading.ids import JobId, PoolName
from tests.support import factories, waiting

POOL = PoolName(factories.POOL)
_made: list[limiting.PoolLimiter] = []


def limiter(db: asyncpg.Pool) -> limiting.PoolLimiter:
    made = limiting.PoolLimiter(
        db,
        pool=POOL,
        limits=limiting.Limits(requests_per_minute=10_000, tokens_per_minute=10_000_000, max_concurrency=1),
        settings=limiting.LimiterSettings(concurrency_poll_s=30.0, burst_s=60),
    )
    _made.append(made)
    return made


@pytest.fixture
async def replicas(db: asyncpg.Connection, database_url: str) -> AsyncIterator[list[asyncpg.Pool]]:
    await factories.seed(db)
    pools = [await dbpool.create_pool(database_url, min_size=1, max_size=10) for _ in range(3)]
    yield pools
    while _made:
        await _made.pop().close()  # their LISTEN connections go back before the pools close
    for p in pools:
        await p.close()


async def recorded(db: asyncpg.Connection, count: int) -> None:
    """Wait until `count` attempts are recorded as waiting (each was refused for concurrency)."""

    async def enough() -> bool:
        return bool(await db.fetchval("SELECT count(*) = $1 FROM limiter_waiters", count))

    await waiting.until(enough, timeout_s=10)


async def same_transaction(db: asyncpg.Connection, released: int, granted: int) -> bool:
    """Whether permit `granted` was inserted by the transaction that released permit `released`."""
    return bool(await db.fetchval(
        "SELECT (SELECT xmin::text FROM limiter_permits WHERE id = $1)"
        "     = (SELECT xmin::text FROM limiter_permits WHERE id = $2)", released, granted,
    ))  # fmt: skip


async def held_here_and_waiting_there(
        replicas: list[asyncpg.Pool], db: asyncpg.Connection
) -> tuple[limiting.PoolLimiter, limiting.PoolLimiter, limiting.Permit, asyncio.Task[limiting.Permit]]:
    """Two replicas (here, there): job 1 holds the pool's only slot here, job 2 waits there, recorded."""
    here, there = limiter(replicas[0]), limiter(replicas[1])
    held = await here.acquire(job_id=JobId(1), fence=1, tokens=1)
    waiter = asyncio.create_task(there.acquire(job_id=JobId(2), fence=1, tokens=1))
    await recorded(db, 1)
    return here, there, held, waiter


def counting_asks(lim: limiting.PoolLimiter) -> list[int]:
    """The sizes of the asks `lim`'s asker makes from now on (one query each)."""
    asked: list[int] = []
    original = lim._ask

    async def counted(batch: Sequence[Any]) -> Any:
        asked.append(len(batch))
        return await original(batch)

    lim._ask = counted  # type: ignore[method-assign]
    return asked


async def test_a_release_grants_its_slot_to_the_longest_waiting_attempt_of_another_replica(
        replicas: list[asyncpg.Pool], db: asyncpg.Connection
) -> None:
    here, first, second = (limiter(p) for p in replicas)
    held = await here.acquire(job_id=JobId(1), fence=1, tokens=1)
    oldest = asyncio.create_task(first.acquire(job_id=JobId(2), fence=1, tokens=1))
    await recorded(db, 1)
    later = asyncio.create_task(second.acquire(job_id=JobId(3), fence=1, tokens=1))
    await recorded(db, 2)
    asks = counting_asks(first), counting_asks(second)

    await here.release(held, tokens_used=1)  # nothing waits here: the slot goes to another replica's attempt
    async with asyncio.timeout(10):
        permit = await oldest  # the one that waited longest ...
    assert await same_transaction(db, held.id, permit.id)  # ... granted by the release itself
    assert asks == ([], [])  # no replica asked: the grant came with the NOTIFY
    assert not later.done()
    assert await db.fetchval("SELECT array_agg(job_id) FROM limiter_waiters") == [3]

    await first.release(permit, tokens_used=1)  # the same from the replica just granted
    async with asyncio.timeout(10):
        last = await later
    assert await same_transaction(db, permit.id, last.id)
    assert asks == ([], [])
    await second.release(last, tokens_used=1)
    assert await limiting.usage(db, pool=POOL) == (3, 3, 0)
    assert await db.fetchval("SELECT count(*) FROM limiter_waiters") == 0


async def test_the_attempts_recorded_by_a_replica_that_is_gone_are_passed_over_and_forgotten(
        replicas: list[asyncpg.Pool], db: asyncpg.Connection, database_url: str
) -> None:
    here, other = limiter(replicas[0]), limiter(replicas[1])
    held = await here.acquire(job_id=JobId(1), fence=1, tokens=1)
    live = asyncio.create_task(other.acquire(job_id=JobId(3), fence=1, tokens=1))
    await recorded(db, 1)
    gone = await dbpool.connect(database_url)  # a replica's LISTEN connection, then the replica is gone
    pid = gone.get_server_pid()
    await gone.close()

    async def ended() -> bool:
        return not await db.fetchval("SELECT EXISTS (SELECT 1 FROM pg_stat_get_activity($1))", pid)

    await waiting.until(ended, timeout_s=10)
    await db.execute(
        "INSERT INTO limiter_waiters (pool, job_id, fence, tokens, listener, since)"
        " VALUES ($1, 2, 1, 1, $2, clock_timestamp() - interval '1 minute')", POOL, pid,
    )  # fmt: skip

    await here.release(held, tokens_used=1)
    async with asyncio.timeout(10):
        permit = await live
    assert await same_transaction(db, held.id, permit.id)
    assert await db.fetchval("SELECT count(*) FROM limiter_waiters") == 0
    await other.release(permit, tokens_used=1)


async def test_a_slot_granted_to_an_attempt_that_gave_up_goes_back_and_on_to_the_next(
        replicas: list[asyncpg.Pool], db: asyncpg.Connection
) -> None:
    here, first, second = (limiter(p) for p in replicas)
    held = await here.acquire(job_id=JobId(1), fence=1, tokens=1)
    gave_up = asyncio.create_task(first.acquire(job_id=JobId(2), fence=1, tokens=1))
    await recorded(db, 1)
    later = asyncio.create_task(second.acquire(job_id=JobId(3), fence=1, tokens=1))
    await recorded(db, 2)
    gave_up.cancel()  # its lease was lost: it is still recorded as waiting
    with pytest.raises(asyncio.CancelledError):
        await gave_up

    await here.release(held, tokens_used=1)  # granted to the attempt that gave up, whose replica gives it back
    async with asyncio.timeout(10):
        permit = await later
    assert await db.fetchval("SELECT job_id FROM limiter_permits WHERE id = $1", permit.id) == 3
    assert await db.fetchval("SELECT array_agg(job_id ORDER BY id) FROM limiter_permits") == [1, 2, 3]
    await second.release(permit, tokens_used=1)
    assert await limiting.usage(db, pool=POOL) == (3, 3, 0)


async def test_an_attempt_granted_elsewhere_before_its_replica_heard_it_is_not_granted_a_second_permit(
        replicas: list[asyncpg.Pool], db: asyncpg.Connection
) -> None:
    here, there, held, waiter = await held_here_and_waiting_there(replicas, db)
    assert there._listener is not None
    await there._listener.remove_listener(limiting.RELEASED_CHANNEL, there._heard)  # its NOTIFYs go unheard

    await here.release(held, tokens_used=1)  # grants the slot to the waiting attempt there

    async def granted() -> bool:
        return bool(await db.fetchval("SELECT count(*) = 2 FROM limiter_permits"))

    await waiting.until(granted, timeout_s=10)
    assert not waiter.done()
    there._released()  # its asker asks again, as after a poll
    async with asyncio.timeout(10):
        permit = await waiter
    assert await same_transaction(db, held.id, permit.id)  # the permit the release granted, ...
    assert await db.fetchval("SELECT count(*) FROM limiter_permits") == 2  # ... not a second one
    await there.release(permit, tokens_used=1)
    assert await limiting.usage(db, pool=POOL) == (2, 2, 0)


WAITING_REPLICA = textwrap.dedent("""
    import asyncio, sys
    from lading import limiting
    from lading.db import pool as dbpool
    from lading.ids import JobId, PoolName

    async def main(url: str, pool: str) -> None:
        db = await dbpool.create_pool(url, min_size=1, max_size=4)
        lim = limiting.PoolLimiter(
            db, pool=PoolName(pool),
            limits=limiting.Limits(requests_per_minute=10_000, tokens_per_minute=10_000_000, max_concurrency=1),
            settings=limiting.LimiterSettings(concurrency_poll_s=30.0, burst_s=60),
        )
        permit = await lim.acquire(job_id=JobId(2), fence=1, tokens=1)
        print(permit.id, flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        await lim.release(permit, tokens_used=1)
        await lim.close()
        await db.close()

    asyncio.run(main(sys.argv[1], sys.argv[2]))
""")


async def test_a_release_grants_its_slot_to_an_attempt_waiting_in_another_process(
        replicas: list[asyncpg.Pool], db: asyncpg.Connection, database_url: str
) -> None:
    here = limiter(replicas[0])
    held = await here.acquire(job_id=JobId(1), fence=1, tokens=1)
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", WAITING_REPLICA, database_url, POOL,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert process.stdin is not None and process.stdout is not None
    try:
        await recorded(db, 1)  # the other process's attempt was refused and waits
        await here.release(held, tokens_used=1)
        async with asyncio.timeout(20):
            granted = int((await process.stdout.readline()).decode())
        assert await same_transaction(db, held.id, granted)
        assert await db.fetchval("SELECT job_id FROM limiter_permits WHERE id = $1", granted) == 2
        process.stdin.write(b"release\n")
        await process.stdin.drain()
        async with asyncio.timeout(20):
            assert await process.wait() == 0
        assert await limiting.usage(db, pool=POOL) == (2, 2, 0)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()



async def test_a_replica_whose_listen_connection_broke_listens_again_and_is_granted_slots_directly(
        replicas: list[asyncpg.Pool], db: asyncpg.Connection
) -> None:
    here, there, held, waiter = await held_here_and_waiting_there(replicas, db)
    broken = await db.fetchval("SELECT listener FROM limiter_waiters")
    assert broken == there._listener_pid
    assert await db.fetchval("SELECT pg_terminate_backend($1)", broken)  # the server ends the LISTEN connection

    async def recorded_again() -> bool:  # under the pid of a new, live LISTEN connection
        pid = await db.fetchval("SELECT listener FROM limiter_waiters WHERE job_id = 2")
        return pid is not None and pid != broken and pid == there._listener_pid

    await waiting.until(recorded_again, timeout_s=10)
    asks = counting_asks(there)

    await here.release(held, tokens_used=1)  # the slot goes straight to the attempt there, heard on the new connection
    async with asyncio.timeout(10):  # the replica never polls (concurrency_poll_s 30 s)
        permit = await waiter
    assert await same_transaction(db, held.id, permit.id)
    assert asks == []
    await there.release(permit, tokens_used=1)


async def test_the_waiters_recorded_for_a_pool_go_with_the_pool(
        replicas: list[asyncpg.Pool], db: asyncpg.Connection
) -> None:
    _, _, _, waiter = await held_here_and_waiting_there(replicas, db)

    assert await db.fetchval("DELETE FROM pools WHERE name = $1 RETURNING 1", POOL) == 1  # no replica asks for it again
    assert await db.fetchval("SELECT count(*) FROM limiter_waiters") == 0
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter


async def test_a_replica_that_could_not_listen_at_first_tries_again(
        replicas: list[asyncpg.Pool], db: asyncpg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = asyncpg.Connection.add_listener
    refusals = [OSError("LISTEN refused")]

    async def refused_once(conn: asyncpg.Connection, channel: str, callback: Any) -> None:
        if refusals:
            raise refusals.pop()
        await original(conn, channel, callback)

    monkeypatch.setattr(asyncpg.Connection, "add_listener", refused_once)
    here = limiter(replicas[0])
    there = limiting.PoolLimiter(
        replicas[1], pool=POOL,
        limits=limiting.Limits(requests_per_minute=10_000, tokens_per_minute=10_000_000, max_concurrency=1),
        settings=limiting.LimiterSettings(concurrency_poll_s=0.05, relisten_s=0.2, burst_s=60),
    )  # fmt: skip
    _made.append(there)
    held = await here.acquire(job_id=JobId(1), fence=1, tokens=1)
    waiter = asyncio.create_task(there.acquire(job_id=JobId(2), fence=1, tokens=1))

    async def listening_and_recorded() -> bool:  # a later round listened, then recorded the attempt under its pid
        pid = await db.fetchval("SELECT listener FROM limiter_waiters WHERE job_id = 2")
        return pid is not None and pid == there._listener_pid

    await waiting.until(listening_and_recorded, timeout_s=10)
    assert not refusals

    await here.release(held, tokens_used=1)
    async with asyncio.timeout(10):
        permit = await waiter
    assert await same_transaction(db, held.id, permit.id)
    await there.release(permit, tokens_used=1)
