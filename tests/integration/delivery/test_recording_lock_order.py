"""
Recording a delivery round locks rows in one canonical order, so concurrent rounds never
deadlock; and an outcome PostgreSQL refuses to store is isolated, not allowed to lose the round.

Two dispatchers each record one round holding a delivery to endpoint X and one to endpoint Y,
claimed in opposite orders (X then Y, Y then X): before endpoints were folded in name order, the
two transactions locked the endpoint rows crosswise and deadlocked about every other pair.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
from typing import Any

import asyncpg
from lading_worker import dispatching

from lading import storable
from lading.db import deliveries
from lading.db import pool as dbpool
from lading.delivery.states import DeliveryState
from tests.integration.delivery import helpers
from tests.support import deadlocks

X, Y = "acme/erp-x", "acme/erp-y"
PAIRS = 25
RETRYABLE = dispatching.AttemptOutcome(dispatching.RETRY, status=503, error_class="HttpRetryable", error="HTTP 503")


async def test_concurrent_rounds_over_two_endpoints_in_opposite_orders_never_deadlock(
        db: asyncpg.Connection, database_url: str,
) -> None:
    for name in (X, Y):
        await helpers.register(db, "http://127.0.0.1:9/webhooks/lading", name=name)
    await helpers.succeed(db, count=2 * PAIRS, name="bx", endpoint=X)
    await helpers.succeed(db, count=2 * PAIRS, name="by", endpoint=Y)
    endpoints = {e.name: e for e in await deliveries.endpoints_for_dispatch(db)}
    rounds: list[tuple[str, list[deliveries.ClaimedDelivery]]] = []
    for i in range(PAIRS):
        for owner, order in ((f"a{i}", (X, Y)), (f"b{i}", (Y, X))):
            claimed = [
                c for name in order
                for c in await deliveries.claim(db, endpoints=[name], owner=owner, limit=1, lease_ttl_s=600)
            ]  # fmt: skip
            assert [c.endpoint for c in claimed] == list(order)
            rounds.append((owner, claimed))

    url, app = deadlocks.tagged(database_url)
    async with deadlocks.fast_detection(db):
        before = await deadlocks.count(db)
        pool = await dbpool.create_pool(url, min_size=2, max_size=2)
        try:
            for i in range(PAIRS):
                (owner_a, round_a), (owner_b, round_b) = rounds[2 * i], rounds[2 * i + 1]
                a = helpers.dispatcher(pool, owner=owner_a, loopback_for=(X, Y))
                b = helpers.dispatcher(pool, owner=owner_b, loopback_for=(X, Y))
                results = await asyncio.gather(
                    a._record(round_a, [RETRYABLE] * 2, endpoints), b._record(round_b, [RETRYABLE] * 2, endpoints)
                )
                assert [r.retried for r in results] == [2, 2], f"pair {i}: every outcome is recorded"
        finally:
            await pool.close()
        await deadlocks.settled(db, application_name=app)
        after = await deadlocks.count(db)
    assert after - before == 0, f"{after - before} deadlocks in {PAIRS} concurrent pairs"

    states = await db.fetch("SELECT state, count(*) AS n FROM deliveries WHERE owner IS NULL GROUP BY state")
    assert {r["state"]: r["n"] for r in states} == {"RETRY_SCHEDULED": 4 * PAIRS}
    attempts = await db.fetch("SELECT outcome, count(*) AS n FROM delivery_attempts GROUP BY outcome")
    assert {r["outcome"]: r["n"] for r in attempts} == {"retry": 4 * PAIRS}, "each attempt closed once"
    failures = await db.fetch("SELECT name, breaker_failures FROM endpoints ORDER BY name")
    assert [(r["name"], r["breaker_failures"]) for r in failures] == [(X, 2 * PAIRS), (Y, 2 * PAIRS)], (
        "each outcome folded into its endpoint's health exactly once"
    )


async def test_an_unstorable_outcome_is_isolated_and_ends_its_delivery_as_unstorable(
        db: asyncpg.Connection, dbpool: asyncpg.Pool,
) -> None:
    await helpers.register(db, "http://127.0.0.1:9/webhooks/lading")
    await helpers.succeed(db, count=9)
    claimed = await deliveries.claim(db, endpoints=[helpers.ENDPOINT], owner="d", limit=9, lease_ttl_s=600)
    assert len(claimed) == 9
    bad = claimed[4]

    def finish(c: deliveries.ClaimedDelivery, **changes: Any) -> deliveries.Finish:
        base = deliveries.Finish(c.id, c.fence, DeliveryState.DELIVERED, "delivered", http_status=200)
        return dataclasses.replace(base, **changes)

    finishes = [
        finish(c) if c is not bad else finish(
            c, to=DeliveryState.RETRY_SCHEDULED, outcome="retry", http_status=503, retry_in_s=1.0,
            error_class="HttpRetryable", error="HTTP 503: \x00 from the receiver",
        )
        for c in claimed
    ]  # fmt: skip
    async with helpers.dispatcher(dbpool, owner="d") as d:
        written = await d._write(finishes, {helpers.ENDPOINT: deliveries.Outcomes(up=8, successes=8, failures=1)})

    assert set(written) == {c.id for c in claimed}
    assert written[bad.id].error_class == storable.UNSTORABLE
    rows = {r["delivery_id"]: r for r in await db.fetch("SELECT * FROM deliveries")}
    good = [rows[c.id] for c in claimed if c is not bad]
    assert {(r["state"], r["last_status"]) for r in good} == {("DELIVERED", 200)}, "every good outcome recorded"
    refused = rows[bad.id]
    assert refused["state"] == "FAILED_TERMINAL", "ended, never re-sent for ever"
    assert refused["last_error_class"] == storable.UNSTORABLE
    assert "could not be stored" in refused["last_error"] and "retry, HTTP 503" in refused["last_error"]
    attempts = await deliveries.attempts_of(db, delivery_id=bad.id)
    assert [(a.outcome, a.error_class) for a in attempts] == [("failed", storable.UNSTORABLE)]
    health = await db.fetchrow("SELECT breaker_state, breaker_failures FROM endpoints")
    assert (health["breaker_state"], health["breaker_failures"]) == ("closed", 0), "health recorded too"


async def test_an_unstorable_ambiguous_outcome_ends_unknown_external_and_a_delivered_one_stays_delivered() -> None:
    common: dict[str, Any] = dict(delivery_id=None, fence=1, error="\x00")
    refusal = asyncpg.exceptions.CharacterNotInRepertoireError('invalid byte sequence for encoding "UTF8": 0x00')
    ambiguous = dispatching.unstorable(
        deliveries.Finish(to=DeliveryState.RETRY_SCHEDULED, outcome="retry", ambiguous=True, **common),
        refusal, ambiguous_before=False,
    )
    earlier = dispatching.unstorable(
        deliveries.Finish(to=DeliveryState.RETRY_SCHEDULED, outcome="retry", **common), refusal, ambiguous_before=True,
    )
    delivered = dispatching.unstorable(
        deliveries.Finish(to=DeliveryState.DELIVERED, outcome="delivered", **common), refusal, ambiguous_before=False,
    )
    assert (ambiguous.to, earlier.to, delivered.to) == (
        DeliveryState.UNKNOWN_EXTERNAL, DeliveryState.UNKNOWN_EXTERNAL, DeliveryState.DELIVERED
    )
    for finish in (ambiguous, earlier, delivered):
        assert finish.error_class == storable.UNSTORABLE
        assert finish.error is not None and storable.unstorable_reason(finish.error) is None


def test_stored_errors_are_escaped_at_the_boundary() -> None:
    claimed = deliveries.ClaimedDelivery(
        id=None, job_id=1, endpoint="e", attempt=1, budget_attempts=1, ambiguous_attempts=0, fence=1,  # type: ignore[arg-type]
        first_attempt_at=dt.datetime.now(dt.UTC), created_at=dt.datetime.now(dt.UTC),
        claimed_at=dt.datetime.now(dt.UTC), tenant="t", document_key="k", schema="invoice.v1", batch_id=1,  # type: ignore[arg-type]
        batch_namespace="ns", batch_name="b", result=None, validation_policy="strict", validation_outcome="passed",
    )
    finish = dispatching.decide(
        claimed,
        dispatching.AttemptOutcome(dispatching.REFUSED, status=400, error_class="HttpRefused", error="bad \x00 \ud800"),
        budget=dispatching.Budget(max_attempts=3, max_age_s=60),
        settings=helpers.FAST,
        now=dt.datetime.now(dt.UTC),
    )
    assert finish.error is not None and storable.unstorable_reason(finish.error) is None
    assert "\\u0000" in finish.error
