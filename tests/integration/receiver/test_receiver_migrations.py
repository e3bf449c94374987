"""The receiver's migrations: its own history table, its own lock, beside Lading's or alone."""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import AsyncIterator

import aiohttp
import asyncpg
import pytest
from lading_webhook_receiver import app, ledger, serving

from lading.db import migrating
from tests.integration.receiver import deliveries
from tests.support import waiting


@pytest.fixture
async def empty_database(admin_url: str) -> AsyncIterator[str]:
    name = f"lading_recv_{secrets.token_hex(4)}"
    admin = await asyncpg.connect(admin_url)
    await admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield admin_url.rsplit("/", 1)[0] + f"/{name}"
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


async def test_receiver_and_lading_migrations_apply_concurrently_into_separate_histories(empty_database: str) -> None:
    conns = [await asyncpg.connect(empty_database) for _ in range(4)]
    try:
        assert await migrating.pending(conns[0], app.MIGRATIONS) == [1]
        results = await asyncio.gather(
            migrating.migrate(conns[0], app.MIGRATIONS),
            migrating.migrate(conns[1], app.MIGRATIONS),
            migrating.migrate(conns[2]),
            serving.migrate(empty_database),
        )
        assert sorted(v for r in (results[0], results[1], results[3]) for v in r.applied) == [1]
        assert results[2].applied == tuple(m.version for m in migrating.available())
        assert await migrating.pending(conns[3], app.MIGRATIONS) == []
        assert await migrating.pending(conns[3]) == []
        assert await conns[3].fetchval("SELECT count(*) FROM lading_receiver.schema_migrations") == 1
        rows = await conns[3].fetch("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
        tables = {r["tablename"] for r in rows}
        assert {"erp_inbox", "ledger_invoices", "schema_migrations"} <= tables
    finally:
        for conn in conns:
            await conn.close()


async def test_the_receiver_never_migrates_it_refuses_deliveries_until_its_migrations_are_applied(
        empty_database: str, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="lading.schema")
    secret = deliveries.new_secret()
    body = deliveries.event_body()
    headers = deliveries.signed(body, secret=secret, delivery_id="msg_schema")
    async with (
        serving.receiving(database_url=empty_database, secrets=[secret], port=0) as server,
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http,
    ):
        conn = await asyncpg.connect(empty_database)
        try:
            assert await migrating.pending(conn, app.MIGRATIONS) == [1], "starting applied nothing"
        finally:
            await conn.close()
        async with http.get(server.url + "/readyz") as response:
            assert response.status == 503
            reason = await response.text()
            assert reason.startswith("migrations pending: 0001; waiting for `lading migrate --receiver`")
        async with http.post(server.url, data=body, headers=headers) as response:
            assert response.status == 503 and response.headers["Retry-After"]
            assert (await response.json())["error"] == "migrations-pending"

        await serving.migrate(empty_database)

        async def ready() -> bool:
            async with http.get(server.url + "/readyz") as response:
                return response.status == 200

        await waiting.until(ready, timeout_s=30)

        async def accepted() -> bool:
            async with http.post(server.url, data=body, headers=headers) as response:
                return response.status == 200

        await waiting.until(accepted, timeout_s=30)  # the door opens once the receiver has seen the schema
        async with server.pool.acquire() as conn:
            assert await ledger.count(conn) == 1
        assert "migrations-pending" in server.counts().rejected
    said = [r.getMessage() for r in caplog.records if r.name == "lading.schema"]
    # It listens while it waits: its log must not say it has not started.
    assert any(m.startswith("receiver listens and answers 503 migrations-pending: migrations pending: 0001")
               for m in said), said
    assert "receiver: migrations applied; serving" in said
    assert not any("does not start" in m for m in said)


def test_a_bookkeeping_table_name_must_be_a_plain_identifier() -> None:
    with pytest.raises(ValueError, match="lowercase"):
        migrating.MigrationSet(package="x", table="public.t; DROP TABLE t")
