"""`provider: builtin` is demo code: the core loads it by name only when a pool asks for it."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

from lading.db import registry
from lading.ids import PoolName
from lading.providers import factory
from lading_demo import builtin

ROOT = pathlib.Path(__file__).resolve().parents[3]


def _builtin_pool() -> registry.Pool:
    return registry.Pool(
        name=PoolName("lading-system/demo"), provider="builtin", model=None, spec={"builtin": {"latencyMs": 7}},
        paused=False,
    )  # fmt: skip


def test_a_builtin_pool_gets_the_demo_extractor_with_its_latency() -> None:
    provider = factory.for_pool(_builtin_pool())
    assert isinstance(provider, builtin.BuiltinProvider)
    assert provider.latency_s == pytest.approx(0.007)


def test_without_the_demo_package_a_builtin_pool_is_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "lading_demo", None)  # import lading_demo -> ModuleNotFoundError
    monkeypatch.delitem(sys.modules, factory.DEMO_EXTRACTOR)
    with pytest.raises(factory.UnsupportedProvider, match=r"pool lading-system/demo: provider 'builtin' is demo code"):
        factory.for_pool(_builtin_pool())


def test_the_core_imports_without_the_demo_package() -> None:
    code = (
        "import sys, importlib, pkgutil, lading\n"
        "for m in pkgutil.walk_packages(lading.__path__, 'lading.'):\n"
        "    importlib.import_module(m.name)\n"
        "print([n for n in sys.modules if n.split('.')[0] == 'lading_demo'])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})  # fmt: skip
    assert out.stdout.strip() == "[]"
