"""
Named SQL queries loaded from `sql/*.sql`.

Each file holds the queries of one table; each query starts with a `-- name: <name>`
line (names are `<table>_<verb>[_<qualifier>]`). Loading fails on a duplicate name, so
two repositories can never silently disagree about what a query means. SQL is never
built with f-strings: parameters go through `$n` placeholders.

A condition several queries must agree on is written once, as a fragment: a `-- fragment: <name>`
section, included by a query as `{{name}}` and substituted when the files are loaded (so every
query is still one fixed text, and its plan is that of the text written out). The one fragment
today is `job_eligible` (jobs.sql), what a claim could take now; the claim, the gauges, the
scaler, KEDA's trigger and the reports all use it. Loading fails on an unknown or unused fragment.

Queries whose names end in `_report` are read-only reads for people (`lading status`, `lading
jobs`): ages there are measured against now(), the start of the caller's transaction, so figures
read in one snapshot agree with each other.

`Loader` reads another package's `sql/` folder the same way (the webhook receiver's, whose
tables live in the ERP's database, not Lading's).
"""

from __future__ import annotations

import importlib.resources
import re

_HEADER = re.compile(r"^--\s*(name|fragment):\s*([a-z0-9_]+)\s*$", re.MULTILINE)
_INCLUDE = re.compile(r"\{\{([a-z0-9_]+)\}\}")


class Loader:
    """The named queries of one package's `sql/*.sql` files, read once."""

    def __init__(self, package: str, *, folder: str = "sql") -> None:
        self.package = package
        self.folder = folder
        self._queries, self.fragments = _load(package, folder)
        self._where = f"{package.replace('.', '/')}/{folder}"

    def sql(self, name: str) -> str:
        """The text of the named query; a KeyError names the missing query."""
        try:
            return self._queries[name]
        except KeyError:
            raise KeyError(f"no SQL query named {name!r} in {self._where}") from None

    def fragment(self, name: str) -> str:
        """The text of the named fragment; a KeyError names the missing fragment."""
        try:
            return self.fragments[name]
        except KeyError:
            raise KeyError(f"no SQL fragment named {name!r} in {self._where}") from None

    def names(self) -> frozenset[str]:
        return frozenset(self._queries)


def _load(package: str, folder: str) -> tuple[dict[str, str], dict[str, str]]:
    queries: dict[str, str] = {}
    fragments: dict[str, str] = {}
    where: dict[str, str] = {}
    root = importlib.resources.files(package) / folder
    for entry in sorted(root.iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".sql"):
            continue
        parts = _HEADER.split(entry.read_text(encoding="utf-8"))
        # parts = [preamble, kind1, name1, body1, kind2, name2, body2, ...]
        for kind, name, body in zip(parts[1::3], parts[2::3], parts[3::3], strict=True):
            if name in where:
                raise RuntimeError(f"duplicate query name {name!r} in {entry.name} (also in {where[name]})")
            where[name] = entry.name
            text = body.strip().rstrip(";")
            if kind == "fragment":
                fragments[name] = f"({_without_comments(text)})"
            else:
                queries[name] = text
    used: set[str] = set()

    def include(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in fragments:
            raise RuntimeError(f"unknown SQL fragment {{{{{name}}}}} in {package}/{folder}")
        used.add(name)
        return fragments[name]

    queries = {name: _INCLUDE.sub(include, text) for name, text in queries.items()}
    if unused := set(fragments) - used:
        raise RuntimeError(f"SQL fragments used by no query in {package}/{folder}: {sorted(unused)}")
    return queries, fragments


def _without_comments(text: str) -> str:
    """A fragment's condition without its leading `--` comment lines, on one line of its own."""
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("--")]
    return " ".join(line.strip() for line in lines if line.strip())


LADING = Loader("lading.db")
"""Lading's own queries (`lading/db/sql`)."""


def sql(name: str) -> str:
    """The text of the named query; a KeyError names the missing query."""
    return LADING.sql(name)


def fragment(name: str) -> str:
    """The text of the named fragment (a condition written against alias `j`, for instance)."""
    return LADING.fragment(name)


def names() -> frozenset[str]:
    return LADING.names()
