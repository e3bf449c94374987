"""Migrations: idempotent, safe when several processes run them at once, and honest."""

from __future__ import annotations

import asyncio
import secrets

import asyncpg
import pytest

from lading import errors
from lading.db import migrating, pool


@pytest.fixture
async def empty_database(admin_url: str) -> object:
    name = f"lading_mig_{secrets.token_hex(4)}"
    admin = await asyncpg.connect(admin_url)
    await admin.execute(f'CREATE DATABASE "{name}"')
    base = admin_url.rsplit("/", 1)[0]
    try:
        yield f"{base}/{name}"
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


async def test_concurrent_migrations_apply_each_version_once(empty_database: str) -> None:
    conns = [await pool.connect(empty_database) for _ in range(4)]
    try:
        results = await asyncio.gather(*(migrating.migrate(c) for c in conns))
    finally:
        for c in conns:
            await c.close()
    applied = [v for r in results for v in r.applied]
    assert sorted(applied) == [m.version for m in migrating.available()]
    again = await pool.connect(empty_database)
    try:
        assert (await migrating.migrate(again)).applied == ()
        assert await migrating.pending(again) == []
    finally:
        await again.close()


async def test_a_database_ahead_of_the_code_is_refused(empty_database: str) -> None:
    conn = await pool.connect(empty_database)
    try:
        await migrating.migrate(conn)
        await conn.execute("INSERT INTO schema_migrations (version, name, checksum) VALUES (9999, 'future', 'x')")
        with pytest.raises(errors.MigrationError, match="9999_future"):
            await migrating.migrate(conn)
    finally:
        await conn.close()


async def test_a_changed_migration_file_is_refused(empty_database: str) -> None:
    conn = await pool.connect(empty_database)
    try:
        await migrating.migrate(conn)
        await conn.execute("UPDATE schema_migrations SET checksum = 'tampered' WHERE version = 1")
        with pytest.raises(errors.MigrationError, match="changed after it was applied"):
            await migrating.migrate(conn)
    finally:
        await conn.close()
