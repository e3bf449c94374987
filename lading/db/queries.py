"""
Named SQL queries loaded from `sql/*.sql`.

Each file holds the queries of one table; each query starts with a `-- name: <name>`
line (names are `<table>_<verb>[_<qualifier>]`). Loading fails on a duplicate name, so
two repositories can never silently disagree about what a query means. SQL is never
built with f-strings: parameters go through `$n` placeholders.
"""

from __future__ import annotations

import importlib.resources
import re

_HEADER = re.compile(r"^--\s*name:\s*([a-z0-9_]+)\s*$", re.MULTILINE)


def _load() -> dict[str, str]:
    queries: dict[str, str] = {}
    folder = importlib.resources.files("lading.db") / "sql"
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".sql"):
            continue
        text = entry.read_text(encoding="utf-8")
        parts = _HEADER.split(text)
        # parts = [preamble, name1, body1, name2, body2, ...]
        for name, body in zip(parts[1::2], parts[2::2], strict=True):
            if name in queries:
                raise RuntimeError(f"duplicate query name {name!r} in {entry.name}")
            queries[name] = body.strip().rstrip(";")
    return queries


_QUERIES = _load()


def sql(name: str) -> str:
    """The text of the named query; a KeyError names the missing query."""
    try:
        return _QUERIES[name]
    except KeyError:
        raise KeyError(f"no SQL query named {name!r} in lading/db/sql") from None


def names() -> frozenset[str]:
    return frozenset(_QUERIES)
