"""
Hostile webhook bodies, correctly signed, posted over real HTTP to the real receiver on a real
PostgreSQL. A signature proves who sent a body, not that it is sane.

One receiver serves the whole test. Invariants: with its database up, the receiver never answers
5xx; a body carrying U+0000 or an integer past 64 bits on purpose is a 400; nothing half-recorded
(an answer other than 200 records nothing); a good delivery after each example is booked.
"""

from __future__ import annotations

import dataclasses
import io
import itertools
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import asyncpg
import hypothesis
import pytest
from hypothesis import strategies as st
from lading_webhook_receiver import ledger, serving

from tests.hostile import strategies, tally
from tests.integration.receiver import deliveries


@dataclasses.dataclass
class Receiver:
    db: asyncpg.Connection
    server: serving.RunningReceiver
    http: aiohttp.ClientSession
    secret: str
    ids: itertools.count[int] = dataclasses.field(default_factory=lambda: itertools.count(1))

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:  # printed with a failing example: keep it short
        printer.text("<Receiver>")

    async def post(self, body: bytes) -> tuple[int, dict[str, Any]]:
        n = next(self.ids)
        headers = deliveries.signed(body, secret=self.secret, delivery_id=f"msg_hostile_{n}")
        async with self.http.post(self.server.url, data=io.BytesIO(body), headers=headers) as response:
            answer = await response.json() if response.content_type == "application/json" else {}
            return response.status, answer

    async def rows(self) -> tuple[int, int]:
        return await ledger.count(self.db), int(await self.db.fetchval("SELECT count(*) FROM erp_inbox"))


@pytest.fixture
async def receiver(db: asyncpg.Connection, database_url: str) -> AsyncIterator[Receiver]:
    secret = deliveries.new_secret()
    await serving.migrate(database_url)
    async with (
        serving.receiving(database_url=database_url, secrets=[secret], port=0) as server,
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http,
    ):
        yield Receiver(db=db, server=server, http=http, secret=secret)


HUGE_BODIES = (
    strategies.WebhookBody("deep", ("data", "result", "evidence"), strategies.nested(300, kind="object")),
    strategies.WebhookBody("deep", ("data",), strategies.nested(10_000, kind="list")),
    strategies.WebhookBody("huge-int", ("data", "job_id"), str(2**64), unstorable=True),
    strategies.WebhookBody("huge-int", ("data", "result", "evidence"), '{"total": ' + "9" * 30 + "}",
                           unstorable=True),
    strategies.WebhookBody("huge", ("data", "result", "supplier", "name"), strategies.dumps("x" * 3_000_000)),
)
"""Nested past orjson's 254 levels where the payload is free-form, integers orjson would read as
floats, and a body past the receiver's size limit."""


@hypothesis.settings(
    max_examples=40, deadline=None, suppress_health_check=[hypothesis.HealthCheck.function_scoped_fixture],
)  # fmt: skip
@hypothesis.given(body=strategies.webhook_bodies())
@hypothesis.example(body=HUGE_BODIES[0])
@hypothesis.example(body=HUGE_BODIES[1])
@hypothesis.example(body=HUGE_BODIES[2])
@hypothesis.example(body=HUGE_BODIES[3])
@hypothesis.example(body=HUGE_BODIES[4])
async def test_bad_bodies_are_4xx_never_5xx_and_a_good_delivery_is_booked_after_them(
        receiver: Receiver, body: strategies.WebhookBody,
) -> None:
    n = next(receiver.ids)
    valid = deliveries.event_body(job_id=n)
    before = await receiver.rows()
    status, answer = await receiver.post(body.encoded(valid))
    tally.tried("webhook-body")
    tally.check("receiver", status < 500, f"answered {status} {answer} with its database up")
    if body.unstorable:
        assert status == 400, answer
    if status != 200:
        assert 400 <= status < 500 and answer.get("error"), answer
        assert await receiver.rows() == before, "a refused delivery recorded something"
    good = deliveries.event_body(job_id=n + 1_000_000, result=deliveries.invoice(number=f"INV-GOOD-{n}"))
    status, answer = await receiver.post(good)
    tally.check("receiver", (status, answer.get("status")) == (200, "accepted"),
                f"a good delivery after a hostile one got {status} {answer}")  # fmt: skip


@hypothesis.settings(
    max_examples=15, deadline=None, suppress_health_check=[hypothesis.HealthCheck.function_scoped_fixture],
)  # fmt: skip
@hypothesis.given(body=st.binary(max_size=200) | strategies.JSON_LIKE.map(lambda v: strategies.dumps(v).encode()))
async def test_any_signed_bytes_are_4xx(receiver: Receiver, body: bytes) -> None:
    status, answer = await receiver.post(body)
    tally.tried("webhook-body")
    tally.check("receiver", status < 500, f"answered {status} {answer} with its database up")
    assert 400 <= status < 500, (status, answer)
