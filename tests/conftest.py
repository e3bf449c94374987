"""
Shared fixtures: one real PostgreSQL database per test run, migrated once, emptied
before each test that uses it.

Where the server comes from, in order: `$DATABASE_URL` (an admin URL: the run creates and
drops its own database there), the local server on 127.0.0.1:5432 (user postgres), or an
embedded server (`pgserver`) under `.lading/test-pg`. Each run uses a database named after
its process id and a random suffix, so concurrent runs never collide.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pathlib
import secrets
from collections.abc import AsyncIterator, Iterator

import asyncpg
import pytest

from lading.db import embedded, migrating, pool

LOCAL_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
KEPT_TABLES = ("schema_migrations",)
"""Tables the `db` fixture leaves alone; every other table in the schema is emptied before each test,
so a migration that adds a table needs no change here."""


async def _reachable(url: str) -> bool:
    try:
        conn = await asyncpg.connect(url, timeout=3)
    except (TimeoutError, OSError, asyncpg.PostgresError):
        return False
    await conn.close()
    return True


def _with_database(url: str, name: str) -> str:
    base, _, _ = url.rpartition("/")
    query = ""
    if "?" in url:
        query = "?" + url.split("?", 1)[1]
    return f"{base}/{name}{query}"


@pytest.fixture(scope="session")
def admin_url() -> Iterator[str]:
    explicit = os.environ.get("DATABASE_URL")
    if explicit:
        yield explicit
        return
    if asyncio.run(_reachable(LOCAL_ADMIN_URL)):
        yield LOCAL_ADMIN_URL
        return
    with embedded.running(pathlib.Path(".lading/test-pg").resolve(), delete_on_exit=True) as server:
        yield server.dsn


@pytest.fixture(scope="session")
def database_url(admin_url: str) -> Iterator[str]:
    """A fresh, migrated database for this test run; dropped at the end."""
    name = f"lading_test_{os.getpid()}_{secrets.token_hex(3)}"

    async def create() -> str:
        admin = await asyncpg.connect(admin_url)
        try:
            await admin.execute(f'CREATE DATABASE "{name}"')
        finally:
            await admin.close()
        url = _with_database(admin_url, name)
        conn = await pool.connect(url)
        try:
            await migrating.migrate(conn)
        finally:
            await conn.close()
        return url

    async def drop() -> None:
        admin = await asyncpg.connect(admin_url)
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await admin.close()

    url = asyncio.run(create())
    os.environ["LADING_TEST_DATABASE_URL"] = url
    try:
        yield url
    finally:
        asyncio.run(drop())


@pytest.fixture
async def db(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    """A connection to the run's database, with every data table emptied first."""
    conn = await pool.connect(database_url)
    tables = await conn.fetchval(
        "SELECT string_agg(quote_ident(tablename), ', ') FROM pg_tables "
        "WHERE schemaname = current_schema() AND tablename <> ALL($1::text[])",
        list(KEPT_TABLES),
    )
    if tables:
        await conn.execute(f"TRUNCATE {tables} RESTART IDENTITY CASCADE")
    try:
        yield conn
    finally:
        with contextlib.suppress(Exception):
            await conn.close()


@pytest.fixture(scope="session")
def amqp_url() -> str:
    """A reachable RabbitMQ (tests/support/broker.py): $AMQP_URL, the local broker, or one started here."""
    from tests.support import broker

    return broker.amqp_url()


@pytest.fixture
async def dbpool(db: asyncpg.Connection, database_url: str) -> AsyncIterator[asyncpg.Pool]:
    p = await pool.create_pool(database_url, min_size=1, max_size=20)
    try:
        yield p
    finally:
        await p.close()
