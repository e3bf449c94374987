"""Named SQL queries: every name is unique and every repository call names a real query."""

from __future__ import annotations

import pathlib
import re

import pytest

from lading.db import queries

ROOT = pathlib.Path(__file__).resolve().parents[3]


def test_every_query_used_in_code_exists() -> None:
    used: set[str] = set()
    for path in (ROOT / "lading").rglob("*.py"):
        used |= set(re.findall(r'queries\.sql\("([a-z0-9_]+)"\)', path.read_text()))
    assert used, "the repositories use named queries"
    assert used <= queries.names()


def test_query_names_follow_table_verb_naming() -> None:
    for name in queries.names():
        assert re.fullmatch(r"[a-z]+_[a-z0-9_]+", name), name


def test_an_unknown_query_name_is_a_clear_error() -> None:
    with pytest.raises(KeyError, match="no SQL query named 'job_frobnicate'"):
        queries.sql("job_frobnicate")
