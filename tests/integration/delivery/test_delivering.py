"""
The dispatcher against real PostgreSQL and a real HTTP receiver on 127.0.0.1: signatures,
body, retries, budgets, terminal refusals, AuthFailing, the shared breaker, UNKNOWN_EXTERNAL.
"""

from __future__ import annotations

import asyncio
import json

import asyncpg
import standardwebhooks
from lading_worker import dispatching

from lading import metrics
from lading.db import deliveries
from lading.settings import DeliverySettings
from lading.webhooks import payload
from tests.integration.delivery import helpers
from tests.support import erp_stub, waiting


async def _drive(d: dispatching.Dispatcher, conn: asyncpg.Connection, until_states: set[str],
                 timeout_s: float = 20.0) -> None:  # fmt: skip
    async def settled() -> bool:
        await d.run_once()
        current = await helpers.states(conn)
        return set(current) <= until_states and sum(current.values()) > 0

    await waiting.until(settled, timeout_s=timeout_s, every_s=0.02)


async def test_a_success_is_delivered_signed_so_that_standardwebhooks_verifies_it_with_the_contract_body(
        db: asyncpg.Connection, dbpool: asyncpg.Pool,
) -> None:
    async with erp_stub.running() as erp:
        await helpers.register(db, erp.webhook_url)
        [job_id] = await helpers.succeed(db)
        delivery = await helpers.delivery_of(db, job_id)
        assert delivery.state == "PENDING"
        async with helpers.dispatcher(dbpool) as d:
            result = await d.run_once()
        assert result.delivered == 1

    [request] = erp.requests
    assert request.path == erp_stub.PATH
    assert request.headers["webhook-id"] == str(delivery.id)
    verified = standardwebhooks.Webhook(helpers.SECRET).verify(request.body, request.headers)
    event = payload.CompletedEvent.model_validate(verified)
    assert event.type == "extraction.completed.v1"
    assert event.data.job_id == str(job_id)
    assert (event.data.batch.namespace, event.data.batch.name) == ("acme", "b1")
    assert event.data.result == helpers.RESULT
    assert (event.data.validation.policy, event.data.validation.outcome) == ("invoice-strict-v1", "passed")
    assert json.loads(request.body)["data"]["schema"] == "invoice.v1"
    after = await helpers.delivery_of(db, job_id)
    assert (after.state, after.last_status, after.attempt) == ("DELIVERED", 200, 1)
    assert after.delivered_at is not None
    [attempt] = await deliveries.attempts_of(db, delivery_id=delivery.id)
    assert (attempt.outcome, attempt.http_status) == ("delivered", 200)


async def test_during_a_rotation_every_active_secret_signs_and_either_one_verifies(
        db: asyncpg.Connection, dbpool: asyncpg.Pool,
) -> None:
    async with erp_stub.running() as erp:
        await helpers.register(db, erp.webhook_url)
        await helpers.succeed(db)
        async with helpers.dispatcher(dbpool, secrets=(helpers.SECRET, helpers.OTHER_SECRET)) as d:
            assert (await d.run_once()).delivered == 1
    [request] = erp.requests
    assert len(request.headers["webhook-signature"].split(" ")) == 2
    for secret in (helpers.SECRET, helpers.OTHER_SECRET):
        standardwebhooks.Webhook(secret).verify(request.body, request.headers)


async def test_an_erp_down_for_a_while_gets_retries_with_the_same_delivery_id_and_body_until_it_answers(
        db: asyncpg.Connection, dbpool: asyncpg.Pool,
) -> None:
    async with erp_stub.running() as erp:
        erp.reply = erp_stub.statuses(503, 503, 502, 500)
        await helpers.register(db, erp.webhook_url)
        [job_id] = await helpers.succeed(db)
        async with helpers.dispatcher(dbpool) as d:
            await _drive(d, db, {"DELIVERED"})
    assert len(erp.requests) == 5
    assert len(set(erp.ids())) == 1
    assert len({r.body for r in erp.requests}) == 1, "every attempt sends the same bytes"
    timestamps = [int(r.headers["webhook-timestamp"]) for r in erp.requests]
    assert timestamps == sorted(timestamps)
    delivery = await helpers.delivery_of(db, job_id)
    assert (delivery.state, delivery.attempt) == ("DELIVERED", 5)
    outcomes = [a.outcome for a in await deliveries.attempts_of(db, delivery_id=delivery.id)]
    assert outcomes == ["retry", "retry", "retry", "retry", "delivered"]


