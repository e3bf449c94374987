"""
Versioned SQL migrations: `migrations/NNNN_name.sql`, applied in order, each in its own
transaction, recorded in `schema_migrations` with a checksum.

Safe when several `lading migrate` runs start at once (a hook Job retried beside a manual run): the
whole run holds a session-level advisory lock, so the second process waits, then finds
nothing left to do. A database that holds a migration this code does not know, or one
whose file changed after it was applied, is refused rather than "fixed".

Lading's own migrations are the default `MigrationSet`. Another set (the webhook receiver's,
in the ERP's database) names its package, its bookkeeping table and its own lock key, so the
two never read each other's history.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.resources
import re

import asyncpg

from lading import errors

MIGRATION_LOCK_KEY = 0x1AD1_0001
"""Advisory lock key shared by every Lading process that migrates."""

_FILE_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
_TABLE_NAME = re.compile(r"^(?:([a-z_][a-z0-9_]*)\.)?[a-z_][a-z0-9_]*$")


@dataclasses.dataclass(frozen=True)
class MigrationSet:
    """Where a set of migrations lives and where its history is kept."""

    package: str = "lading.db"
    """The package whose `migrations/` folder holds the `NNNN_name.sql` files."""
    table: str = "schema_migrations"
    """The bookkeeping table, optionally `schema.table` (the schema is created when missing)."""
    lock_key: int = MIGRATION_LOCK_KEY
    """The advisory lock that serialises the processes migrating this set."""

    def __post_init__(self) -> None:
        if not _TABLE_NAME.match(self.table):
            raise ValueError(f"bookkeeping table must be a lowercase [schema.]name, got {self.table!r}")


LADING = MigrationSet()


@dataclasses.dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


@dataclasses.dataclass(frozen=True)
class MigrateResult:
    applied: tuple[int, ...]
    current: int


def available(source: MigrationSet = LADING) -> list[Migration]:
    """The migrations shipped with this code, in version order."""
    folder = importlib.resources.files(source.package) / "migrations"
    found: list[Migration] = []
    for entry in folder.iterdir():
        match = _FILE_NAME.match(entry.name)
        if match:
            found.append(Migration(int(match[1]), match[2], entry.read_text(encoding="utf-8")))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise errors.MigrationError(f"duplicate migration versions: {versions}")
    return found


async def migrate(conn: asyncpg.Connection, source: MigrationSet = LADING) -> MigrateResult:
    """Apply every missing migration; idempotent and safe to run concurrently."""
    migrations = available(source)
    # The table name is validated by MigrationSet; identifiers cannot be query parameters.
    table = source.table
    schema = table.rpartition(".")[0]
    await conn.execute("SELECT pg_advisory_lock($1)", source.lock_key)
    try:
        if schema:
            await conn.execute(f"CREATE SCHEMA IF NOT EXISTS {schema}")
        await conn.execute(
            f"""CREATE TABLE IF NOT EXISTS {table} (
                   version    integer PRIMARY KEY,
                   name       text NOT NULL,
                   checksum   text NOT NULL,
                   applied_at timestamptz NOT NULL DEFAULT clock_timestamp())"""
        )
        rows = await conn.fetch(f"SELECT version, name, checksum FROM {table} ORDER BY version")
        known = {m.version: m for m in migrations}
        for row in rows:
            mine = known.get(row["version"])
            if mine is None:
                raise errors.MigrationError(
                    f"database has migration {row['version']:04d}_{row['name']} that this code does not know; "
                    "run a newer Lading"
                )
            if mine.checksum != row["checksum"]:
                raise errors.MigrationError(
                    f"migration {mine.version:04d}_{mine.name} changed after it was applied (checksum differs)"
                )
        done = {row["version"] for row in rows}
        applied: list[int] = []
        for migration in migrations:
            if migration.version in done:
                continue
            async with conn.transaction():
                await conn.execute(migration.sql)
                await conn.execute(
                    f"INSERT INTO {table} (version, name, checksum) VALUES ($1, $2, $3)",
                    migration.version,
                    migration.name,
                    migration.checksum,
                )
            applied.append(migration.version)
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1)", source.lock_key)
    return MigrateResult(applied=tuple(applied), current=migrations[-1].version if migrations else 0)


async def pending(conn: asyncpg.Connection, source: MigrationSet = LADING) -> list[int]:
    """Versions not yet applied (readiness is false while this is non-empty)."""
    exists = await conn.fetchval("SELECT to_regclass($1) IS NOT NULL", source.table)
    done: set[int] = set()
    if exists:
        done = {r["version"] for r in await conn.fetch(f"SELECT version FROM {source.table}")}
    return [m.version for m in available(source) if m.version not in done]
