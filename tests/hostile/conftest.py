"""
The hostile-input suite's shared pieces: the terminal summary of what was tried (tally.py), and
the operator fixtures (the Kubernetes emulator, a kubeconfig, an API client, the real operator in
a thread) taken from the operator integration tests rather than written twice.

Hypothesis runs every example of a test on the same function-scoped fixtures, so a worker, a
consumer or a receiver started by a fixture keeps running across examples: each example adds its
input and waits for it, and a pipeline that one example wedges fails the next one too.
"""

from __future__ import annotations

import pytest

from tests.hostile import tally
from tests.integration.operator.conftest import (  # noqa: F401 (fixtures)
    api,
    emulator,
    kubeconfig,
    operator,
    operator_factory,
)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if tally.TRIED or tally.WEDGED:
        terminalreporter.section("hostile inputs")
        for line in tally.summary():
            terminalreporter.write_line(line)
