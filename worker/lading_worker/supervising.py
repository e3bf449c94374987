"""
`lading worker --processes N`: N worker processes on one machine, started and watched by one
supervisor.

One Python process computes on one core at a time, and on the SUCCEEDED path a worker spends
more CPU per job in Python than PostgreSQL does; so a machine runs a worker process per core:

    lading worker --processes 2 --concurrency 64 --http 0.0.0.0:8080   the supervisor: claims nothing
      ├── python -m lading_worker --processes 1 --concurrency 32 ...    worker process 1
      └── python -m lading_worker --processes 1 --concurrency 32 ...    worker process 2

Each worker process is a whole worker (main.py, running.py) in a fresh interpreter: its own event
loop, connection pool, claimer, heartbeater, committer and reaper (and dispatcher, relay and
consumer when configured). They share what the replicas of a pool share anyway, through
PostgreSQL: the pool's limiter, fenced SKIP LOCKED claims, leases any reaper rescues. So the
supervisor only starts, watches and stops them:

- each is `python -m lading_worker` with the supervisor's flags (the database and broker URLs in
  its environment, never on a command line `ps` shows), less `--http`; `--concurrency`,
  `--prefetch` and `--delivery-concurrency` are totals for the command, split evenly (main.py);
- the supervisor stands for the elected jobs itself (database gauges, cleaner, GPU allocator;
  running.electing): a machine stands once, and the database gauges are exported once;
- with `--http` it serves /metrics for all of them (Prometheus multiprocess mode: the worker
  processes write into a private temporary directory, `metrics.combined_registry` adds them up
  with the supervisor's own), /healthz (200 while every worker process runs) and /readyz (the
  database, as a single worker's);
- a worker process that exits when not told to is restarted after RESTART_BACKOFF_S (1, 2, 4, 8,
  10 s, ...); when one has failed `restarts_max` times in a row, each within `stable_after_s` of
  its start, the supervisor stops the others and exits 1 (Kubernetes then restarts the pod);
- SIGTERM and SIGINT go on to every worker process, which drains within its `--grace`; what still
  runs `STOP_MARGIN_S` after that is killed. Exit status 0 when every worker process exited 0;
- a worker process whose supervisor vanished (SIGKILL) notices within PARENT_CHECK_S, drains and
  exits (`watch_parent`).

`--processes 1` runs the worker in the command's own process, with no supervisor.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import pathlib
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence

from prometheus_client import multiprocess

from lading import health, metrics, schema
from lading_worker import cleaning, running

logger = logging.getLogger(__name__)

CPU_MAX = pathlib.Path("/sys/fs/cgroup/cpu.max")
"""The cgroup v2 CPU quota of this process's container ("QUOTA PERIOD" in microseconds, or "max ...")."""
CHILD_COMMAND: tuple[str, ...] = (sys.executable, "-m", "lading_worker")
"""How a worker process starts: a fresh interpreter, so nothing of the supervisor (event loop,
threads, connections) is inherited."""
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
"""Where prometheus_client in multiprocess mode keeps each process's values (set for the children only)."""
STOP_MARGIN_S = 5.0
"""After SIGTERM, a worker process gets its --grace plus this before it is killed."""
PARENT_CHECK_S = 1.0
"""How often a worker process looks whether its supervisor still runs."""
RESTART_BACKOFF_S: tuple[float, ...] = (1.0, 2.0, 4.0, 8.0, 10.0)
"""Waits before restarting a worker process that failed 1, 2, 3, ... times in a row; the last repeats.
Short: a liveness probe sees the missing process for at most this long."""


def available_cpus(*, cpu_max: pathlib.Path = CPU_MAX) -> int:
    """The default of `--processes`: the CPUs this process may run on (its affinity), bounded by the
    cgroup's CPU quota in whole CPUs (rounded down), at least 1."""
    cpus = len(os.sched_getaffinity(0))
    try:
        quota = cgroup_cpus(cpu_max.read_text())
    except OSError:
        quota = None
    return max(1, cpus if quota is None else min(cpus, quota))


