"""The receiver's answers: what is booked, what is refused and why, and what is never booked twice."""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp
import asyncpg
from lading_webhook_receiver import inbox, ledger, serving, settings

from tests.integration.receiver import deliveries
from tests.integration.receiver.conftest import Post


async def _rows(db: asyncpg.Connection) -> tuple[int, int]:
    return await ledger.count(db), int(await db.fetchval("SELECT count(*) FROM erp_inbox"))


async def test_a_signed_delivery_books_one_invoice_and_answers_after_commit(
        post: Post, db: asyncpg.Connection, receiver: serving.RunningReceiver
) -> None:
    status, answer, _ = await post(deliveries.event_body(job_id=7), delivery_id="msg_a")
    assert status == 200
    assert answer["status"] == "accepted" and answer["reference"].startswith("LDG-")
    row = await db.fetchrow("SELECT * FROM ledger_invoices")
    assert row["reference"] == answer["reference"]
    assert (row["tenant"], row["supplier_identity"], row["invoice_number"]) == ("acme", "vat:TR1234567890", "INV-1001")
    assert (row["lading_job_id"], row["delivery_id"], str(row["total"])) == ("7", "msg_a", "118.000000")
    assert await inbox.count_by_status(db) == {"accepted": 1}
    assert receiver.counts().accepted == 1
    assert await receiver.ledger_count() == 1


async def test_a_replayed_delivery_gets_the_original_answer_and_changes_nothing(
        post: Post, db: asyncpg.Connection, receiver: serving.RunningReceiver
) -> None:
    body = deliveries.event_body()
    _, first, _ = await post(body, delivery_id="msg_r")
    status, again, _ = await post(body, delivery_id="msg_r")
    assert status == 200
    assert again == {"status": "duplicate", "reference": first["reference"]}
    assert await _rows(db) == (1, 1)
    counts = receiver.counts()
    assert (counts.accepted, counts.duplicate_delivery, counts.duplicate_intent) == (1, 1, 0)


async def test_the_same_delivery_id_with_another_body_is_a_409_conflict_and_an_alarm(
        post: Post, db: asyncpg.Connection, receiver: serving.RunningReceiver, caplog: object
) -> None:
    _, first, _ = await post(deliveries.event_body(job_id=1), delivery_id="msg_c")
    other = deliveries.event_body(job_id=1, result=deliveries.invoice(total="999.00"))
    status, answer, _ = await post(other, delivery_id="msg_c")  # correctly signed, different body
    assert status == 409 and answer["error"] == "delivery-conflict"
    assert await _rows(db) == (1, 1)
    assert await db.fetchval("SELECT total FROM ledger_invoices") == 118
    assert await db.fetchval("SELECT reference FROM ledger_invoices") == first["reference"]
    assert receiver.counts().rejected == {"delivery-conflict": 1}
    assert receiver.observed.registry.get_sample_value("lading_receiver_delivery_conflicts_total") == 1
    assert "999.00" not in str(getattr(caplog, "text", ""))  # the log names digests, never the body


async def test_a_tampered_body_is_refused(post: Post, db: asyncpg.Connection, secret: str) -> None:
    body = deliveries.event_body()
    headers = deliveries.signed(body, secret=secret, delivery_id="msg_t")
    status, answer, _ = await post(body.replace(b"118.00", b"911.00"), headers=headers)
    assert (status, answer["error"]) == (401, "bad-signature")
    assert await _rows(db) == (0, 0)


async def test_a_wrong_secret_or_missing_signature_is_refused(
        post: Post, db: asyncpg.Connection, receiver: serving.RunningReceiver
) -> None:
    body = deliveries.event_body()
    status, answer, _ = await post(body, key=deliveries.new_secret())
    assert (status, answer["error"]) == (401, "bad-signature")
    status, answer, _ = await post(body, headers={"Content-Type": "application/json"})
    assert (status, answer["error"]) == (401, "missing-headers")
    assert await _rows(db) == (0, 0)
    assert receiver.counts().rejected == {"bad-signature": 1, "missing-headers": 1}


