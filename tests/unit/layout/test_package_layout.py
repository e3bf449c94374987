"""The repository layout never shadows the standard library, and the core stands alone."""

from __future__ import annotations

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[3]


def test_import_operator_from_the_repo_root_is_the_standard_library() -> None:
    # Run from the repo root, where a folder named `operator` exists, without PYTHONSAFEPATH.
    out = subprocess.run(
        [sys.executable, "-c", "import operator, sys; print(operator.__file__); print(operator.itemgetter)"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": "/usr/bin:/bin"},
    )
    first_line = out.stdout.splitlines()[0]
    assert "operator.py" in first_line
    assert not first_line.startswith(str(ROOT / "operator"))


def test_component_folders_are_source_roots_holding_one_package() -> None:
    for folder, package in [
        ("operator", "lading_operator"),
        ("worker", "lading_worker"),
        ("webhook_receiver", "lading_webhook_receiver"),
        ("cli", "lading_cli"),
    ]:
        assert (ROOT / folder / package / "__init__.py").is_file()
        assert not (ROOT / folder / "__init__.py").exists(), f"{folder}/ must not itself be a package"


def test_the_core_imports_without_any_component() -> None:
    code = (
        "import sys, importlib, pkgutil, lading\n"
        "for m in pkgutil.walk_packages(lading.__path__, 'lading.'):\n"
        "    importlib.import_module(m.name)\n"
        "bad = [n for n in sys.modules if n.split('.')[0] in "
        "('lading_elected', 'lading_worker', 'lading_operator', 'lading_webhook_receiver', 'lading_cli')]\n"
        "print(bad)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})
    assert out.stdout.strip() == "[]"
