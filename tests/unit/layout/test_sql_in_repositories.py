"""
SQL runs only in repositories: `lading/db/` for Lading's database, and the webhook receiver's two
repository modules for the ERP's tables. Everything else calls a repository function.

The check reads the source (AST), so it covers modules that are never imported by a test: any call
of a statement-running method (`fetch`, `execute`, `copy_records_to_table`, ...) outside those
places fails it, whatever the object it is called on.
"""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[3]

COMPONENTS = ("lading", "lading_elected", "worker", "operator", "cli", "webhook_receiver")
"""The product's source roots (tests and hack/ seed databases by hand, on purpose)."""

RUNS_SQL = frozenset({
    "fetch", "fetchrow", "fetchval", "execute", "executemany", "cursor",
    "copy_records_to_table", "copy_to_table", "copy_from_table", "copy_from_query",
})  # fmt: skip
"""asyncpg's methods that send a statement, on a connection or a pool."""

PREPARES_SQL = "prepare"
"""`Connection.prepare(query)`; other objects have a `prepare` too (a receiver adapter prepares an
event), so it counts only when its argument looks like SQL."""

REPOSITORIES = ("lading/db/",)
RECEIVER_REPOSITORIES = (
    "webhook_receiver/lading_webhook_receiver/inbox.py",  # erp_inbox: the receiver's idempotency ledger
    "webhook_receiver/lading_webhook_receiver/ledger.py",  # ledger_invoices: what the ERP booked
)
"""The receiver's tables live in the ERP's database, not Lading's: it keeps its own repositories
(and its own sql/ files, read by the core's loader)."""


def _looks_like_sql(node: ast.expr) -> bool:
    if isinstance(node, ast.Constant | ast.JoinedStr):
        return isinstance(node, ast.JoinedStr) or isinstance(node.value, str)
    return any(isinstance(n, ast.Name | ast.Attribute) and "quer" in ast.unparse(n).lower() for n in ast.walk(node))


def sql_calls(source: str) -> list[tuple[int, str]]:
    """(line, call) of every statement-running call in `source`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        method = node.func.attr
        receiver = node.func.value
        if isinstance(receiver, ast.Call) and isinstance(receiver.func, ast.Name) and receiver.func.id == "super":
            continue  # a base class's method of that name (e.g. kopf's DiffBaseStorage.fetch), not a database's
        if method in RUNS_SQL or (method == PREPARES_SQL and node.args and _looks_like_sql(node.args[0])):
            found.append((node.lineno, ast.unparse(node)[:120]))
    return found


def test_no_module_outside_the_repositories_runs_sql() -> None:
    offenders = []
    for component in COMPONENTS:
        for path in sorted((ROOT / component).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith(REPOSITORIES) or rel in RECEIVER_REPOSITORIES or "/.venv/" in rel:
                continue
            offenders += [f"{rel}:{line}: {call}" for line, call in sql_calls(path.read_text(encoding="utf-8"))]
    assert offenders == [], "SQL outside lading/db (call a repository function):\n" + "\n".join(offenders)


def test_the_receivers_repositories_exist() -> None:
    # An allow-list entry that names no file would hide nothing and say something false.
    for rel in RECEIVER_REPOSITORIES:
        assert (ROOT / rel).is_file(), rel
        assert sql_calls((ROOT / rel).read_text(encoding="utf-8")), f"{rel} runs no SQL: drop it from the list"


def test_the_scan_sees_every_way_a_statement_is_sent() -> None:
    source = """
async def f(conn, pool, db, rows, adapter, event):
    await conn.fetch("SELECT 1")
    await pool.fetchval(queries.sql("x"), 1)
    await self._conn.execute(f"SELECT {1}")
    await db.executemany(text, rows)
    await conn.copy_records_to_table("t", records=rows)
    await conn.copy_to_table("t", source="f.csv")
    async for r in conn.cursor("SELECT 1"):
        pass
    statement = await conn.prepare("SELECT 1")
    adapter.prepare(event)
"""
    assert sorted(line for line, _ in sql_calls(source)) == [3, 4, 5, 6, 7, 8, 9, 11]
