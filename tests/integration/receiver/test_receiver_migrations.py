"""The receiver's migrations: its own history table, its own lock, beside Lading's or alone."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator

import asyncpg
import pytest
from lading_webhook_receiver import app, serving

from lading.db import migrating


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


def test_a_bookkeeping_table_name_must_be_a_plain_identifier() -> None:
    with pytest.raises(ValueError, match="lowercase"):
        migrating.MigrationSet(package="x", table="public.t; DROP TABLE t")
