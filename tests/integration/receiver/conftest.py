"""Receiver fixtures: a running receiver on a real database, and a way to post signed deliveries to it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import asyncpg
import pytest
from lading_webhook_receiver import serving

from tests.integration.receiver import deliveries

Post = Callable[..., Awaitable[tuple[int, dict[str, Any], Any]]]


@pytest.fixture
def secret() -> str:
    return deliveries.new_secret()


@pytest.fixture
async def receiver(db: asyncpg.Connection, database_url: str, secret: str) -> AsyncIterator[serving.RunningReceiver]:
    await serving.migrate(database_url)  # the receiver never migrates: `lading migrate --receiver` does
    async with serving.receiving(database_url=database_url, secrets=[secret], port=0) as server:
        yield server


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        yield session


@pytest.fixture
def post(receiver: serving.RunningReceiver, http: aiohttp.ClientSession, secret: str) -> Post:
    """POST `body` signed with `secret` (or the given headers) to the receiver; (status, JSON, headers)."""

    async def send(
            body: bytes,
            *,
            delivery_id: str = "msg_1",
            headers: dict[str, str] | None = None,
            key: str | None = None,
            timestamp: int | None = None,
    ) -> tuple[int, dict[str, Any], Any]:
        sent = headers if headers is not None else deliveries.signed(
            body, secret=key or secret, delivery_id=delivery_id, timestamp=timestamp
        )
        async with http.post(receiver.url, data=body, headers=sent) as response:
            answer = await response.json() if response.content_type == "application/json" else {}
            return response.status, answer, response.headers

    return send

