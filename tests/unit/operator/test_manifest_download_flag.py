"""`lading operator --max-concurrent-manifests`: how many document manifests the operator reads at once."""

from __future__ import annotations

import pytest
from lading_cli import main as cli
from lading_cli import operator as operator_cli
from lading_operator import runtime, settings


def test_the_flag_reaches_the_settings_and_the_runtime() -> None:
    args = cli.build_parser().parse_args(
        ["operator", "--database-url", "postgresql://x/y", "--max-concurrent-manifests", "3"]
    )
    config = operator_cli.settings_from(args)
    assert config.max_concurrent_manifests == 3
    rt = runtime.Runtime(settings=config, db=None, api=None, cluster=None)  # type: ignore[arg-type]
    assert rt.manifest_downloads._value == 3


def test_the_default_is_small() -> None:
    args = cli.build_parser().parse_args(["operator", "--database-url", "postgresql://x/y"])
    assert operator_cli.settings_from(args).max_concurrent_manifests == settings.MAX_CONCURRENT_MANIFESTS_DEFAULT == 4


@pytest.mark.parametrize("value", ["0", "-1", "two"])
def test_a_bad_value_is_named(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["operator", "--max-concurrent-manifests", value])
    assert f"must be a whole number of at least 1, got {value!r}" in capsys.readouterr().err
