"""
The fault suite's short profile (hack/reliability.py --profile short) on a fixed seed: real
`lading worker` x3, relay, operator on the Kubernetes emulator, receiver, stub model, PostgreSQL
owned by the run and RabbitMQ, with every kind of fault drawn at random; every must-be-zero figure
of the checker is zero, and the faults really happened.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

from hack.reliability import checker
from tests.support import processes

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

SEED = 20260
SCRIPT = processes.ROOT / "hack" / "reliability.py"


def test_the_short_profile_loses_nothing_duplicates_nothing_and_applies_no_stale_write(tmp_path: pathlib.Path) -> None:
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "--profile", "short", "--seed", str(SEED), "--output", str(tmp_path)],
        env=processes.environment(), capture_output=True, text=True, timeout=280, check=False,
    )  # fmt: skip
    assert run.returncode in (0, 1), run.stderr[-4000:]
    [row] = json.loads((tmp_path / "figures.json").read_text())
    figures = row["figures"]
    assert checker.violations(figures) == {}, (figures, row["notes"], run.stderr[-3000:])
    assert run.returncode == 0
    # The run did what it says: faults were injected and processes killed while the work went on ...
    assert figures["kills"] >= 3 and figures["faults"] >= 3
    # ... and the documents went all the way: extracted, delivered, booked once by the ERP.
    assert figures["jobs"] == figures["documents"] > 0 and figures["succeeded"] > 0
    assert figures["delivered"] + figures["info"] == figures["succeeded"]
