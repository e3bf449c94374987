"""
The cleaner deletes, table by table, what is past its retention and nothing still needed: an
unpublished or set-aside event, an undelivered delivery, an inbox row inside the dedup window,
a permit still holding a slot. Real PostgreSQL; rows are aged by writing their timestamps.
"""

from __future__ import annotations

import uuid

import asyncpg
import pytest
from lading_worker import cleaning

from lading import metrics
from lading.db import pool as dbpool
from tests.support import waiting

DAY = "1 day"
SETTINGS = cleaning.CleanerSettings(batch_size=2, max_batches=100)


async def _count(db: asyncpg.Connection, table: str) -> int:
    return int(await db.fetchval(f"SELECT count(*) FROM {table}"))


async def _outbox(db: asyncpg.Connection, *, published_days_ago: int | None, set_aside: bool = False) -> int:
    return int(await db.fetchval(
        "INSERT INTO outbox_events (event_id, aggregate_type, aggregate_id, type, payload, created_at, published_at,"
        " set_aside_at, error_class, error)"
        " VALUES ($1, 'job', 1, 't', '{}', now() - interval '60 days',"
        " now() - make_interval(days => $2), CASE WHEN $3 THEN now() - interval '60 days' END,"
        " CASE WHEN $3 THEN 'UNSTORABLE' END, CASE WHEN $3 THEN 'x' END) RETURNING id",
        uuid.uuid4(), published_days_ago, set_aside,
    ))


async def test_published_events_past_retention_go_unpublished_and_set_aside_stay(db: asyncpg.Connection) -> None:
    old = [await _outbox(db, published_days_ago=30) for _ in range(5)]
    recent = await _outbox(db, published_days_ago=1)
    unpublished = await _outbox(db, published_days_ago=None)
    set_aside = await _outbox(db, published_days_ago=None, set_aside=True)
    before = metrics.CLEANER_DELETED.labels("outbox_events")._value.get()

    deleted = await cleaning.clean(db, settings=SETTINGS)

    assert deleted["outbox_events"] == 5, "five rows in batches of two: three statements"
    left = sorted(r["id"] for r in await db.fetch("SELECT id FROM outbox_events"))
    assert left == sorted([recent, unpublished, set_aside]) and not set(old) & set(left)
    assert metrics.CLEANER_DELETED.labels("outbox_events")._value.get() - before == 5
    age = metrics.CLEANER_OLDEST_AGE.labels("outbox_events")._value.get()
    assert 86_000 < age < 90_000, "the oldest published row kept is a day old"


async def test_inbox_rows_inside_the_dedup_window_stay(db: asyncpg.Connection) -> None:
    for days in (10, 8, 6, 1):
        await db.execute(
            "INSERT INTO execution_inbox (event_id, type, digest, received_at, payload)"
            " VALUES ($1, 't', 'd', now() - make_interval(days => $2), '{}')", uuid.uuid4(), days,
        )
        await db.execute(
            "INSERT INTO inbox_quarantine (event_id, digest, first_digest, received_at, payload)"
            " VALUES ($1, 'd2', 'd', now() - make_interval(days => $2 * 5), '{}')", uuid.uuid4(), days,
        )
    deleted = await cleaning.clean(db, settings=SETTINGS)
    assert deleted["execution_inbox"] == 2
    assert sorted(d for (d,) in await db.fetch(
        "SELECT extract(day FROM now() - received_at)::int FROM execution_inbox")) == [1, 6]
    assert deleted["inbox_quarantine"] == 3, "50, 40 and 30 days old go; 5 days stays"
    assert await _count(db, "inbox_quarantine") == 1


async def test_delivered_deliveries_go_with_their_attempts_every_other_state_stays(db: asyncpg.Connection) -> None:
    states = ["DELIVERED", "DELIVERED", "DELIVERED", "PENDING", "RETRY_SCHEDULED", "FAILED_TERMINAL",
              "UNKNOWN_EXTERNAL"]
    for job_id, state in enumerate(states, start=1):
        delivery = await db.fetchval(
            "INSERT INTO deliveries (job_id, endpoint, state, created_at, updated_at, delivered_at)"
            " VALUES ($1, 'ns/erp', $2, now() - interval '90 days', now() - interval '90 days',"
            " CASE WHEN $2 = 'DELIVERED' THEN now() - interval '60 days' END) RETURNING delivery_id",
            job_id, state,
        )
        await db.execute(
            "INSERT INTO delivery_attempts (delivery_id, fence, attempt, owner, started_at, finished_at, outcome)"
            " VALUES ($1, 1, 1, 'w', now() - interval '60 days', now() - interval '60 days', 'retry')", delivery,
        )
    recent = await db.fetchval(
        "INSERT INTO deliveries (job_id, endpoint, state, delivered_at) VALUES (99, 'ns/erp', 'DELIVERED', now())"
        " RETURNING delivery_id"
    )
    deleted = await cleaning.clean(db, settings=SETTINGS)
    assert deleted["deliveries"] == 3
    kept = {r["state"] for r in await db.fetch("SELECT state FROM deliveries")}
    assert kept == {"PENDING", "RETRY_SCHEDULED", "FAILED_TERMINAL", "UNKNOWN_EXTERNAL", "DELIVERED"}
    assert await db.fetchval("SELECT count(*) FROM deliveries WHERE state = 'DELIVERED'") == 1
    assert await db.fetchval("SELECT delivery_id FROM deliveries WHERE state = 'DELIVERED'") == recent
    assert await _count(db, "delivery_attempts") == 4, "the attempts of the kept deliveries stay"


