"""
What the reading and deciding commands (`jobs`, `status`, `review`) share: argument types,
the database connection they use, and how they print times, ages and tables.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import asyncpg
import rich.console
import rich.text

from lading import ids
from lading.db import pool as dbpool

SERVER_SETTINGS = {"application_name": "lading-cli", "jit": "off"}
"""JIT off: it made the reporting queries an order of magnitude slower on large tables."""
PIPE_WIDTH = 240
"""Width of tables written to a pipe or a file, so each row stays on one line (for grep)."""
BIGINT_MAX = 2**63 - 1

T = TypeVar("T")


def add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--database-url", default=os.environ.get("DATABASE_URL"), help="default: $DATABASE_URL")
    parser.add_argument("--json", action="store_true", help="print JSON on stdout instead of tables")


def add_paging(parser: argparse.ArgumentParser, *, default: int, maximum: int) -> None:
    """`--limit` and `--after`: keyset paging by job id."""
    parser.add_argument(
        "--limit", type=limit(maximum), default=default, help=f"jobs per page (default {default}, at most {maximum})"
    )
    parser.add_argument(
        "--after", type=job_id, metavar="ID", help="start after this job id (printed at the end of the previous page)"
    )


def job_id(value: str) -> ids.JobId:
    """argparse type: a job id, with a clear error for anything else."""
    try:
        number = int(value)
    except ValueError:
        number = -1
    if not 0 <= number <= BIGINT_MAX:
        raise argparse.ArgumentTypeError(f"invalid job id {value!r}; expected a non-negative integer")
    return ids.JobId(number)


def limit(maximum: int) -> Callable[[str], int]:
    """argparse type: a page size from 1 to `maximum`."""

    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            number = 0
        if not 1 <= number <= maximum:
            raise argparse.ArgumentTypeError(f"invalid limit {value!r}; expected 1 to {maximum}")
        return number

    return parse


async def connected(dsn: str, run: Callable[[asyncpg.Connection], Awaitable[T]]) -> T:
    """Run `run(conn)` on a fresh connection with the CLI's settings and codecs."""
    conn = await asyncpg.connect(dsn, server_settings=SERVER_SETTINGS)
    try:
        await dbpool.init_connection(conn)
        return await run(conn)
    finally:
        await conn.close()


def rfc3339(value: dt.datetime | None) -> str | None:
    return None if value is None else value.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")


def print_json(document: dict[str, Any]) -> None:
    print(json.dumps(document, indent=2, ensure_ascii=False))


def console() -> rich.console.Console:
    # No markup, emoji or highlighting: text from the database is shown exactly as stored. Into a
    # pipe or a file, rows stay on one line (for grep) unless $COLUMNS says otherwise.
    wide = not sys.stdout.isatty() and "COLUMNS" not in os.environ
    return rich.console.Console(markup=False, emoji=False, highlight=False, width=PIPE_WIDTH if wide else None)


def text(value: object, style: str = "") -> rich.text.Text:
    return rich.text.Text("-" if value is None else str(value), style=style)


def age(seconds: float | None) -> str:
    """A duration as people read it at a glance: `42s`, `5m 3s`, `2h 5m`, `3d 4h`."""
    if seconds is None:
        return "-"
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60}s"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60}m"
    return f"{s // 86400}d {s % 86400 // 3600}h"
