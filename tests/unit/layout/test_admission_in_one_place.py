"""
A batch's idempotency key is written in one function (`lading.accepting.idempotency_key`), and the
quota rules are enforced in one module (`lading.applying`): nothing else rebuilds or re-decides them.
"""

from __future__ import annotations

import ast
import pathlib

from lading import accepting
from tests.support import factories

ROOT = pathlib.Path(__file__).resolve().parents[3]
COMPONENTS = ("lading", "worker", "operator", "cli", "webhook_receiver")


def _key_builders(source: str) -> list[int]:
    """Lines of f-strings shaped like `{namespace}/{name}/{uid}`: three fields, the last a uid."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.JoinedStr):
            continue
        fields = [v for v in node.values if isinstance(v, ast.FormattedValue)]
        slashes = [v for v in node.values if isinstance(v, ast.Constant) and v.value == "/"]
        if len(fields) == 3 and len(slashes) == 2 and "uid" in ast.unparse(fields[2]):
            found.append(node.lineno)
    return found


def test_the_idempotency_key_is_built_in_one_function() -> None:
    builders = []
    for component in COMPONENTS:
        for path in sorted((ROOT / component).rglob("*.py")):
            builders += [f"{path.relative_to(ROOT).as_posix()}:{line}" for line in _key_builders(path.read_text())]
    [only] = builders
    assert only.startswith("lading/accepting.py:")
    assert _key_builders('key = f"{ns}/{name}/{meta.uid}"') == [1]  # the scan sees a rebuilt one


def test_the_key_is_the_resource_identity_and_acceptance_uses_it() -> None:
    assert accepting.idempotency_key(namespace="acme", name="b1", uid="u-1") == "acme/b1/u-1"
    request = factories.batch_request(name="b1")
    assert request.idempotency_key == accepting.idempotency_key(
        namespace=request.namespace, name=request.name, uid=request.uid
    )


def test_only_admission_refuses_for_a_quota_reason() -> None:
    # The operator maps the answer of one admit call to status; it never decides a quota itself.
    deciders = []
    for component in COMPONENTS:
        for path in sorted((ROOT / component).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("AdmissionRejected"):
                    deciders.append(rel)
    assert set(deciders) == {"lading/applying.py"}
