"""
Group commit: deliveries that arrive while the receiver's transactions are busy are recorded
together in one transaction, and the dedup rules hold inside a group exactly as across groups.

Each test holds the receiver's only group transaction (commit_groups=1) on a table lock taken by
the test, posts the deliveries under test, waits until every one of them is queued for the next
group, and then releases the lock: they are all recorded in that one next group.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence

import aiohttp
import asyncpg
from lading_webhook_receiver import inbox, ledger, serving, settings

from tests.integration.receiver import deliveries
from tests.support import waiting


async def _groups(server: serving.RunningReceiver) -> tuple[int, int]:
    """(group transactions committed, deliveries in them) from the receiver's metrics."""
    registry = server.observed.registry
    count = registry.get_sample_value("lading_receiver_commit_group_deliveries_count") or 0
    total = registry.get_sample_value("lading_receiver_commit_group_deliveries_sum") or 0
    return int(count), int(total)


@contextlib.asynccontextmanager
async def _one_group_receiver(database_url: str, secret: str) -> AsyncIterator[serving.RunningReceiver]:
    await serving.migrate(database_url)
    config = settings.ReceiverSettings(commit_groups=1)
    async with serving.receiving(database_url=database_url, secrets=[secret], config=config) as server:
        yield server


async def _in_one_group(
        server: serving.RunningReceiver, http: aiohttp.ClientSession, database_url: str, secret: str,
        sends: Sequence[tuple[bytes, str]],
) -> list[tuple[int, dict[str, str]]]:
    """Post a blocker, then `sends` (body, delivery id) while the blocker's transaction waits on a
    lock this test holds; release it once all of `sends` are queued: they form one group."""

    async def post(body: bytes, delivery_id: str) -> tuple[int, dict[str, str]]:
        headers = deliveries.signed(body, secret=secret, delivery_id=delivery_id)
        async with http.post(server.url, data=body, headers=headers) as response:
            return response.status, await response.json()

    committer = server.committer
    assert committer is not None
    holder = await asyncpg.connect(database_url)
    try:
        locked = holder.transaction()
        await locked.start()
        await holder.execute("LOCK TABLE erp_inbox IN EXCLUSIVE MODE")
        blocker = asyncio.create_task(post(deliveries.event_body(result=deliveries.invoice(number="BLOCKER")), "blk"))

        async def blocked() -> bool:
            return bool(await holder.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'lading-receiver' "
                "AND wait_event_type = 'Lock'"
            ))  # fmt: skip

        await waiting.until(blocked, timeout_s=20)
        posted = [asyncio.create_task(post(body, delivery_id)) for body, delivery_id in sends]

        async def all_queued() -> bool:
            return committer.queued == len(sends)

        await waiting.until(all_queued, timeout_s=20)
        await locked.rollback()
        assert (await blocker)[0] == 200
        return [await task for task in posted]
    finally:
        await holder.close()


async def test_fifty_concurrent_copies_of_one_delivery_in_one_group_book_one_invoice(
        db: asyncpg.Connection, database_url: str, secret: str
) -> None:
    body = deliveries.event_body(job_id=9)
    async with _one_group_receiver(database_url, secret) as server, aiohttp.ClientSession() as http:
        results = await _in_one_group(server, http, database_url, secret, [(body, "msg_same")] * 50)
        assert await _groups(server) == (2, 51), "the blocker alone, then all fifty copies in one group"
        counts = server.counts()
    assert [status for status, _ in results] == [200] * 50
    assert len({answer["reference"] for _, answer in results}) == 1
    assert sorted(answer["status"] for _, answer in results) == ["accepted"] + ["duplicate"] * 49
    assert await ledger.count(db) == 2  # the blocker's invoice and this one
    assert await inbox.count_by_status(db) == {"accepted": 2}
    assert (counts.accepted, counts.duplicate_delivery) == (2, 49)


async def test_one_intent_in_many_deliveries_of_one_group_is_booked_once(
        db: asyncpg.Connection, database_url: str, secret: str
) -> None:
    sends = [(deliveries.event_body(job_id=n), f"msg_intent_{n}") for n in range(12)]
    async with _one_group_receiver(database_url, secret) as server, aiohttp.ClientSession() as http:
        results = await _in_one_group(server, http, database_url, secret, sends)
        assert await _groups(server) == (2, 13)
        counts = server.counts()
    assert {status for status, _ in results} == {200}
    assert len({answer["reference"] for _, answer in results}) == 1
    assert sorted(answer["status"] for _, answer in results) == ["accepted"] + ["duplicate"] * 11
    assert await ledger.count(db) == 2
    assert await inbox.count_by_status(db) == {"accepted": 2, "duplicate": 11}
    assert (counts.accepted, counts.duplicate_intent) == (2, 11)


async def test_an_unstorable_delivery_in_a_group_fails_alone_and_the_others_commit(
        db: asyncpg.Connection, database_url: str, secret: str
) -> None:
    """A value the checks let through but the database refuses (a trigger raising a data error for
    one invoice number) fails that delivery alone with a 400; the rest of its group is booked."""
    await serving.migrate(database_url)
    await db.execute(
        """CREATE FUNCTION refuse_grouped_invoice() RETURNS trigger LANGUAGE plpgsql AS $$
           BEGIN
             IF NEW.invoice_number = 'INV-OVERFLOW' THEN
               RAISE EXCEPTION 'numeric field overflow' USING ERRCODE = 'numeric_value_out_of_range';
             END IF;
             RETURN NEW;
           END $$;
           CREATE TRIGGER refuse_grouped_invoice BEFORE INSERT ON ledger_invoices
              FOR EACH ROW EXECUTE FUNCTION refuse_grouped_invoice();"""
    )
    try:
        await _one_unstorable_in_a_group(db, database_url, secret)
    finally:
        await db.execute(
            "DROP TRIGGER refuse_grouped_invoice ON ledger_invoices; DROP FUNCTION refuse_grouped_invoice()"
        )


async def _one_unstorable_in_a_group(db: asyncpg.Connection, database_url: str, secret: str) -> None:
    sends = [
        (deliveries.event_body(job_id=n, result=deliveries.invoice(number=f"INV-{n:04d}")), f"msg_{n:02d}")
        for n in range(10)
    ]
    sends.insert(4, (deliveries.event_body(job_id=99, result=deliveries.invoice(number="INV-OVERFLOW")), "msg_bad"))
    async with _one_group_receiver(database_url, secret) as server, aiohttp.ClientSession() as http:
        results = await _in_one_group(server, http, database_url, secret, sends)
        counts = server.counts()
    answers = dict(zip((delivery_id for _, delivery_id in sends), results, strict=True))
    bad_status, bad_answer = answers.pop("msg_bad")
    assert (bad_status, bad_answer["error"]) == (400, "unstorable"), bad_answer
    assert {status for status, _ in answers.values()} == {200}
    assert {answer["status"] for _, answer in answers.values()} == {"accepted"}
    assert await ledger.count(db) == 11  # the blocker's and the ten good ones
    assert await db.fetchval("SELECT count(*) FROM erp_inbox WHERE delivery_id = 'msg_bad'") == 0
    assert (counts.accepted, counts.rejected) == (11, {"unstorable": 1})