async def test_during_a_rotation_both_secrets_are_accepted(
        db: asyncpg.Connection, database_url: str, http: aiohttp.ClientSession
) -> None:
    old, new = deliveries.new_secret(), deliveries.new_secret()
    await serving.migrate(database_url)
    async with serving.receiving(database_url=database_url, secrets=[old, new]) as server:
        for n, secret in enumerate([old, new]):
            body = deliveries.event_body(job_id=n, result=deliveries.invoice(number=f"R-{n}"))
            headers = deliveries.signed(body, secret=secret, delivery_id=f"msg_rot{n}")
            async with http.post(server.url, data=body, headers=headers) as response:
                assert response.status == 200, await response.text()
    assert await ledger.count(db) == 2


async def test_timestamps_outside_the_tolerance_are_refused_both_ways(
        post: Post, db: asyncpg.Connection, receiver: serving.RunningReceiver
) -> None:
    body = deliveries.event_body()
    now = int(time.time())
    status, answer, _ = await post(body, timestamp=now - 301)
    assert (status, answer["error"]) == (401, "timestamp-too-old")
    status, answer, _ = await post(body, timestamp=now + 301)
    assert (status, answer["error"]) == (401, "timestamp-too-new")
    status, _, _ = await post(body, timestamp=now - 250)  # inside the 5 minutes
    assert status == 200
    assert await ledger.count(db) == 1


async def test_an_oversized_body_is_refused_before_it_is_read(
        db: asyncpg.Connection, database_url: str, http: aiohttp.ClientSession, secret: str
) -> None:
    config = settings.ReceiverSettings(max_body_bytes=4096)
    await serving.migrate(database_url)
    async with serving.receiving(database_url=database_url, secrets=[secret], config=config) as server:
        big = deliveries.event_body(result=deliveries.invoice(supplier="x" * 300) | {"evidence": {"a": "y" * 5000}})
        headers = deliveries.signed(big, secret=secret, delivery_id="msg_big")
        async with http.post(server.url, data=big, headers=headers) as response:
            assert response.status == 413  # announced by Content-Length

        async def chunks() -> object:  # no Content-Length: the limit applies while reading
            for start in range(0, len(big), 1000):
                yield big[start:start + 1000]

        async with http.post(server.url, data=chunks(), headers=headers) as response:
            assert response.status == 413
        assert server.counts().rejected == {"too-large": 2}
    assert await ledger.count(db) == 0


async def test_bad_json_bad_schema_and_wrong_content_type_are_refused_with_a_reason(
        post: Post, db: asyncpg.Connection, secret: str, receiver: serving.RunningReceiver
) -> None:
    status, answer, _ = await post(b"{not json", delivery_id="m1")
    assert (status, answer["error"]) == (400, "bad-json")
    envelope = json.loads(deliveries.event_body())
    del envelope["data"]["tenant"]
    status, answer, _ = await post(json.dumps(envelope).encode(), delivery_id="m2")
    assert (status, answer["error"]) == (400, "bad-schema") and "data.tenant" in answer["message"]
    bad_invoice = deliveries.event_body(result=deliveries.invoice() | {"total": "a lot"})
    status, answer, _ = await post(bad_invoice, delivery_id="m3")
    assert (status, answer["error"]) == (400, "bad-schema") and "data.result.total" in answer["message"]
    assert "a lot" not in answer["message"]  # document values are not echoed
    envelope = json.loads(deliveries.event_body())
    envelope["type"] = "extraction.completed.v9"
    status, answer, _ = await post(json.dumps(envelope).encode(), delivery_id="m4")
    assert (status, answer["error"]) == (400, "unsupported-event")
    body = deliveries.event_body()
    headers = deliveries.signed(body, secret=secret, delivery_id="m5") | {"Content-Type": "text/plain"}
    status, answer, _ = await post(body, headers=headers)
    assert (status, answer["error"]) == (415, "unsupported-media-type")
    assert await _rows(db) == (0, 0)
    assert receiver.counts().rejected == {
        "bad-json": 1, "bad-schema": 2, "unsupported-event": 1, "unsupported-media-type": 1
    }


