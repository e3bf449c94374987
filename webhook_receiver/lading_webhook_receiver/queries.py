"""
The receiver's named SQL, loaded from `sql/*.sql` (the same `-- name:` convention as
`lading.db.queries`, kept apart because these tables live in the ERP's database, not Lading's).

Loading fails on a duplicate name; parameters always go through `$n` placeholders.
"""

from __future__ import annotations

import importlib.resources
import re

_HEADER = re.compile(r"^--\s*name:\s*([a-z0-9_]+)\s*$", re.MULTILINE)


def _load() -> dict[str, str]:
    queries: dict[str, str] = {}
    folder = importlib.resources.files(__package__ or "lading_webhook_receiver") / "sql"
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".sql"):
            continue
        parts = _HEADER.split(entry.read_text(encoding="utf-8"))
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
        raise KeyError(f"no SQL query named {name!r} in lading_webhook_receiver/sql") from None


ERP_INBOX_CLAIM = sql("erp_inbox_claim")
ERP_INBOX_GET = sql("erp_inbox_get")
ERP_INBOX_RECORD_ANSWER = sql("erp_inbox_record_answer")
ERP_INBOX_COUNT_BY_STATUS = sql("erp_inbox_count_by_status")
LEDGER_INVOICES_BOOK = sql("ledger_invoices_book")
LEDGER_INVOICES_GET_REFERENCE = sql("ledger_invoices_get_reference")
LEDGER_INVOICES_COUNT = sql("ledger_invoices_count")
