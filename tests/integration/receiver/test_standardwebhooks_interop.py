"""Our signatures and the reference `standardwebhooks` library (PyPI) accept each other, both directions."""

from __future__ import annotations

import datetime as dt
import time

import asyncpg
import pytest
import standardwebhooks
from lading_webhook_receiver import ledger

from lading.webhooks import signing
from tests.integration.receiver import deliveries
from tests.integration.receiver.conftest import Post


async def test_a_request_signed_by_standardwebhooks_is_accepted_by_the_receiver(
        post: Post, db: asyncpg.Connection, secret: str
) -> None:
    body = deliveries.event_body()
    now = dt.datetime.now(dt.UTC).replace(microsecond=0)
    signature = standardwebhooks.Webhook(secret).sign("msg_interop", now, body.decode())
    headers = {
        "webhook-id": "msg_interop",
        "webhook-timestamp": str(int(now.timestamp())),
        "webhook-signature": signature,
        "Content-Type": "application/json",
    }
    status, answer, _ = await post(body, headers=headers)
    assert (status, answer["status"]) == (200, "accepted")
    assert await ledger.count(db) == 1

    forged = standardwebhooks.Webhook(deliveries.new_secret()).sign("msg_forged", now, body.decode())
    status, answer, _ = await post(body, headers=headers | {"webhook-id": "msg_forged", "webhook-signature": forged})
    assert (status, answer["error"]) == (401, "bad-signature")


def test_what_we_sign_verifies_with_standardwebhooks_including_during_a_rotation() -> None:
    old, new = deliveries.new_secret(), deliveries.new_secret()
    body = deliveries.event_body()
    headers = signing.sign(signing.parse_keys([old, new]), "msg_1", int(time.time()), body)
    for secret in (old, new):
        assert standardwebhooks.Webhook(secret).verify(body, headers)["type"] == "extraction.completed.v1"
    with pytest.raises(standardwebhooks.WebhookVerificationError):
        standardwebhooks.Webhook(deliveries.new_secret()).verify(body, headers)
    with pytest.raises(standardwebhooks.WebhookVerificationError):
        standardwebhooks.Webhook(old).verify(body + b" ", headers)
