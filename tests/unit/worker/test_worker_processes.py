"""
`lading worker --processes N`: how many processes, what each is given, and the supervisor's
restarts and stops (with stand-in processes: `python -c ...`, real signals, no database).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pathlib
import signal
import sys
from collections.abc import Awaitable, Callable

import pytest
from lading_worker import main, supervising

from tests.support import waiting


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    main.add_arguments(parser)
    return parser.parse_args(["--pool", "lading-system/builtin", *argv])


@pytest.mark.parametrize(
    ("text", "cpus"),
    [("max 100000", None), ("200000 100000", 2), ("150000 100000", 1), ("50000 100000", 1), ("", None),
     ("400000 100000\n", 4), ("garbage 1", None)],
)  # fmt: skip
def test_the_cgroup_quota_counts_whole_cpus(text: str, cpus: int | None) -> None:
    assert supervising.cgroup_cpus(text) == cpus


def test_the_default_is_the_cpus_available_bounded_by_the_quota(tmp_path: pathlib.Path) -> None:
    affinity = len(os.sched_getaffinity(0))
    assert supervising.available_cpus(cpu_max=tmp_path / "absent") == affinity
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert supervising.available_cpus(cpu_max=tmp_path / "cpu.max") == affinity
    (tmp_path / "cpu.max").write_text("100000 100000\n")
    assert supervising.available_cpus(cpu_max=tmp_path / "cpu.max") == 1


def test_totals_are_split_evenly_the_larger_shares_first() -> None:
    assert supervising.shares(10, 3) == [4, 3, 3]
    assert supervising.shares(64, 2) == [32, 32]
    assert supervising.shares(0, 2) == [0, 0]


def test_processes_never_outnumber_the_attempts() -> None:
    assert main.process_count(_parse("--processes", "4", "--concurrency", "2")) == 2
    assert main.process_count(_parse("--processes", "3")) == 3
    assert main.process_count(_parse("--concurrency", "1")) == 1


def test_processes_must_be_at_least_one() -> None:
    with pytest.raises(SystemExit):
        _parse("--processes", "0")


def test_each_worker_process_gets_the_flags_with_the_totals_split_and_no_urls() -> None:
    args = _parse(
        "--database-url", "postgresql://user:secret@db/lading", "--amqp-url", "amqp://user:secret@mq/",
        "--processes", "2", "--concurrency", "5", "--prefetch", "3", "--delivery-concurrency", "1",
        "--claim-batch", "20", "--lease-ttl", "2.5", "--document-root", "/a", "--document-root", "/b",
        "--http", "0.0.0.0:8080", "--retain-inbox-hours", "48",
    )  # fmt: skip
    first, second = main.child_commands(args, 2, supervisor_pid=4242)
    assert first[: len(supervising.CHILD_COMMAND)] == list(supervising.CHILD_COMMAND)
    for command in (first, second):
        assert "secret" not in " ".join(command) and "--http" not in command
        parsed = _parse(*command[len(supervising.CHILD_COMMAND) :][2:])
        assert parsed.processes == 1 and parsed.supervised_by == 4242
        assert (parsed.claim_batch, parsed.lease_ttl, parsed.retain_inbox_hours) == (20, 2.5, 48)
        assert parsed.document_roots == ["/a", "/b"]
    one, two = (_parse(*c[len(supervising.CHILD_COMMAND) + 2 :]) for c in (first, second))
    assert (one.concurrency, one.prefetch, one.delivery_concurrency, one.no_dispatcher) == (3, 2, 1, False)
    assert (two.concurrency, two.prefetch, two.no_dispatcher) == (2, 1, True), "no delivery slot left for it"
    env = main.child_environment(args)
    assert env["DATABASE_URL"] == "postgresql://user:secret@db/lading"
    assert env["LADING_AMQP_URL"] == "amqp://user:secret@mq/"


def test_no_dispatcher_stays_no_dispatcher() -> None:
    args = _parse("--database-url", "postgresql://db/x", "--no-dispatcher", "--processes", "2")
    for command in main.child_commands(args, 2, supervisor_pid=1):
        assert "--no-dispatcher" in command and "--delivery-concurrency" not in command


# --- The supervisor, with stand-in processes: each says it is ready (its SIGTERM handler set) with a
# file named by its pid.

READY = "import os, signal, sys, time\n{handler}\nopen(os.path.join(sys.argv[1], str(os.getpid())), 'w').close()\n"
SLEEPER = READY.format(handler="signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))") + "while True: time.sleep(1)"
STUBBORN = READY.format(handler="signal.signal(signal.SIGTERM, signal.SIG_IGN)") + "while True: time.sleep(1)"
QUICK = supervising.SupervisorSettings(grace_s=5, restart_backoff_s=(0.05,), restarts_max=2, stable_after_s=60)


def _command(code: str, ready: pathlib.Path) -> list[str]:
    return [sys.executable, "-c", code, str(ready)]


def _ready(supervisor: supervising.Supervisor, n: int, ready: pathlib.Path) -> Callable[[], Awaitable[bool]]:
    async def condition() -> bool:
        pids = supervisor.pids()
        return len(pids) == n and all((ready / str(pid)).exists() for pid in pids)

    return condition


async def test_a_killed_process_is_restarted_and_sigterm_stops_all_with_status_0(tmp_path: pathlib.Path) -> None:
    sleeper = _command(SLEEPER, tmp_path)
    supervisor = supervising.Supervisor([sleeper, sleeper], env=dict(os.environ), settings=QUICK)
    stop = asyncio.Event()
    run = asyncio.create_task(supervisor.run(stop))
    try:
        await waiting.until(_ready(supervisor, 2, tmp_path), timeout_s=30)
        first = supervisor.pids()
        os.kill(first[0], signal.SIGKILL)

        async def replaced() -> bool:
            now = supervisor.pids()
            return first[0] not in now and first[1] in now and await _ready(supervisor, 2, tmp_path)()

        await waiting.until(replaced, timeout_s=30)
        assert supervisor.liveness() == (True, "2 of 2 worker processes running")
        stop.set()
        assert await asyncio.wait_for(run, 30) == 0
    finally:
        stop.set()
        await asyncio.wait_for(run, 30)
    assert supervisor.pids() == [] and supervisor.liveness() == (False, "0 of 2 worker processes running")


async def test_a_process_that_keeps_failing_stops_the_supervisor_with_status_1(tmp_path: pathlib.Path) -> None:
    failing = [sys.executable, "-c", "raise SystemExit(3)"]
    supervisor = supervising.Supervisor([failing, _command(SLEEPER, tmp_path)], env=dict(os.environ), settings=QUICK)
    assert await asyncio.wait_for(supervisor.run(asyncio.Event()), 60) == 1
    assert supervisor.gave_up and supervisor.pids() == []


async def test_a_process_that_ignores_sigterm_is_killed_after_the_grace_period(tmp_path: pathlib.Path) -> None:
    settings = supervising.SupervisorSettings(grace_s=0.0)
    supervisor = supervising.Supervisor([_command(STUBBORN, tmp_path)], env=dict(os.environ), settings=settings)
    stop = asyncio.Event()
    run = asyncio.create_task(supervisor.run(stop))
    await waiting.until(_ready(supervisor, 1, tmp_path), timeout_s=30)
    stop.set()
    assert await asyncio.wait_for(run, 30) == 1, "killed, not stopped: a failure"


def test_exits_are_described_by_status_or_signal() -> None:
    assert supervising.describe_exit(3) == "exited with status 3"
    assert supervising.describe_exit(-signal.SIGKILL) == "was killed by SIGKILL"
