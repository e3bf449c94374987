"""
Ownership of deliveries: a dispatcher whose lease ran out cannot record its outcome, a dead
dispatcher's deliveries are reaped as ambiguous, two dispatchers never send the same delivery
at the same time, and an operator's redeliver and resolve keep the delivery id.
"""

from __future__ import annotations

import asyncio

import asyncpg
import standardwebhooks
from lading_worker import dispatching

from lading import metrics
from lading.db import deliveries
from lading.db import pool as dbpool
from lading.delivery.states import DeliveryState
from lading.settings import DeliverySettings
from tests.integration.delivery import helpers
from tests.support import erp_stub, waiting


async def test_a_dispatcher_whose_lease_expired_cannot_record_its_outcome(
        db: asyncpg.Connection, dbpool: asyncpg.Pool,
) -> None:
    slow = DeliverySettings(**{**helpers.FAST.__dict__, "lease_ttl_s": 0.5, "read_timeout_s": 5.0,
                               "total_timeout_s": 6.0})  # fmt: skip
    stale_before = metrics.DELIVERY_STALE._value.get()
    async with erp_stub.running() as erp:
        erp.reply = erp_stub.slow(1.5)
        await helpers.register(db, erp.webhook_url)
        [job_id] = await helpers.succeed(db)
        async with helpers.dispatcher(dbpool, settings=slow, owner="A") as a, \
                helpers.dispatcher(dbpool, owner="B") as b:  # fmt: skip
            first = asyncio.create_task(a.run_once())
            await waiting.until(lambda: _lease_over(db), timeout_s=5)
            assert await b.reap_once() == 1
            erp.reply = erp_stub.status(200)
            await waiting.until(lambda: _delivered(b), timeout_s=5)
            late = await first
    assert late.stale == 1 and late.delivered == 0
    assert metrics.DELIVERY_STALE._value.get() == stale_before + 1
    delivery = await helpers.delivery_of(db, job_id)
    assert (delivery.state, delivery.fence, delivery.ambiguous_attempts) == ("DELIVERED", 2, 1)
    attempts = await deliveries.attempts_of(db, delivery_id=delivery.id)
    assert [(a.fence, a.owner, a.outcome) for a in attempts] == [(1, "A", "lease-expired"), (2, "B", "delivered")]
    assert len(set(erp.ids())) == 1


async def _lease_over(db: asyncpg.Connection) -> bool:
    return bool(await db.fetchval("SELECT bool_and(lease_until < clock_timestamp()) FROM deliveries "
                                  "WHERE state = 'IN_FLIGHT'"))  # fmt: skip


async def _delivered(d: dispatching.Dispatcher) -> bool:
    return (await d.run_once()).delivered == 1


async def test_a_dead_dispatchers_delivery_is_reaped_as_ambiguous_and_unknown_when_its_budget_is_spent(
        db: asyncpg.Connection, dbpool: asyncpg.Pool,
) -> None:
    await helpers.register(db, "http://127.0.0.1:9/webhooks/lading", max_attempts=1)
    await helpers.succeed(db, count=2)
    claimed = await deliveries.claim(db, endpoints=[helpers.ENDPOINT], owner="dead", limit=2, lease_ttl_s=0.1)
    assert len(claimed) == 2
    await waiting.until(lambda: _lease_over(db), timeout_s=5)
    async with helpers.dispatcher(dbpool) as d:
        assert await d.reap_once() == 2
        assert await d.reap_once() == 0
    assert await helpers.states(db) == {"UNKNOWN_EXTERNAL": 2}
    late = await deliveries.finish_many(
        db, [deliveries.Finish(c.id, c.fence, DeliveryState.DELIVERED, "delivered")
             for c in claimed], owner="dead",
    )  # fmt: skip
    assert late == {}, "the dead dispatcher's late outcome changes nothing"


async def test_two_dispatchers_on_separate_pools_never_send_one_delivery_twice_at_once(
        db: asyncpg.Connection, database_url: str,
) -> None:
    count = 120
    async with erp_stub.running() as erp:
        erp.reply = erp_stub.slow(0.01)
        await helpers.register(db, erp.webhook_url)
        await helpers.succeed(db, count=count)
        pools = [await dbpool.create_pool(database_url, min_size=1, max_size=4) for _ in range(2)]
        try:
            ds = [helpers.dispatcher(p, owner=f"d{i}") for i, p in enumerate(pools)]
            async with waiting.running(ds[0].run_forever), waiting.running(ds[1].run_forever):
                await waiting.until(lambda: _all_delivered(db, count), timeout_s=30)
        finally:
            for p in pools:
                await p.close()
    assert len(erp.requests) == count
    assert len(set(erp.ids())) == count
    assert max(erp.max_in_flight_per_id.values()) == 1
    owners = await db.fetch("SELECT DISTINCT owner FROM delivery_attempts")
    assert {r["owner"] for r in owners} == {"d0", "d1"}, "both dispatchers took part"


async def _all_delivered(db: asyncpg.Connection, count: int) -> bool:
    return await helpers.states(db) == {"DELIVERED": count}


async def test_redeliver_sends_the_same_delivery_id_with_a_fresh_budget_and_resolve_records_who_and_why(
        db: asyncpg.Connection, dbpool: asyncpg.Pool,
) -> None:
    settings = DeliverySettings(**{**helpers.FAST.__dict__, "read_timeout_s": 0.3, "total_timeout_s": 0.5})
    async with erp_stub.running() as erp:
        erp.reply = erp_stub.hang()
        await helpers.register(db, erp.webhook_url, max_attempts=1)
        first_job, second_job = await helpers.succeed(db, count=2)
        async with helpers.dispatcher(dbpool, settings=settings) as d:
            await d.run_once()
            assert await helpers.states(db) == {"UNKNOWN_EXTERNAL": 2}
            first = await helpers.delivery_of(db, first_job)
            second = await helpers.delivery_of(db, second_job)

            assert await deliveries.redeliver(db, delivery_id=first.id, note="redelivered by ops: ERP has no record")
            erp.reply = erp_stub.status(200)
            assert (await d.run_once()).delivered == 1
            assert await deliveries.resolve(db, delivery_id=second.id, resolved_by="ops", reason="found in ERP")
            assert not await deliveries.redeliver(db, delivery_id=second.id, note="too late")
    redelivered = await helpers.delivery_of(db, first_job)
    assert (redelivered.id, redelivered.state, redelivered.attempt, redelivered.budget_attempts) == (
        first.id, "DELIVERED", 2, 1
    )
    assert [r for r in erp.ids() if r == str(first.id)] == [str(first.id)] * 2
    last = erp.requests[-1]
    standardwebhooks.Webhook(helpers.SECRET).verify(last.body, last.headers)
    resolved = await helpers.delivery_of(db, second_job)
    assert (resolved.state, resolved.resolved_by, resolved.resolved_reason) == ("DELIVERED", "ops", "found in ERP")
    assert resolved.attempt == 1, "resolving sends nothing"