async def test_429_retry_after_is_honoured_before_the_next_attempt(
        db: asyncpg.Connection, dbpool: asyncpg.Pool,
) -> None:
    async with erp_stub.running() as erp:
        erp.reply = erp_stub.statuses(429, headers={"Retry-After": "2"})
        await helpers.register(db, erp.webhook_url)
        [job_id] = await helpers.succeed(db)
        async with helpers.dispatcher(dbpool) as d:
            first = await d.run_once()
            assert first.retried == 1
            delivery = await helpers.delivery_of(db, job_id)
            wait_s = (delivery.next_attempt_at - delivery.updated_at).total_seconds()
            assert 1.9 <= wait_s <= 2.1, "backoff is 50 ms at most: the wait is Retry-After's"
            assert (await d.run_once()).claimed == 0, "not due before Retry-After"
            await _drive(d, db, {"DELIVERED"})
    assert len(erp.requests) == 2


async def test_a_4xx_is_terminal_at_once_and_a_redirect_is_not_followed(
        db: asyncpg.Connection, dbpool: asyncpg.Pool,
) -> None:
    async with erp_stub.running() as erp, erp_stub.running() as elsewhere:
        erp.reply = erp_stub.status(422)
        await helpers.register(db, erp.webhook_url)
        [refused] = await helpers.succeed(db)
        async with helpers.dispatcher(dbpool) as d:
            assert (await d.run_once()).failed == 1
            erp.reply = erp_stub.status(302, headers={"Location": elsewhere.webhook_url})
            [redirected] = await helpers.succeed(db, name="b2")
            assert (await d.run_once()).failed == 1
    assert elsewhere.requests == []
    first = await helpers.delivery_of(db, refused)
    assert (first.state, first.last_status, first.last_error_class) == ("FAILED_TERMINAL", 422, "HttpRefused")
    second = await helpers.delivery_of(db, redirected)
    assert (second.state, second.last_status, second.last_error_class) == (
        "FAILED_TERMINAL", 302, "RedirectNotFollowed"
    )
    assert second.last_error is not None and "redirect to 127.0.0.1 not followed" in second.last_error


async def test_repeated_401_and_403_set_auth_failing_on_the_endpoint_and_a_2xx_clears_it(
        db: asyncpg.Connection, dbpool: asyncpg.Pool,
) -> None:
    async with erp_stub.running() as erp:
        erp.reply = erp_stub.statuses(401, 403, 401)
        await helpers.register(db, erp.webhook_url)
        [job_id] = await helpers.succeed(db)
        async with helpers.dispatcher(dbpool) as d:
            for _ in range(3):
                await waiting.until(lambda: _claims_one(d), timeout_s=5)
            row = await db.fetchrow("SELECT auth_failing, auth_failures, last_auth_status FROM endpoints")
            assert (row["auth_failing"], row["auth_failures"], row["last_auth_status"]) == (True, 3, 401)
            delivery = await helpers.delivery_of(db, job_id)
            assert (delivery.state, delivery.last_error_class) == ("RETRY_SCHEDULED", "AuthRefused")
            await d.run_once()  # reads the endpoint as it is now: the alarm is raised
            assert metrics.DELIVERY_AUTH_FAILING.labels(helpers.ENDPOINT)._value.get() == 1
            await _drive(d, db, {"DELIVERED"})
            await d.run_once()
            assert metrics.DELIVERY_AUTH_FAILING.labels(helpers.ENDPOINT)._value.get() == 0
    row = await db.fetchrow("SELECT auth_failing, auth_failures, auth_failing_since FROM endpoints")
    assert (row["auth_failing"], row["auth_failures"], row["auth_failing_since"]) == (False, 0, None)


async def _claims_one(d: dispatching.Dispatcher) -> bool:
    return (await d.run_once()).claimed == 1


async def test_the_breaker_opens_after_failures_stops_sending_and_one_half_open_probe_closes_it(
        db: asyncpg.Connection, dbpool: asyncpg.Pool,
) -> None:
    settings = DeliverySettings(**{**helpers.FAST.__dict__, "breaker_threshold": 3, "breaker_cooldown_s": 0.5,
                                   "backoff_cap_s": 0.01})  # fmt: skip
    async with erp_stub.running() as erp:
        erp.reply = erp_stub.status(503)
        await helpers.register(db, erp.webhook_url)
        await helpers.succeed(db, count=3)
        async with helpers.dispatcher(dbpool, settings=settings) as d:
            assert (await d.run_once()).claimed == 3
            row = await db.fetchrow("SELECT breaker_state, breaker_open_until > clock_timestamp() AS cooling "
                                    "FROM endpoints")  # fmt: skip
            assert (row["breaker_state"], row["cooling"]) == ("open", True)
            sent = len(erp.requests)
            assert (await d.run_once()).claimed == 0, "open: nothing is sent"
            assert len(erp.requests) == sent
            erp.reply = erp_stub.status(200)
            await waiting.until(lambda: _claims_one(d), timeout_s=5)  # the probe, after the cool-down
            assert len(erp.requests) == sent + 1, "half-open: exactly one probe"
            assert await db.fetchval("SELECT breaker_state FROM endpoints") == "closed"
            await _drive(d, db, {"DELIVERED"})