def cgroup_cpus(text: str) -> int | None:
    """Whole CPUs of a cgroup v2 `cpu.max` ("200000 100000" -> 2, "50000 100000" -> 1); None: no quota."""
    fields = text.split()
    if len(fields) != 2 or fields[0] == "max":
        return None
    try:
        quota, period = int(fields[0]), int(fields[1])
    except ValueError:
        return None
    if quota <= 0 or period <= 0:
        return None
    return max(1, quota // period)


def shares(total: int, parts: int) -> list[int]:
    """`total` split into `parts` shares that differ by at most one, the larger first: (10, 3) -> [4, 3, 3]."""
    base, extra = divmod(total, parts)
    return [base + (1 if number < extra else 0) for number in range(parts)]


@dataclasses.dataclass(frozen=True)
class SupervisorSettings:
    grace_s: float = 20.0
    """The worker processes' drain period (their --grace): SIGKILL comes STOP_MARGIN_S after it."""
    restart_backoff_s: tuple[float, ...] = RESTART_BACKOFF_S
    """Waits before restarting a worker process that failed 1, 2, ... times in a row; the last repeats."""
    restarts_max: int = 5
    """Failures in a row a worker process may have; one more stops the supervisor (exit status 1).
    Five with the default backoff: about 25 s of a crash loop, then the pod's own restart policy."""
    stable_after_s: float = 60.0
    """A worker process that ran this long before it exited starts counting its failures afresh."""


@dataclasses.dataclass
class _Slot:
    number: int
    command: tuple[str, ...]
    process: asyncio.subprocess.Process | None = None
    failures: int = 0
    """Exits in a row, each within stable_after_s of its start."""


class Supervisor:
    """Keeps one worker process running per command until stopped; `run` returns the exit status."""

    def __init__(
            self,
            commands: Sequence[Sequence[str]],
            *,
            env: Mapping[str, str],
            settings: SupervisorSettings,
    ) -> None:
        self._slots = [_Slot(number, tuple(command)) for number, command in enumerate(commands, start=1)]
        self._env = dict(env)
        self.settings = settings
        self._metrics_dir = self._env.get(MULTIPROC_ENV)
        self._stopping = asyncio.Event()
        self.gave_up = False
        """True once a worker process failed too often in a row and everything was stopped."""

    def pids(self) -> list[int]:
        """Process ids of the worker processes running now."""
        return [s.process.pid for s in self._slots if s.process is not None and s.process.returncode is None]

    def liveness(self) -> tuple[bool, str]:
        """/healthz: alive while every worker process runs."""
        running_now, wanted = len(self.pids()), len(self._slots)
        return running_now == wanted, f"{running_now} of {wanted} worker processes running"

    async def run(self, stop: asyncio.Event) -> int:
        """Run the worker processes until `stop` is set (or one keeps failing), then stop them all."""
        relay = asyncio.create_task(self._stop_on(stop), name="stop signal")
        keepers = [asyncio.create_task(self._keep(slot), name=f"worker process {slot.number}") for slot in self._slots]
        try:
            codes = await asyncio.gather(*keepers)
        finally:
            self._stopping.set()
            relay.cancel()
            await asyncio.gather(relay, *keepers, return_exceptions=True)
        if self.gave_up:
            return 1
        failed = [(slot.number, code) for slot, code in zip(self._slots, codes, strict=True) if code != 0]
        for number, code in failed:
            logger.error("Worker process %d %s while stopping", number, describe_exit(code))
        return 1 if failed else 0

    async def _stop_on(self, stop: asyncio.Event) -> None:
        await stop.wait()
        self._stopping.set()

    async def _keep(self, slot: _Slot) -> int:
        """Run `slot`'s worker process, restarting it when it exits on its own; its exit status at the end."""
        while not self._stopping.is_set():
            process = await self._start(slot)
            started = time.monotonic()
            exited = asyncio.create_task(process.wait())
            stopping = asyncio.create_task(self._stopping.wait())
            await asyncio.wait([exited, stopping], return_when=asyncio.FIRST_COMPLETED)
            stopping.cancel()
            if not exited.done():
                exited.cancel()
                return await self._stop(slot, process)
            self._dead(process.pid)
            code = process.returncode
            assert code is not None
            if self._stopping.is_set():  # it got the signal first (SIGINT from a terminal reaches all)
                return _stopped(code)
            ran_s = time.monotonic() - started
            slot.failures = 1 if ran_s >= self.settings.stable_after_s else slot.failures + 1
            if slot.failures > self.settings.restarts_max:
                logger.error(
                    "Worker process %d (pid %d) %s after %.1f s, %d times in a row; stopping all worker processes",
                    slot.number, process.pid, describe_exit(code), ran_s, slot.failures,
                )  # fmt: skip
                self.gave_up = True
                self._stopping.set()
                return code
            backoff = self.settings.restart_backoff_s
            delay = backoff[min(slot.failures, len(backoff)) - 1]
            logger.warning(
                "Worker process %d (pid %d) %s after %.1f s; restarting it in %g s (failure %d in a row)",
                slot.number, process.pid, describe_exit(code), ran_s, delay, slot.failures,
            )  # fmt: skip
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), delay)
        return 0

    async def _start(self, slot: _Slot) -> asyncio.subprocess.Process:
        process = await asyncio.create_subprocess_exec(*slot.command, env=self._env, stdin=asyncio.subprocess.DEVNULL)
        slot.process = process
        logger.info("Worker process %d started (pid %d)", slot.number, process.pid)
        return process

    async def _stop(self, slot: _Slot, process: asyncio.subprocess.Process) -> int:
        """SIGTERM, then SIGKILL if it still runs after its grace period and STOP_MARGIN_S."""
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        patience_s = self.settings.grace_s + STOP_MARGIN_S
        try:
            code = await asyncio.wait_for(process.wait(), patience_s)
        except TimeoutError:
            logger.warning("Worker process %d (pid %d) still ran %g s after SIGTERM; killing it",
                           slot.number, process.pid, patience_s)  # fmt: skip
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            code = await process.wait()
        self._dead(process.pid)
        logger.info("Worker process %d (pid %d) stopped: %s", slot.number, process.pid, describe_exit(code))
        return _stopped(code)

    def _dead(self, pid: int) -> None:
        """Forget a gone process's live gauges (its counters and histograms stay in the sums)."""
        if self._metrics_dir is not None:
            multiprocess.mark_process_dead(pid, self._metrics_dir)  # type: ignore[no-untyped-call]