async def test_stale_completions_and_limiter_rows(db: asyncpg.Connection) -> None:
    for days in (40, 35, 31, 2):
        await db.execute(
            "INSERT INTO stale_completions (job_id, fence, worker_id, at)"
            " VALUES (1, 1, 'w', now() - make_interval(days => $1))", days,
        )
    permits = [  # (hours ago, released, expired)
        (5, True, True), (5, False, True), (5, False, False), (0, True, True),
    ]
    for hours, released, expired in permits:
        await db.execute(
            "INSERT INTO limiter_permits (pool, job_id, fence, acquired_at, tokens_reserved, expires_at, released_at)"
            " VALUES ('ns/p', 1, 1, now() - make_interval(hours => $1), 10,"
            " CASE WHEN $3 THEN now() - interval '1 minute' ELSE now() + interval '1 hour' END,"
            " CASE WHEN $2 THEN now() END)", hours, released, expired,
        )
    for minutes in (600, 120, 1):
        await db.execute(
            "INSERT INTO limiter_seconds (pool, second, requests, tokens)"
            " VALUES ('ns/p', date_trunc('second', now() - make_interval(mins => $1)), 1, 1)", minutes,
        )
    deleted = await cleaning.clean(db, settings=SETTINGS)
    assert deleted["stale_completions"] == 3 and await _count(db, "stale_completions") == 1
    assert deleted["limiter_permits"] == 2, "old and released, old and expired go"
    still_held = await db.fetchval(
        "SELECT count(*) FROM limiter_permits WHERE released_at IS NULL AND expires_at > now()"
    )
    assert still_held == 1, "a permit holding a slot stays, however old"
    assert deleted["limiter_seconds"] == 2 and await _count(db, "limiter_seconds") == 1


async def test_gpu_intervals_past_retention_go_and_the_costs_they_charged_stay(db: asyncpg.Connection) -> None:
    for days in (500, 401, 399, 1):
        await db.execute(
            "INSERT INTO pool_gpu_intervals (pool, starts_at, currency, gpu_seconds, cost, charged, attempts, tokens)"
            " VALUES ('ns/gpu', date_trunc('minute', now() - make_interval(days => $1)),"
            " 'EUR', 60, 0.05, 0.04, 2, 900)",
            days,
        )
    await db.execute(
        "INSERT INTO pool_gpu_intervals (pool, starts_at, currency, gpu_seconds, cost, charged, attempts, tokens)"
        " VALUES ('ns/other', date_trunc('minute', now() - interval '450 days'), 'EUR', 0, 0, 0, 0, 0)"
    )
    deleted = await cleaning.clean(db, settings=SETTINGS)
    assert deleted["pool_gpu_intervals"] == 3, "two of one pool and one of another are past 400 days"
    kept = await db.fetchval(
        "SELECT array_agg(extract(day FROM now() - starts_at)::int ORDER BY starts_at) FROM pool_gpu_intervals"
    )
    assert kept == [399, 1], kept
    assert await cleaning.clean(db, settings=SETTINGS) == {**deleted, **dict.fromkeys(deleted, 0)}


async def test_a_round_stops_a_table_after_max_batches(db: asyncpg.Connection) -> None:
    for _ in range(7):
        await _outbox(db, published_days_ago=30)
    settings = cleaning.CleanerSettings(batch_size=2, max_batches=2)
    assert (await cleaning.clean(db, settings=settings))["outbox_events"] == 4
    assert (await cleaning.clean(db, settings=settings))["outbox_events"] == 3


async def test_one_elected_cleaner_cleans(db: asyncpg.Connection, database_url: str) -> None:
    await _outbox(db, published_days_ago=30)
    first, second = cleaning.Cleaner(database_url), cleaning.Cleaner(database_url)
    try:
        assert await first.run_once() is not None
        assert await second.run_once() is None, "the lock is held: the second process does not clean"
        await first._resign()
        everything = [*(t.name for t in cleaning.TABLES), "job_documents", "results"]
        assert await second.run_once() == dict.fromkeys(everything, 0)
    finally:
        await first._resign()
        await second._resign()


async def test_the_cleaner_does_not_block_on_a_row_the_relay_holds(db: asyncpg.Connection, database_url: str) -> None:
    held = await _outbox(db, published_days_ago=30)
    free = await _outbox(db, published_days_ago=30)
    holder = await dbpool.connect(database_url)
    try:
        async with holder.transaction():
            await holder.execute("SELECT 1 FROM outbox_events WHERE id = $1 FOR UPDATE", held)
            await db.execute("SET lock_timeout = '2s'")
            assert (await cleaning.clean(db, settings=SETTINGS))["outbox_events"] == 1
        assert [r["id"] for r in await db.fetch("SELECT id FROM outbox_events")] == [held]
        assert free != held
    finally:
        await holder.close()


@pytest.mark.parametrize("field, value", [("inbox_s", 3600.0), ("limiter_s", 60.0), ("batch_size", 0),
                                          ("delivered_s", -1.0), ("interval_s", 0.0)])
def test_settings_refuse_a_retention_that_would_delete_needed_rows(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field.split("_")[0]):
        cleaning.CleanerSettings(**{field: value})  # type: ignore[arg-type]


async def test_the_running_loop_cleans_each_interval(db: asyncpg.Connection, database_url: str) -> None:
    await _outbox(db, published_days_ago=30)
    async with cleaning.cleaning(database_url, settings=cleaning.CleanerSettings(interval_s=0.05)) as cleaner:
        await waiting.until(lambda: _empty(db, "outbox_events"), timeout_s=10)
        assert cleaner.leader
        await _outbox(db, published_days_ago=30)  # the next round takes it too
        await waiting.until(lambda: _empty(db, "outbox_events"), timeout_s=10)
    assert not cleaner.leader, "stopping resigns: another process can take over"


async def _empty(db: asyncpg.Connection, table: str) -> bool:
    return await _count(db, table) == 0
