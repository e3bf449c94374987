"""
Failures around the transaction: the answer lost after the commit, a failure before it, and
the database gone. Each ends with exactly one ERP record once the sender redelivers.

The failpoints used (lading/failpoints.py, `LADING_FAILPOINTS` in a process):
    receiver.before_commit                  inside the transaction, after the ERP write
    receiver.after_commit_before_response   committed, answer not yet sent
"""

from __future__ import annotations

import asyncio

import aiohttp
import asyncpg
import pytest
from lading_webhook_receiver import inbox, ledger, serving, settings

from lading import failpoints
from tests.integration.receiver import deliveries
from tests.integration.receiver.conftest import Post
from tests.support import faultproxy, waiting


async def _booked(db: asyncpg.Connection, n: int) -> bool:
    return await ledger.count(db) == n


async def test_a_committed_delivery_whose_answer_was_lost_is_booked_once_when_redelivered(
        receiver: serving.RunningReceiver, post: Post, db: asyncpg.Connection, secret: str
) -> None:
    body = deliveries.event_body()
    headers = deliveries.signed(body, secret=secret, delivery_id="msg_lost")
    with failpoints.enabled("receiver.after_commit_before_response", "sleep(1000)@1"):
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=0.3)) as impatient:
            with pytest.raises(TimeoutError):
                async with impatient.post(receiver.url, data=body, headers=headers) as response:
                    await response.read()
        # The sender saw a timeout; the receiver commits (or had committed) all the same.
        await waiting.until(lambda: _booked(db, 1), timeout_s=10)
        status, answer, _ = await post(body, headers=headers)  # the dispatcher's redelivery
    stored = await db.fetchval("SELECT reference FROM ledger_invoices")
    assert (status, answer) == (200, {"status": "duplicate", "reference": stored})
    assert await ledger.count(db) == 1
    assert (receiver.counts().accepted, receiver.counts().duplicate_delivery) == (1, 1)


async def test_a_failure_before_the_commit_leaves_nothing_and_the_redelivery_books_once(
        receiver: serving.RunningReceiver, post: Post, db: asyncpg.Connection
) -> None:
    body = deliveries.event_body()
    with failpoints.enabled("receiver.before_commit", "raise@1"):
        status, answer, _ = await post(body, delivery_id="msg_rb")
        assert (status, answer["error"]) == (500, "internal-error")
        assert await ledger.count(db) == 0
        assert await inbox.count_by_status(db) == {}
        status, answer, _ = await post(body, delivery_id="msg_rb")
    assert (status, answer["status"]) == (200, "accepted")
    assert await ledger.count(db) == 1


@pytest.mark.parametrize("mode", ["reset", "blackhole"])
async def test_while_the_database_is_unavailable_deliveries_get_503_with_retry_after(
        db: asyncpg.Connection, database_url: str, secret: str, http: aiohttp.ClientSession, mode: str
) -> None:
    config = settings.ReceiverSettings(database_timeout_s=1.0, retry_after_s=7)
    await serving.migrate(database_url)
    async with faultproxy.in_front_of(database_url) as (proxy, proxied), serving.receiving(
        database_url=proxied, secrets=[secret], config=config
    ) as server:
        body = deliveries.event_body()
        headers = deliveries.signed(body, secret=secret, delivery_id="msg_down")
        proxy.set_mode(mode)
        async with http.post(server.url, data=body, headers=headers) as response:
            assert response.status == 503
            assert response.headers["Retry-After"] == "7"
            assert (await response.json())["error"] == "database-unavailable"
        async with http.get(server.url + "/readyz") as response:
            assert response.status == 503 and (await response.text()).startswith("database unavailable")
        async with http.get(server.url + "/healthz") as response:
            assert response.status == 200  # liveness does not follow the database
        assert await ledger.count(db) == 0

        proxy.set_mode("pass")
        async with http.post(server.url, data=body, headers=headers) as response:
            assert response.status == 200 and (await response.json())["status"] == "accepted"
        assert server.counts().rejected == {"database-unavailable": 1}
    assert await ledger.count(db) == 1


async def test_a_request_in_flight_when_shutdown_begins_is_finished(
        db: asyncpg.Connection, database_url: str, secret: str, http: aiohttp.ClientSession
) -> None:
    body = deliveries.event_body()
    headers = deliveries.signed(body, secret=secret, delivery_id="msg_drain")
    await serving.migrate(database_url)
    with failpoints.enabled("receiver.after_commit_before_response", "sleep(500)@1"):
        async with serving.receiving(database_url=database_url, secrets=[secret]) as server:
            request = asyncio.create_task(http.post(server.url, data=body, headers=headers))
            await waiting.until(lambda: _booked(db, 1), timeout_s=10)  # committed, answer held back
        # Leaving the block shut the server down; the delivery in flight still got its answer.
        response = await request
        async with response:
            assert response.status == 200
            assert (await response.json())["status"] == "accepted"
