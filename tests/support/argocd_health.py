"""
The Argo CD health checks documented in docs/kubernetes.md, run as Argo CD runs them: each kind's
Lua script with the object as the global `obj`, returning `{status, message}`. Tests feed them the
objects the operator wrote, so the documentation cannot drift from the statuses it reads.
"""

from __future__ import annotations

import pathlib
import re
from typing import Any

import lupa  # type: ignore[import-untyped]  # no stubs published
import yaml

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "kubernetes.md"
PREFIX = "resource.customizations.health.lading.dev_"


def scripts() -> dict[str, str]:
    """Kind -> the Lua health check of that kind, from the doc's `argocd-cm` YAML block."""
    for block in re.findall(r"```yaml\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.DOTALL):
        if PREFIX in block:
            entries = yaml.safe_load(block)
            return {key.removeprefix(PREFIX): str(script) for key, script in entries.items()}
    raise AssertionError(f"no Argo CD health checks ({PREFIX}...) in {DOC}")


def health(kind: str, obj: dict[str, Any]) -> tuple[str, str]:
    """(status, message) that Argo CD's health check of `kind` gives `obj`."""
    lua = lupa.LuaRuntime(unpack_returned_tuples=True)
    lua.globals().obj = lua.table_from(obj, recursive=True)
    result = lua.execute(scripts()[kind])
    return str(result["status"]), str(result["message"] or "")