async def test_a_failed_probe_reopens_the_breaker_with_a_longer_cool_down(
        db: asyncpg.Connection, dbpool: asyncpg.Pool,
) -> None:
    settings = DeliverySettings(**{**helpers.FAST.__dict__, "breaker_threshold": 1, "breaker_cooldown_s": 0.3,
                                   "breaker_cooldown_cap_s": 5.0, "backoff_cap_s": 0.01})  # fmt: skip
    async with erp_stub.running() as erp:
        erp.reply = erp_stub.status(503)
        await helpers.register(db, erp.webhook_url)
        await helpers.succeed(db, count=2)
        async with helpers.dispatcher(dbpool, settings=settings) as d:
            await d.run_once()
            assert await db.fetchval("SELECT breaker_opens FROM endpoints") == 1
            await waiting.until(lambda: _claims_one(d), timeout_s=5)
            row = await db.fetchrow("SELECT breaker_state, breaker_opens, "
                                    "extract(epoch FROM breaker_open_until - breaker_changed_at) AS s FROM endpoints")
            assert (row["breaker_state"], row["breaker_opens"]) == ("open", 2)
            assert 0.55 <= float(row["s"]) <= 0.65, "the second opening lasts twice as long"


async def test_a_request_whose_answer_never_comes_ends_unknown_external_when_the_budget_is_spent(
        db: asyncpg.Connection, dbpool: asyncpg.Pool,
) -> None:
    settings = DeliverySettings(**{**helpers.FAST.__dict__, "read_timeout_s": 0.3, "total_timeout_s": 0.5})
    async with erp_stub.running() as erp:
        erp.reply = erp_stub.hang()
        await helpers.register(db, erp.webhook_url, max_attempts=2)
        [job_id] = await helpers.succeed(db)
        async with helpers.dispatcher(dbpool, settings=settings) as d:
            await _drive(d, db, {"UNKNOWN_EXTERNAL"})
    delivery = await helpers.delivery_of(db, job_id)
    assert (delivery.state, delivery.attempt, delivery.ambiguous_attempts) == ("UNKNOWN_EXTERNAL", 2, 2)
    assert delivery.last_error_class == "OutcomeUnknown"
    assert delivery.last_error is not None and "retry budget spent (ATTEMPTS_EXHAUSTED)" in delivery.last_error
    assert len(erp.requests) == 2


async def test_a_refused_connection_is_a_safe_retry_and_ends_failed_terminal_not_unknown(
        db: asyncpg.Connection, dbpool: asyncpg.Pool,
) -> None:
    async with erp_stub.running() as erp:
        url = erp.webhook_url
    await helpers.register(db, url, max_attempts=2)  # nothing listens there any more
    [job_id] = await helpers.succeed(db)
    async with helpers.dispatcher(dbpool) as d:
        await _drive(d, db, {"FAILED_TERMINAL"})
    delivery = await helpers.delivery_of(db, job_id)
    assert (delivery.state, delivery.ambiguous_attempts, delivery.last_error_class) == (
        "FAILED_TERMINAL", 0, "ConnectFailed"
    )


async def test_an_endpoint_without_a_secret_keeps_its_deliveries_due_and_counts_them(
        db: asyncpg.Connection, dbpool: asyncpg.Pool,
) -> None:
    async with erp_stub.running() as erp:
        await helpers.register(db, erp.webhook_url)
        await helpers.succeed(db, count=2)
        async with helpers.dispatcher(dbpool, secrets=()) as d:
            assert (await d.run_once()).claimed == 0
            await d.refresh_health()
    assert erp.requests == []
    assert await helpers.states(db) == {"PENDING": 2}
    assert metrics.DELIVERIES_WAITING_FOR_SECRET.labels(helpers.ENDPOINT)._value.get() == 2


async def test_an_oversized_answer_is_read_only_up_to_the_limit(
        db: asyncpg.Connection, dbpool: asyncpg.Pool,
) -> None:
    settings = DeliverySettings(**{**helpers.FAST.__dict__, "max_response_bytes": 1024})
    async with erp_stub.running() as erp:
        erp.reply = erp_stub.huge(512 * 1024 * 1024)
        await helpers.register(db, erp.webhook_url)
        [job_id] = await helpers.succeed(db)
        async with helpers.dispatcher(dbpool, settings=settings) as d:
            await asyncio.wait_for(d.run_once(), 5)
    delivery = await helpers.delivery_of(db, job_id)
    assert delivery.state == "DELIVERED", "the status decides; the answer's body is not ours to wait for"
    [attempt] = await deliveries.attempts_of(db, delivery_id=delivery.id)
    assert attempt.error_class == "ResponseTooLarge"
    assert attempt.error is not None and "longer than 1024 bytes" in attempt.error
    assert getattr(erp, "huge_sent", 0) < 64 * 1024 * 1024, "the stream was cut, not drained"


