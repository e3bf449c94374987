"""Condition types and reasons of the operator are named once, in `lading_operator.conditions`
(the core's admission reasons in `lading.reasons`): no string literal stands for one anywhere else
in operator/, so a reason cannot be misspelt in one place or changed in only one of two."""

from __future__ import annotations

import ast
import pathlib

from lading_operator import conditions

from lading import reasons

ROOT = pathlib.Path(__file__).resolve().parents[3]
OPERATOR = ROOT / "operator" / "lading_operator"
DEFINED_IN = {OPERATOR / "conditions.py"}

CONDITION_CALLS = frozenset({"condition", "normal", "warning", "ready_only", "pending", "AdmissionRejected"})
"""Callees whose `type=` / `reason=` is a condition type, a condition reason or an Event reason."""

PHASES = frozenset({"Pending", "Running", "Suspended", "Completed", "Failed", "Terminating"})
"""ExtractionBatch phases: some share a word with a reason, and a phase is not a reason."""


def _constants() -> set[str]:
    values = {v for k, v in vars(conditions).items() if k.isupper() and isinstance(v, str)}
    return values | {v for k, v in vars(reasons).items() if k.isupper() and isinstance(v, str)}


KNOWN = _constants() - set(conditions.CONDITION_TYPES)
"""Known reasons (condition types are words like Ready that name printer columns too)."""


def _callee(node: ast.Call) -> str:
    func = node.func
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    return ""


def _docstrings(tree: ast.AST) -> set[int]:
    ids: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list):
            for stmt in body:
                if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
                    ids.add(id(stmt.value))
    return ids


def offenders(source: str, where: str) -> list[str]:
    """Every literal in `source` that stands for a condition type or reason, as `where:line: why`."""
    tree = ast.parse(source)
    found: list[str] = []
    skip = _docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _callee(node) in CONDITION_CALLS:
            for kw in node.keywords:
                if kw.arg not in ("type", "reason"):
                    continue
                for inner in ast.walk(kw.value):
                    if isinstance(inner, ast.JoinedStr) or (
                        isinstance(inner, ast.Constant) and isinstance(inner.value, str)
                    ):
                        found.append(f"{where}:{inner.lineno}: literal {kw.arg}= of {_callee(node)}()")
                        skip.update(id(c) for c in ast.walk(inner))
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(isinstance(s, ast.Attribute) and s.attr == "reason" for s in sides):
                for s in sides:
                    if isinstance(s, ast.Constant) and isinstance(s.value, str):
                        found.append(f"{where}:{s.lineno}: .reason compared with the literal {s.value!r}")
                        skip.add(id(s))
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip
            and node.value in KNOWN - PHASES
        ):
            found.append(f"{where}:{node.lineno}: the literal {node.value!r} is a known reason")
    return found


def test_no_condition_type_or_reason_literal_outside_the_constants() -> None:
    found: list[str] = []
    for path in sorted(OPERATOR.rglob("*.py")):
        if path in DEFINED_IN:
            continue
        found += offenders(path.read_text(), str(path.relative_to(ROOT)))
    assert not found, "use the constants of lading_operator.conditions:\n" + "\n".join(found)


def test_the_scan_catches_literals() -> None:
    assert offenders('conditions.condition(p, type="Ready", value=True, reason=conditions.APPLIED)', "a")
    assert offenders('conditions.condition(p, type=conditions.READY, value=True, reason="Appliedd")', "b")
    assert offenders('events.warning(body, reason=f"Circuit{x}", message="")', "c")
    assert offenders('events.normal(body, reason=A if x else "Resumed", message="")', "d")
    assert offenders('if exc.reason == "QuotaExceeded": pass', "e")
    assert offenders('not_ready = "ScaledToZero" if x else conditions.ENGINE_STARTING', "f")
    assert not offenders('"""Ready=False, reason ScaledToZero."""\nphase = "Completed"', "g")
    assert not offenders('conditions.condition(p, type=conditions.READY, value=True, reason=conditions.APPLIED)', "h")


def test_every_constant_is_documented() -> None:
    source = (OPERATOR / "conditions.py").read_text()
    tree = ast.parse(source)
    body = tree.body
    undocumented = []
    for i, stmt in enumerate(body):
        if isinstance(stmt, ast.AnnAssign | ast.Assign):
            target = stmt.target if isinstance(stmt, ast.AnnAssign) else stmt.targets[0]
            name = target.id if isinstance(target, ast.Name) else ""
            if not name.isupper():
                continue
            value = stmt.value
            reexported = isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name) \
                and value.value.id == "reasons"
            nxt = body[i + 1] if i + 1 < len(body) else None
            documented = isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
            if not (documented or reexported):
                undocumented.append(name)
    assert not undocumented, f"constants without a docstring: {undocumented}"
    for name, value in vars(reasons).items():
        if name.isupper() and isinstance(value, str):
            assert getattr(conditions, name) == value, f"conditions.{name} re-exports lading.reasons.{name}"


def test_docs_name_every_type_and_reason() -> None:
    docs = (ROOT / "docs" / "operator.md").read_text()
    unwritten = {reasons.MANIFEST_UNAVAILABLE}  # a TemporaryError, retried: no condition is written for it
    values = {v for k, v in vars(conditions).items() if k.isupper() and isinstance(v, str)} - unwritten
    missing = sorted(v for v in values if f"`{v}`" not in docs)
    assert not missing, f"docs/operator.md does not name: {missing}"
