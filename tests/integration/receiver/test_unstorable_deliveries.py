"""
Bodies the receiver's database cannot store, over real HTTP against the real receiver: each is a
4xx that names the problem (and never the value), nothing is recorded, and the next good
delivery is booked. A 5xx is kept for a database that cannot be reached.
"""

from __future__ import annotations

import json

import asyncpg
import pytest
from lading_webhook_receiver import ledger, serving

from tests.integration.receiver import deliveries
from tests.integration.receiver.conftest import Post


async def _rows(db: asyncpg.Connection) -> tuple[int, int]:
    return await ledger.count(db), int(await db.fetchval("SELECT count(*) FROM erp_inbox"))


def _body(**changes: object) -> bytes:
    envelope = json.loads(deliveries.event_body())
    for path, value in changes.items():
        node = envelope
        *parents, last = path.split("__")
        for step in parents:
            node = node[step]
        node[last] = value
    return json.dumps(envelope).encode()


UNSTORABLE = [
    # Valid JSON and a valid invoice, but PostgreSQL text/jsonb cannot hold U+0000: this used to be a 500
    # (CharacterNotInRepertoireError), which a sender retries for ever.
    ("nul-in-supplier", _body(data__result__supplier={"name": "Kuzey\x00 Tekstil", "vat_id": "TR1", "iban": None}),
     "body.data.result.supplier.name: contains U+0000 (NUL)"),
    ("nul-in-evidence-key", _body(data__result__evidence={"tot\x00al": "118.00"}),
     "body.data.result.evidence: a key contains U+0000 (NUL)"),
    ("nul-in-tenant", _body(data__tenant="acme\x00"), "body.data.tenant: contains U+0000 (NUL)"),
    ("integer-past-64-bits", _body(data__result__lines=[{"quantity": 2**63}]),
     "body.data.result.lines[0].quantity: integer out of range"),
    # orjson reads an integer of 2**64 or more as a float: the value must not change on the way in.
    ("integer-past-2-to-the-64", _body(data__result__lines=[{"quantity": 2**64}]),
     "body.data.result.lines[0].quantity: integer out of range"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "body", "message"), UNSTORABLE, ids=[case for case, _, _ in UNSTORABLE])
async def test_an_unstorable_body_is_a_400_naming_the_field(
        post: Post, db: asyncpg.Connection, receiver: serving.RunningReceiver, case: str, body: bytes, message: str,
) -> None:
    status, answer, _ = await post(body, delivery_id=f"msg_{case}")
    assert (status, answer["error"]) == (400, "unstorable"), answer
    assert answer["message"].startswith(message), answer["message"]
    assert "Kuzey" not in answer["message"], "document values are not echoed"
    assert await _rows(db) == (0, 0)
    status, answer, _ = await post(deliveries.event_body(), delivery_id="msg_good")
    assert (status, answer["status"]) == (200, "accepted")
    assert receiver.counts().rejected == {"unstorable": 1}


MALFORMED = [
    ("lone-surrogate", deliveries.event_body().replace(b"Acme GmbH", b"Acme \\ud800GmbH"), "bad-json"),
    ("nan", deliveries.event_body().replace(b'"118.00"', b"NaN", 1), "bad-json"),
    ("not-json", b"\x00\x01\x02", "bad-json"),
    ("absurd-nesting", b'{"type": "extraction.completed.v1", "data": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
     "bad-json"),
    ("not-an-object", b'"\\u0000"', "bad-schema"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "body", "reason"), MALFORMED, ids=[case for case, _, _ in MALFORMED])
async def test_malformed_bodies_are_a_400_with_a_reason(
        post: Post, db: asyncpg.Connection, case: str, body: bytes, reason: str,
) -> None:
    status, answer, _ = await post(body, delivery_id=f"msg_{case}")
    assert (status, answer["error"]) == (400, reason), answer
    assert answer["message"]
    assert await _rows(db) == (0, 0)


async def test_a_data_error_raised_while_recording_is_a_400_and_rolls_back(
        post: Post, db: asyncpg.Connection, receiver: serving.RunningReceiver,
) -> None:
    """Defence in depth: a value the checks let through but the database refuses (here, a trigger
    raising numeric_value_out_of_range for one invoice number) is the sender's problem (400), not
    an outage (503) or a crash (500); the inbox row and the booking roll back together."""
    await db.execute(
        """CREATE FUNCTION refuse_invoice() RETURNS trigger LANGUAGE plpgsql AS $$
           BEGIN
             IF NEW.invoice_number = 'INV-OVERFLOW' THEN
               RAISE EXCEPTION 'numeric field overflow' USING ERRCODE = 'numeric_value_out_of_range';
             END IF;
             RETURN NEW;
           END $$;
           CREATE TRIGGER refuse_invoice BEFORE INSERT ON ledger_invoices
              FOR EACH ROW EXECUTE FUNCTION refuse_invoice();"""
    )
    refused = deliveries.event_body(result=deliveries.invoice(number="INV-OVERFLOW"))
    status, answer, _ = await post(refused, delivery_id="msg_overflow")
    assert (status, answer["error"]) == (400, "unstorable"), answer
    assert "NumericValueOutOfRangeError, SQLSTATE 22003" in answer["message"]
    assert await _rows(db) == (0, 0)
    status, answer, _ = await post(refused, delivery_id="msg_overflow")
    assert status == 400, "the same body fails the same way, and nothing was half-recorded"
    status, answer, _ = await post(deliveries.event_body(), delivery_id="msg_good")
    assert (status, answer["status"]) == (200, "accepted")
    assert await _rows(db) == (1, 1)
    assert receiver.counts().rejected == {"unstorable": 2}
