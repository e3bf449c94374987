"""
Repository of the database catalog (`sql/catalog.sql`): which tables exist, and how large each is.

The delivery tables belong to the dispatcher's schema; the operator reads them only once
`has_table` says they exist, so it works against any schema version it supports.
"""

from __future__ import annotations

import dataclasses

import asyncpg

from lading.db import queries


async def has_table(conn: asyncpg.Connection | asyncpg.Pool, *, name: str) -> bool:
    return bool(await conn.fetchval(queries.sql("catalog_table_exists"), name))


@dataclasses.dataclass(frozen=True)
class TableSize:
    """One table's size for `lading status`: estimated rows (no scan) and bytes on disk with indexes."""

    name: str
    rows_estimate: int
    bytes: int


async def table_sizes(conn: asyncpg.Connection) -> list[TableSize]:
    """Every table of the schema, largest first (what the cleaner keeps in check)."""
    rows = await conn.fetch(queries.sql("catalog_table_sizes_report"))
    return [TableSize(name=r["name"], rows_estimate=int(r["rows_estimate"]), bytes=int(r["bytes"])) for r in rows]
