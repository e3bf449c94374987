"""
`lading COMMAND` loads the code of that command alone: `lading jobs list` or `lading tokens create`
start without importing kopf, the Kubernetes client or the HTTP intake (seconds of imports), and
each command's parser is the same whether it is built alone or with all the others.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from lading_cli import main as cli

HEAVY = ("kopf", "kubernetes_asyncio", "lading_operator.app", "lading_api.serving", "lading_worker.running")


def _loaded_by(argv: list[str]) -> dict[str, bool]:
    """Which of HEAVY a fresh interpreter has imported once `lading ARGV` has parsed its arguments."""
    script = (
        "import json, sys\n"
        "from lading_cli import main\n"
        f"main.build_parser(only=main._command_of({argv!r})).parse_args({argv!r})\n"
        f"print(json.dumps({{name: name in sys.modules for name in {HEAVY!r}}}))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60)
    loaded: dict[str, bool] = json.loads(done.stdout)
    return loaded


@pytest.mark.parametrize("argv", [["jobs", "list"], ["tokens", "list"], ["status"], ["migrate"]])
def test_a_command_does_not_load_the_operator_or_the_intake(argv: list[str]) -> None:
    assert _loaded_by(argv) == dict.fromkeys(HEAVY, False)


def test_the_operator_command_loads_its_code() -> None:
    loaded = _loaded_by(["operator", "--database-url", "postgresql://x/y"])
    assert loaded["kopf"] and loaded["lading_operator.app"]


@pytest.mark.parametrize("argv", [
    ["jobs", "list", "--state", "READY", "--limit", "5"],
    ["api", "--port", "9000", "--pool-size", "3"],
    ["operator", "--database-url", "postgresql://x/y", "--pool-namespaces", "a,b"],
    ["worker", "--pool", "acme/cheap", "--database-url", "postgresql://x/y"],
    ["migrate", "--receiver"],
])  # fmt: skip
def test_a_command_parses_alike_alone_and_among_all(argv: list[str]) -> None:
    alone = vars(cli.build_parser(only=cli._command_of(argv)).parse_args(argv))
    among_all = vars(cli.build_parser().parse_args(argv))
    assert alone == among_all


def test_the_command_is_the_first_word_that_names_one() -> None:
    assert cli._command_of(["--log-level", "DEBUG", "jobs", "show", "1"]) == "jobs"
    assert cli._command_of(["--help"]) == ""
