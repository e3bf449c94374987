"""
One /metrics for several processes (`lading worker --processes N`): what real processes write in
Prometheus multiprocess mode adds up with the serving process's own metrics, one family per
name; a process marked dead leaves the live gauges and stays in the counters.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys

import prometheus_client
from prometheus_client import multiprocess
from prometheus_client import parser as prom_parser

from lading import metrics
from tests.support import processes

WRITER = """
import sys
from lading import metrics
metrics.JOBS_CLAIMED.labels("ns/pool").inc(int(sys.argv[1]))
metrics.IN_FLIGHT.labels("ns/pool").set(int(sys.argv[2]))
metrics.REVIEW_QUEUE_SIZE.set(0)
print(__import__("os").getpid())
"""


def _write(directory: pathlib.Path, claimed: int, in_flight: int) -> int:
    env = processes.environment(PROMETHEUS_MULTIPROC_DIR=str(directory))
    done = subprocess.run([sys.executable, "-c", WRITER, str(claimed), str(in_flight)], env=env,
                          capture_output=True, text=True, check=True, timeout=60)  # fmt: skip
    return int(done.stdout.strip())


def _samples(registry: prometheus_client.CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = prometheus_client.generate_latest(registry).decode()
    families = list(prom_parser.text_string_to_metric_families(text))
    names = [family.name for family in families]
    assert len(names) == len(set(names)), "one family per name"
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for family in families for s in family.samples}


def test_processes_add_up_with_the_serving_process(tmp_path: pathlib.Path) -> None:
    first = _write(tmp_path, claimed=3, in_flight=2)
    _write(tmp_path, claimed=4, in_flight=5)
    before = metrics.REGISTRY.get_sample_value("lading_jobs_claimed_total", {"pool": "ns/pool"}) or 0.0
    metrics.JOBS_CLAIMED.labels("ns/pool").inc(10)  # the serving process's own, in memory
    samples = _samples(metrics.combined_registry(str(tmp_path)))
    claimed = ("lading_jobs_claimed_total", (("pool", "ns/pool"),))
    in_flight = ("lading_attempts_in_flight", (("pool", "ns/pool"),))
    assert samples[claimed] == before + 10 + 3 + 4
    assert samples[in_flight] == 7, "livesum: the attempts of every process"
    assert not any(dict(labels).get("pid") for _, labels in samples), "no series per process"

    multiprocess.mark_process_dead(first, str(tmp_path))  # type: ignore[no-untyped-call]
    samples = _samples(metrics.combined_registry(str(tmp_path)))
    assert samples[in_flight] == 5, "a dead process holds no attempts"
    assert samples[claimed] == before + 10 + 3 + 4, "what it counted stays counted"