async def test_of_two_dispatchers_only_one_probes_a_half_open_endpoint(
        db: asyncpg.Connection, dbpool: asyncpg.Pool,
) -> None:
    settings = DeliverySettings(**{**helpers.FAST.__dict__, "breaker_threshold": 1, "breaker_cooldown_s": 0.2,
                                   "backoff_cap_s": 0.01})  # fmt: skip
    async with erp_stub.running() as erp:
        erp.reply = erp_stub.status(503)
        await helpers.register(db, erp.webhook_url)
        await helpers.succeed(db, count=4)
        async with helpers.dispatcher(dbpool, settings=settings, owner="one") as one, \
                helpers.dispatcher(dbpool, settings=settings, owner="two") as two:  # fmt: skip
            await one.run_once()
            assert await db.fetchval("SELECT breaker_state FROM endpoints") == "open"
            sent = len(erp.requests)
            erp.reply = erp_stub.slow(0.5)
            await db.execute("UPDATE endpoints SET breaker_open_until = clock_timestamp()")
            await db.execute("UPDATE deliveries SET next_attempt_at = clock_timestamp()")  # backoff over too
            rounds = await asyncio.gather(one.run_once(), two.run_once())
    assert sorted(r.claimed for r in rounds) == [0, 1]
    assert len(erp.requests) == sent + 1


async def test_a_probe_waits_for_a_due_delivery_instead_of_holding_the_slot_with_nothing_to_send(
        db: asyncpg.Connection, dbpool: asyncpg.Pool,
) -> None:
    settings = DeliverySettings(**{**helpers.FAST.__dict__, "breaker_threshold": 1, "total_timeout_s": 30.0})
    async with erp_stub.running() as erp:
        erp.reply = erp_stub.status(503)
        await helpers.register(db, erp.webhook_url)
        await helpers.succeed(db, count=2)
        async with helpers.dispatcher(dbpool, settings=settings) as d:
            await d.run_once()
            assert await db.fetchval("SELECT breaker_state FROM endpoints") == "open"
            sent = len(erp.requests)
            erp.reply = erp_stub.status(200)
            await db.execute("UPDATE endpoints SET breaker_open_until = clock_timestamp()")
            await db.execute("UPDATE deliveries SET next_attempt_at = clock_timestamp() + interval '1 hour'")
            assert (await d.run_once()).claimed == 0, "cool-down over, but nothing is due"
            row = await db.fetchrow("SELECT breaker_state, breaker_probe_until FROM endpoints")
            assert (row["breaker_state"], row["breaker_probe_until"]) == ("open", None), "no probe slot taken"
            await db.execute("UPDATE deliveries SET next_attempt_at = clock_timestamp()")
            assert (await d.run_once()).claimed == 1, "probed at once, not after a 35 s probe lease"
    assert len(erp.requests) == sent + 1
    assert await db.fetchval("SELECT breaker_state FROM endpoints") == "closed"


async def test_a_body_over_the_limit_is_not_sent_and_fails_naming_its_size(
        db: asyncpg.Connection, dbpool: asyncpg.Pool,
) -> None:
    settings = DeliverySettings(**{**helpers.FAST.__dict__, "max_body_bytes": 2048})
    async with erp_stub.running() as erp:
        await helpers.register(db, erp.webhook_url)
        [job_id] = await helpers.succeed(db, result={"notes": "x" * 4096})
        async with helpers.dispatcher(dbpool, settings=settings) as d:
            assert (await d.run_once()).failed == 1
    assert erp.requests == []
    delivery = await helpers.delivery_of(db, job_id)
    assert (delivery.state, delivery.last_error_class) == ("FAILED_TERMINAL", "BodyTooLarge")
    assert delivery.last_error is not None and "at most 2048 are sent" in delivery.last_error


async def test_unknown_external_deliveries_are_counted_per_endpoint_for_alerting(
        db: asyncpg.Connection, dbpool: asyncpg.Pool,
) -> None:
    settings = DeliverySettings(**{**helpers.FAST.__dict__, "read_timeout_s": 0.3, "total_timeout_s": 0.5})
    async with erp_stub.running() as erp:
        erp.reply = erp_stub.hang()
        await helpers.register(db, erp.webhook_url, max_attempts=1)
        await helpers.succeed(db, count=3)
        async with helpers.dispatcher(dbpool, settings=settings) as d:
            assert (await d.run_once()).unknown == 3
            await d.refresh_health()
    assert metrics.DELIVERIES_UNKNOWN_EXTERNAL.labels(helpers.ENDPOINT)._value.get() == 3