async def test_the_same_invoice_in_another_delivery_is_not_booked_twice(
        post: Post, db: asyncpg.Connection, receiver: serving.RunningReceiver
) -> None:
    _, first, _ = await post(deliveries.event_body(job_id=1), delivery_id="batch1_doc1")
    # The same document uploaded again in a new batch: another job, another delivery id.
    status, answer, _ = await post(deliveries.event_body(job_id=2), delivery_id="batch2_doc1")
    assert status == 200
    assert answer == {"status": "duplicate", "reference": first["reference"]}
    # Same supplier by VAT id written differently, another tenant, another number:
    spaced = deliveries.invoice(vat_id="tr 123-456.7890", supplier="KUZEY TEKSTİL")
    assert (await post(deliveries.event_body(job_id=3, result=spaced), delivery_id="d3"))[1] == answer
    other_tenant = deliveries.event_body(job_id=4, tenant="globex")
    assert (await post(other_tenant, delivery_id="d4"))[1]["status"] == "accepted"
    other_number = deliveries.event_body(job_id=5, result=deliveries.invoice(number="INV-1002"))
    assert (await post(other_number, delivery_id="d5"))[1]["status"] == "accepted"
    assert await ledger.count(db) == 3
    assert await inbox.count_by_status(db) == {"accepted": 3, "duplicate": 2}
    counts = receiver.counts()
    assert (counts.accepted, counts.duplicate_intent, counts.duplicate_delivery) == (3, 2, 0)
    # A replay of a duplicate-intent delivery gets its stored answer (the same reference).
    assert (await post(deliveries.event_body(job_id=2), delivery_id="batch2_doc1"))[1] == answer


async def test_without_a_vat_id_the_supplier_is_known_by_its_normalised_name(
        post: Post, db: asyncpg.Connection
) -> None:
    one = deliveries.invoice(vat_id=None, supplier="Ege  Lojistik Ltd")
    two = deliveries.invoice(vat_id=None, supplier=" ege lojistik LTD ")
    _, first, _ = await post(deliveries.event_body(result=one), delivery_id="n1")
    _, second, _ = await post(deliveries.event_body(result=two), delivery_id="n2")
    assert second == {"status": "duplicate", "reference": first["reference"]}
    assert await db.fetchval("SELECT supplier_identity FROM ledger_invoices") == "name:ege lojistik ltd"


async def test_twenty_concurrent_copies_of_one_delivery_book_one_invoice(
        post: Post, db: asyncpg.Connection, receiver: serving.RunningReceiver
) -> None:
    body = deliveries.event_body()
    results = await asyncio.gather(*(post(body, delivery_id="msg_same") for _ in range(20)))
    assert [status for status, _, _ in results] == [200] * 20
    assert len({answer["reference"] for _, answer, _ in results}) == 1
    assert sorted(answer["status"] for _, answer, _ in results) == ["accepted"] + ["duplicate"] * 19
    assert await _rows(db) == (1, 1)
    counts = receiver.counts()
    assert (counts.accepted, counts.duplicate_delivery) == (1, 19)


async def test_concurrent_deliveries_of_one_intent_book_one_invoice(
        post: Post, db: asyncpg.Connection, receiver: serving.RunningReceiver
) -> None:
    results = await asyncio.gather(
        *(post(deliveries.event_body(job_id=n), delivery_id=f"msg_intent_{n}") for n in range(12))
    )
    assert {status for status, _, _ in results} == {200}
    assert len({answer["reference"] for _, answer, _ in results}) == 1
    assert await _rows(db) == (1, 12)
    assert (receiver.counts().accepted, receiver.counts().duplicate_intent) == (1, 11)


async def test_probes_and_metrics(receiver: serving.RunningReceiver, http: aiohttp.ClientSession, post: Post) -> None:
    await post(deliveries.event_body())
    async with http.get(receiver.url + "/healthz") as response:
        assert (response.status, await response.text()) == (200, "ok\n")
    async with http.get(receiver.url + "/readyz") as response:
        assert (response.status, await response.text()) == (200, "ok\n")
    async with http.get(receiver.base_url + "/metrics") as response:
        text = await response.text()
    assert 'lading_receiver_deliveries_total{outcome="accepted"} 1.0' in text
    assert 'lading_receiver_rejected_total{reason="bad-signature"} 0.0' in text
    assert "lading_receiver_delivery_conflicts_total 0.0" in text
    assert "lading_receiver_transaction_seconds_count 1.0" in text