def _stopped(code: int) -> int:
    """The exit status of a worker process asked to stop: death by SIGTERM or SIGINT counts as a clean stop,
    since a worker process handles both (it drains) from before it claims anything; so it died of one
    only while starting, holding nothing."""
    return 0 if code in (-signal.SIGTERM, -signal.SIGINT) else code


def describe_exit(code: int) -> str:
    """'exited with status 1', 'was killed by SIGKILL'."""
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-code).name}"
        return f"was killed by signal {-code}"
    return f"exited with status {code}"


@contextlib.contextmanager
def metrics_directory() -> Iterator[str]:
    """A private directory for the worker processes' metrics (PROMETHEUS_MULTIPROC_DIR), removed afterwards."""
    directory = tempfile.mkdtemp(prefix="lading-worker-metrics-")
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


async def supervise(
        dsn: str,
        *,
        commands: Sequence[Sequence[str]],
        env: Mapping[str, str],
        settings: SupervisorSettings,
        http: str | None = None,
        cleaner: cleaning.CleanerSettings | None = None,
) -> int:
    """The supervisor of `lading worker --processes N` (N = len(commands)) until SIGTERM/SIGINT; the exit status."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    with contextlib.ExitStack() as files:
        child_env = {key: value for key, value in env.items() if key != MULTIPROC_ENV}
        directory = None
        if http is not None:
            directory = files.enter_context(metrics_directory())
            child_env[MULTIPROC_ENV] = directory
        supervisor = Supervisor(commands, env=child_env, settings=settings)
        async with contextlib.AsyncExitStack() as stack:
            if http is not None and directory is not None:
                host, port = health.parse_listen(http)
                await stack.enter_async_context(health.serving(
                    dsn, host=host, port=port, registry=metrics.combined_registry(directory),
                    liveness=supervisor.liveness,
                ))  # fmt: skip
            logger.info("Supervising %d worker processes (pid %d)", len(commands), os.getpid())
            elected = asyncio.create_task(_stand_for_elections(dsn, stop, cleaner=cleaner), name="elected jobs")
            try:
                code = await supervisor.run(stop)
            finally:
                stop.set()
                await asyncio.wait([elected])
            if not elected.cancelled() and elected.exception() is not None:
                logger.error("The elected jobs failed: %r", elected.exception())
                code = code or 1
    return code


async def _stand_for_elections(dsn: str, stop: asyncio.Event, *, cleaner: cleaning.CleanerSettings | None) -> None:
    """The elected jobs, once the schema is current, until `stop`: in the supervisor, for its machine."""
    if not await schema.wait_until_current(dsn, stop=stop, what="worker supervisor"):
        return
    async with running.electing(dsn, cleaner=cleaner):
        await stop.wait()


async def watch_parent(parent_pid: int, stop: asyncio.Event) -> None:
    """In a worker process: set `stop` (a drain) once its supervisor `parent_pid` is gone."""
    while not stop.is_set():
        if os.getppid() != parent_pid:
            logger.warning("The supervisor (pid %d) is gone; stopping", parent_pid)
            stop.set()
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), PARENT_CHECK_S)
