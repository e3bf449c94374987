"""
The `compare` benchmark (run through hack/bench.py): Lading beside its peers, in one run, on the
same PostgreSQL and RabbitMQ, one after the other.

- Lading, SUCCEEDED path: 20,000 jobs through one in-process Worker (`bench.run_worker`) with
  `EvidencedNoopProvider` (every job passes invoice-strict-v1's validation in full), at one fixed
  setting (`LADING_SETTING`, the best of the `dispatch` grid on this kind of machine); then the
  review path (`NoopProvider`, every job REVIEW_REQUIRED) at the same setting.
- Lading, SUCCEEDED path, `lading worker --processes 2` (the command's default on two CPUs, and
  the row the throughput targets are judged on, as Celery's prefork pool of 2 processes is its
  row): the same 20,000 jobs at the same setting
  (`--concurrency 500` in all, split 250 + 250), as real processes: a supervisor and its two worker
  processes (`python -m compare_peers.lading_noop_worker`, i.e. `lading worker` with the same
  provider, logging at WARNING like the other rows), started once the backlog is loaded and
  stopped by SIGTERM to the supervisor's PID.
  Measured once both worker processes claim (interpreter start-up left out, as for Celery; a
  process that comes up a second later would otherwise count as a slower system): jobs/s of the
  jobs finished from the later process's first attempt to the last job's finish (database
  timestamps); worker CPU is the supervisor's and its children's (/proc, as Celery's), and
  PostgreSQL's its backends', from the poll that saw both processes claim to the poll that saw
  every job settled (both polls every LADING_PROCESS_POLL_S, on the harness's connection).
- Procrastinate 3: no-op jobs (deferred first, in batches), its own schema in its own database,
  its worker in this process (`run_worker_async(wait=False)`, which returns once the queue is
  empty) at concurrency 10 and 50; jobs/s from the first `started` event to the last `succeeded`.
- Celery 5 + RabbitMQ: no-op tasks, `acks_late`, prefork pool of 2 processes, prefetch multiplier
  1 and 4, no result backend, in a vhost of its own (made with rabbitmqctl; without it, a queue of
  its own on `/`). The tasks are published first; then `celery worker` starts as a subprocess and
  tells the harness through a FIFO when a pool process starts its first task and, from its main
  process, when each task's message is acknowledged (hack/compare_peers/celery_app.py). Jobs/s
  counts every task, from the first task's start to the last acknowledgement (as a Lading job
  counts once its commit returned); the worker is stopped by its PID only once every task is
  acknowledged, and the queue must then be empty.
- A raw asyncpg ceiling: fenced claim-and-complete of no-op rows (FOR UPDATE SKIP LOCKED, 50 per
  round trip, one statement to claim and one to complete), `CEILING_CONNECTIONS` loops.
- Acceptance vs a plain COPY: the `accept` scenario (`bench.bench_accept`), once, after the rounds:
  five 10,000-document batches through `accepting.accept_batch`, each followed by one transaction
  that COPYs 10,000 job rows and 10,000 outbox rows into the tables `COPY_SETUP` makes (the same
  columns, only a primary key); the ratio of the medians' jobs/s. Beside it, not the target: the
  ratio to the same COPY with each job's document text as well (`COPY_DOCUMENTS_SETUP`).

CPU per job: the worker's (this process's rusage for in-process workers, /proc of the celery
process tree for Celery) and PostgreSQL's (utime + stime from /proc/<pid>/stat of the backends
connected to the run's database, before and after; the server's background processes are left
out); for Celery, RabbitMQ's (beam.smp), which also counts whatever else uses the broker.
A peer whose package is not installed (`pip install -e '.[bench]'`), or whose run fails, is reported
as skipped. $LADING_BENCH_COMPARE_ROUNDS=N runs every system N times, round after round (default
1): each system reports the run with the median jobs/s and the ratios come from those medians,
with each round's ratios beside them.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import pathlib
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import asyncpg

from lading.db import pool as dbpool

HACK = pathlib.Path(__file__).resolve().parent

LADING_JOBS = 20_000
LADING_SETTING = {"concurrency": 500, "claim_batch": 100, "commit_batch": 200, "prefetch": 0}
"""Fixed, not searched: the best setting of the `dispatch` grid in docs/benchmarks.md."""

PROCRASTINATE_JOBS = 3_000
PROCRASTINATE_CONCURRENCY = (10, 50)
PROCRASTINATE_DEFER_BATCH = 1_000

CELERY_TASKS = 20_000
CELERY_PROCESSES = 2
CELERY_PREFETCH = (1, 4)
CELERY_START_TIMEOUT_S = 60.0

CEILING_JOBS = 100_000
CEILING_BATCH = 50
CEILING_CONNECTIONS = 4


PART_TIMEOUT_S = 300.0
"""Each measured run gives up after this long (something is stuck, not slow)."""
LOAD_SAMPLE_S = 5.0
ROUNDS_VARIABLE = "LADING_BENCH_COMPARE_ROUNDS"

TARGET_VS_CELERY = 2.0
TARGET_VS_PROCRASTINATE = 10.0
TARGET_ACCEPT_VS_COPY = 0.85

LADING_SUCCEEDED = "lading_succeeded"
LADING_PROCESSES = "lading_succeeded_processes_2"
LADING_PROCESS_COUNT = 2
LADING_PROCESS_POLL_S = 0.25
"""How often the database is asked whether both processes claim, then whether every job has settled."""
LADING_REVIEW = "lading_review"
CELERY_REFERENCE = "celery_prefetch_4"
PROCRASTINATE_REFERENCE = "procrastinate_concurrency_10"
CEILING = "asyncpg_ceiling"


# --------------------------------------------------------------------------------------------
# Pure logic: one measured system, the ratios, the readable table.


@dataclasses.dataclass(frozen=True)
class Measured:
    """One system's run: `jobs` finished in `seconds`; CPU seconds spent meanwhile (None: unknown)."""

    label: str
    jobs: int
    seconds: float
    worker_cpu_s: float | None = None
    postgres_cpu_s: float | None = None
    broker_cpu_s: float | None = None
    details: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def jobs_per_s(self) -> float:
        return round(self.jobs / self.seconds, 1) if self.seconds > 0 else 0.0

    @property
    def total_cpu_s(self) -> float | None:
        """The worker's CPU plus its store's (PostgreSQL, or RabbitMQ for Celery); None if either is unknown."""
        store = self.postgres_cpu_s if self.postgres_cpu_s is not None else self.broker_cpu_s
        return None if self.worker_cpu_s is None or store is None else self.worker_cpu_s + store

    def to_json(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "jobs": self.jobs,
            "seconds": round(self.seconds, 3),
            "jobs_per_s": self.jobs_per_s,
            "worker_cpu_ms_per_job": _per_job_ms(self.worker_cpu_s, self.jobs),
            "postgres_cpu_ms_per_job": _per_job_ms(self.postgres_cpu_s, self.jobs),
            "broker_cpu_ms_per_job": _per_job_ms(self.broker_cpu_s, self.jobs),
            "cpu_ms_per_job_total": _per_job_ms(self.total_cpu_s, self.jobs),
            **dict(self.details),
        }


def _per_job_ms(cpu_s: float | None, jobs: int) -> float | None:
    return None if cpu_s is None or jobs <= 0 else round(cpu_s / jobs * 1000, 3)


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None or denominator <= 0:
        return None
    return round(numerator / denominator, 2)


def median_run(runs: Sequence[Measured]) -> Measured:
    """The run whose jobs/s is the (lower) median of `runs`."""
    rate = statistics.median_low(run.jobs_per_s for run in runs)
    return next(run for run in runs if run.jobs_per_s == rate)


def summarize(
    rounds: Sequence[Mapping[str, Measured]],
    *,
    skipped: Mapping[str, str],
    acceptance: Mapping[str, Any] | None,
    load: Mapping[str, Any],
) -> tuple[dict[str, Any], dict[str, Any], bool]:
    """(results, targets, passed) from what each round measured: per system, the run with the median
    jobs/s (all rounds' jobs/s beside it); ratios of those medians and of each round; a ratio whose
    terms are missing is None."""
    keys = list(dict.fromkeys(key for measured in rounds for key in measured))
    systems = {key: median_run([measured[key] for measured in rounds if key in measured]) for key in keys}

    def ratios_of(measured: Mapping[str, Measured]) -> dict[str, float | None]:
        def rate(key: str) -> float | None:
            return measured[key].jobs_per_s if key in measured else None

        lading = rate(LADING_SUCCEEDED)
        return {
            "lading_vs_celery_prefetch_4": ratio(lading, rate(CELERY_REFERENCE)),
            "lading_vs_procrastinate_concurrency_10": ratio(lading, rate(PROCRASTINATE_REFERENCE)),
            "lading_vs_asyncpg_ceiling": ratio(lading, rate(CEILING)),
            "lading_review_vs_celery_prefetch_4": ratio(rate(LADING_REVIEW), rate(CELERY_REFERENCE)),
            "lading_processes_2_vs_celery_prefetch_4": ratio(rate(LADING_PROCESSES), rate(CELERY_REFERENCE)),
            "lading_processes_2_vs_procrastinate_concurrency_10": ratio(
                rate(LADING_PROCESSES), rate(PROCRASTINATE_REFERENCE)
            ),
            "lading_processes_2_vs_in_process": ratio(rate(LADING_PROCESSES), lading),
        }

    ratios: dict[str, float | None] = {
        **ratios_of(systems),
        "accept_vs_copy": None if acceptance is None else acceptance.get("ratio"),
    }
    # The throughput targets are judged on `lading worker` as it runs by default here (one worker
    # process per CPU: --processes 2), beside Celery's prefork pool of 2 processes; the in-process
    # worker's ratios are reported beside them.
    targets = {
        "lading_processes_2_vs_celery_prefetch_4_min": TARGET_VS_CELERY,
        "lading_processes_2_vs_procrastinate_concurrency_10_min": TARGET_VS_PROCRASTINATE,
        "accept_vs_copy_min": TARGET_ACCEPT_VS_COPY,
    }
    checks = (
        (ratios["lading_processes_2_vs_celery_prefetch_4"], TARGET_VS_CELERY),
        (ratios["lading_processes_2_vs_procrastinate_concurrency_10"], TARGET_VS_PROCRASTINATE),
        (ratios["accept_vs_copy"], TARGET_ACCEPT_VS_COPY),
    )
    met = {name: value is not None and value >= target for name, (value, target) in zip(targets, checks, strict=True)}
    results = {
        "rounds": len(rounds),
        "jobs_per_s": {key: m.jobs_per_s for key, m in systems.items()},
        "ratios": ratios,
        "ratios_per_round": [ratios_of(measured) for measured in rounds],
        "targets_met": met,
        "systems": {
            key: {**m.to_json(), "jobs_per_s_rounds": [r[key].jobs_per_s for r in rounds if key in r]}
            for key, m in systems.items()
        },
        "skipped": dict(skipped),
        "acceptance_vs_copy": dict(acceptance) if acceptance is not None else None,
        "load_average": dict(load),
    }
    return results, targets, all(met.values())


def _fmt(value: float | None, digits: int = 0) -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}"


def render_table(results: Mapping[str, Any]) -> str:
    """The readable form of `summarize`'s results (stderr, and docs/benchmarks.md)."""
    lines = [
        "| System | Jobs | Jobs/s | Worker CPU ms/job | PostgreSQL (or RabbitMQ) CPU ms/job "
        "| Load (1 min) before, after |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for system in results["systems"].values():
        lines.append(
            f"| {system['label']} | {system['jobs']:,} | {_fmt(system['jobs_per_s'])}{_each_round(system)} "
            f"| {_fmt(system['worker_cpu_ms_per_job'], 3)} | {_store_cpu(system)} "
            f"| {', '.join(_fmt(x, 1) for x in system.get('load_1m_before_after', ()))} |"
        )
    for name, why in results["skipped"].items():
        lines.append(f"| {name} | skipped: {why} | | | | |")
    ratios = results["ratios"]
    lines.append("")
    lines.append(
        f"Lading SUCCEEDED path, `lading worker --processes {LADING_PROCESS_COUNT}` (the targets' row) vs Celery "
        f"prefetch 4: {_fmt(ratios['lading_processes_2_vs_celery_prefetch_4'], 2)}x (target {TARGET_VS_CELERY:g}x); "
        f"vs Procrastinate concurrency 10: {_fmt(ratios['lading_processes_2_vs_procrastinate_concurrency_10'], 2)}x "
        f"(target {TARGET_VS_PROCRASTINATE:g}x); {_fmt(ratios['lading_processes_2_vs_in_process'], 2)}x the "
        "in-process worker"
    )
    lines.append(
        f"Lading SUCCEEDED path, one in-process worker, vs Celery prefetch 4: "
        f"{_fmt(ratios['lading_vs_celery_prefetch_4'], 2)}x; vs Procrastinate concurrency 10: "
        f"{_fmt(ratios['lading_vs_procrastinate_concurrency_10'], 2)}x; vs the asyncpg ceiling: "
        f"{_fmt(ratios['lading_vs_asyncpg_ceiling'], 2)}x"
    )
    if results.get("rounds", 1) > 1:
        each = [
            f"{_fmt(r['lading_processes_2_vs_celery_prefetch_4'], 2)}x / "
            f"{_fmt(r['lading_processes_2_vs_procrastinate_concurrency_10'], 2)}x"
            for r in results["ratios_per_round"]
        ]
        lines.append(f"Each round, --processes {LADING_PROCESS_COUNT} (vs Celery prefetch 4 / vs Procrastinate "
                     f"concurrency 10): {', '.join(each)}")
    acceptance = results.get("acceptance_vs_copy")
    if acceptance is not None:
        lines.append(
            f"Acceptance of {acceptance['documents']:,} documents: {_fmt(acceptance['accept_jobs_per_s_median'])} "
            f"jobs/s vs plain COPY {_fmt(acceptance['copy_jobs_per_s_median'])} jobs/s (medians of "
            f"{acceptance['repetitions']}): {_fmt(acceptance['ratio'], 2)} (target {TARGET_ACCEPT_VS_COPY:g}); "
            f"by CPU (this process and PostgreSQL): {_fmt(acceptance.get('ratio_by_cpu'), 2)}"
        )
    load = results["load_average"]
    lines.append(
        f"Load average (1 min) during the run: {_fmt(load.get('min_1m'), 2)} to {_fmt(load.get('max_1m'), 2)}, "
        f"median {_fmt(load.get('median_1m'), 2)} ({load.get('cpus')} CPUs)"
    )
    return "\n".join(lines)


def _each_round(system: Mapping[str, Any]) -> str:
    rates = system.get("jobs_per_s_rounds", ())
    return f" ({' / '.join(_fmt(r) for r in rates)})" if len(rates) > 1 else ""


def _store_cpu(system: Mapping[str, Any]) -> str:
    if system["postgres_cpu_ms_per_job"] is None and system["broker_cpu_ms_per_job"] is not None:
        return f"({_fmt(system['broker_cpu_ms_per_job'], 3)})"
    return _fmt(system["postgres_cpu_ms_per_job"], 3)


def cpu_ticks(stat: str) -> tuple[int, int]:
    """(utime + stime, cutime + cstime) in clock ticks from the text of /proc/<pid>/stat."""
    fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) ": field 3 (state) is fields[0]
    return int(fields[11]) + int(fields[12]), int(fields[13]) + int(fields[14])


def load_summary(samples: Sequence[float], *, start: Sequence[float], end: Sequence[float]) -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "start": [round(x, 2) for x in start],
        "end": [round(x, 2) for x in end],
        "samples_1m": [round(s, 2) for s in samples],
        "min_1m": round(min(samples), 2) if samples else None,
        "median_1m": round(statistics.median(samples), 2) if samples else None,
        "max_1m": round(max(samples), 2) if samples else None,
    }


# --------------------------------------------------------------------------------------------
# CPU from /proc


_TICK = os.sysconf("SC_CLK_TCK")


def _own_cpu_s(pid: int, *, children: bool = False) -> float | None:
    try:
        own, reaped = cpu_ticks(pathlib.Path(f"/proc/{pid}/stat").read_text())
    except (OSError, ValueError, IndexError):
        return None
    return (own + (reaped if children else 0)) / _TICK


def _cpu_of(pids: Iterable[int]) -> dict[int, float]:
    found = {}
    for pid in pids:
        cpu = _own_cpu_s(pid)
        if cpu is not None:
            found[pid] = cpu
    return found


def _cpu_delta(before: Mapping[int, float], after: Mapping[int, float]) -> float:
    """CPU spent between two snapshots; a process that appeared meanwhile counts whole."""
    return sum(cpu - before.get(pid, 0.0) for pid, cpu in after.items())


def _process_tree(root: int) -> list[int]:
    """`root` and its descendants (scanning /proc for parent ids)."""
    parents: dict[int, list[int]] = {}
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        parents.setdefault(ppid, []).append(int(entry.name))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(parents.get(pid, ()))
    return tree


def _pids_named(name: str) -> list[int]:
    pids = []
    for entry in pathlib.Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if (entry / "comm").read_text().strip() == name:
                    pids.append(int(entry.name))
    return pids


class PostgresCpu:
    """CPU of the server processes serving one database (its backends, from pg_stat_activity)."""

    def __init__(self, conn: asyncpg.Connection) -> None:
        self._conn = conn
        self._before: dict[int, float] = {}

    async def _backends(self) -> list[int]:
        rows = await self._conn.fetch(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND backend_type = 'client backend'"
        )
        return [r["pid"] for r in rows]

    async def start(self) -> None:
        self._before = _cpu_of(await self._backends())

    async def stop(self) -> float | None:
        after = _cpu_of(set(await self._backends()) | set(self._before))
        if not after:
            return None  # not this machine's server, or /proc not readable
        return round(_cpu_delta(self._before, after), 3)


def _rusage_cpu_s() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# --------------------------------------------------------------------------------------------
# The scenario


async def bench_compare(url: str) -> tuple[dict[str, Any], dict[str, Any], bool]:
    """The hack/bench.py scenario, in the database it created, migrated and seeded."""
    rounds: list[dict[str, Measured]] = []
    skipped: dict[str, str] = {}
    samples: list[float] = []
    start_load = os.getloadavg()
    sampler = asyncio.create_task(_sample_load(samples), name="load average")
    try:
        for number in range(1, _rounds() + 1):
            print(f"bench: compare round {number} of {_rounds()}", file=sys.stderr, flush=True)
            systems: dict[str, Measured] = {}
            await _part(systems, _lading(url))
            await _part(systems, _lading_processes(url))
            await _peer(systems, skipped, "Procrastinate", _procrastinate(url))
            await _peer(systems, skipped, "Celery", _celery())
            await _part(systems, _ceiling(url))
            rounds.append(systems)
        acceptance = await _accept_vs_copy(url)
    finally:
        sampler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampler
    samples.append(os.getloadavg()[0])
    load = load_summary(samples, start=start_load, end=os.getloadavg())
    results, targets, passed = summarize(rounds, skipped=skipped, acceptance=acceptance, load=load)
    results["versions"] = _versions()
    print("\n" + render_table(results) + "\n", file=sys.stderr, flush=True)
    return results, targets, passed


def _rounds() -> int:
    """$LADING_BENCH_COMPARE_ROUNDS (default 1): how many times every system runs, one after the other."""
    return max(1, int(os.environ.get(ROUNDS_VARIABLE, "1")))


async def _sample_load(samples: list[float]) -> None:
    while True:
        samples.append(os.getloadavg()[0])
        await asyncio.sleep(LOAD_SAMPLE_S)


async def _peer(
    systems: dict[str, Measured],
    skipped: dict[str, str],
    name: str,
    part: Awaitable[list[tuple[str, Measured]]],
) -> None:
    """A peer that is not installed, or whose run fails, is reported as skipped with the reason."""
    try:
        await _part(systems, part)
    except ModuleNotFoundError as exc:
        skipped[name] = f"not installed ({exc.name}); pip install -e '.[bench]'"
    except Exception as exc:  # the peer's failure, not Lading's: report it, measure the rest
        skipped[name] = f"failed: {type(exc).__name__}: {exc}"[:500]
        print(f"bench: compare {name} failed: {exc!r}", file=sys.stderr, flush=True)


async def _part(systems: dict[str, Measured], part: Awaitable[list[tuple[str, Measured]]]) -> None:
    """Run one part; each system it measured keeps the 1-minute load average before and after."""
    before = os.getloadavg()[0]
    measured = await part
    after = os.getloadavg()[0]
    for key, one in measured:
        systems[key] = dataclasses.replace(
            one, details={**one.details, "load_1m_before_after": [round(before, 2), round(after, 2)]}
        )
        print(f"bench: compare {json.dumps(systems[key].to_json())}", file=sys.stderr, flush=True)


def _versions() -> dict[str, str | None]:
    from importlib import metadata

    found: dict[str, str | None] = {}
    for name in ("celery", "kombu", "procrastinate", "psycopg", "asyncpg"):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    with contextlib.suppress(ImportError):
        import psycopg

        found["psycopg_implementation"] = psycopg.pq.__impl__
    return found


# --------------------------------------------------------------------------------------------
# Lading


async def _lading(url: str) -> list[tuple[str, Measured]]:
    import bench  # hack/bench.py: its dispatch machinery, imported here to avoid a cycle at import time

    from lading.providers import noop

    setting = "/".join(str(LADING_SETTING[k]) for k in ("concurrency", "claim_batch", "commit_batch", "prefetch"))
    texts = bench.invoice_texts(LADING_JOBS)
    measured: list[tuple[str, Measured]] = []
    conn = await dbpool.connect(url)
    pool = await bench._worker_pool(url)
    try:
        runs = (
            (LADING_SUCCEEDED, "Lading, SUCCEEDED path", bench.evidenced(texts), bench.EvidencedNoopProvider(),
             "SUCCEEDED"),
            (LADING_REVIEW, "Lading, review path", texts, noop.NoopProvider(), "REVIEW_REQUIRED"),
        )  # fmt: skip
        for key, label, documents, provider, state in runs:
            await bench._prepare(conn, documents)
            postgres = PostgresCpu(conn)
            await postgres.start()
            run = await asyncio.wait_for(
                bench.run_worker(
                    pool, conn, settings=bench.worker_settings(**LADING_SETTING), provider=provider, jobs=LADING_JOBS
                ),
                PART_TIMEOUT_S,
            )
            postgres_cpu = await postgres.stop()
            if not run.settled_as(state):
                raise RuntimeError(f"{label}: not every job settled as {state}: {run.to_json()}")
            measured.append(
                (
                    key,
                    Measured(
                        label=f"{label} (concurrency/claim/commit/prefetch {setting})",
                        jobs=run.jobs,
                        seconds=run.seconds,
                        worker_cpu_s=run.cpu_s,
                        postgres_cpu_s=postgres_cpu,
                        details={"setting": dict(LADING_SETTING), "states": run.states, "timing": "worker start to "
                                 "the poll (every 50 ms) that saw every job settled"},
                    ),
                )
            )  # fmt: skip
    finally:
        await pool.close()
        await conn.close()
    return measured


async def _lading_processes(url: str) -> list[tuple[str, Measured]]:
    """The SUCCEEDED path through `lading worker --processes 2` (a supervisor and two worker processes)."""
    import bench

    setting = LADING_SETTING
    conn = await dbpool.connect(url)
    try:
        await bench._prepare(conn, bench.evidenced(bench.invoice_texts(LADING_JOBS)))
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(HACK), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
            "DATABASE_URL": url,
        }
        command = [
            sys.executable, "-m", "compare_peers.lading_noop_worker", "--pool", str(bench.POOL),
            "--processes", str(LADING_PROCESS_COUNT), "--concurrency", str(setting["concurrency"]),
            "--claim-batch", str(setting["claim_batch"]), "--commit-batch", str(setting["commit_batch"]),
            "--prefetch", str(setting["prefetch"]), "--no-dispatcher",
        ]  # fmt: skip
        postgres = PostgresCpu(conn)
        with tempfile.TemporaryDirectory(prefix="lading-compare-") as tmp:
            log = pathlib.Path(tmp) / "worker.log"
            with _log_file(log) as handle:
                worker = await asyncio.create_subprocess_exec(
                    *command, env=env, stdout=handle, stderr=subprocess.STDOUT, cwd=HACK
                )
            supervisor = worker.pid
            try:
                cpu_first, cpu_last, processes_seen, postgres_cpu = await asyncio.wait_for(
                    _watch_processes(conn, worker, log, postgres), CELERY_START_TIMEOUT_S + PART_TIMEOUT_S
                )
            finally:
                status = await _stop_supervisor(worker)
            if status != 0:
                raise RuntimeError(f"lading worker --processes exited with {status}: {_tail(log)}")
        span = await conn.fetchrow(
            "WITH firsts AS (SELECT worker_id, min(started_at) AS first FROM job_attempts GROUP BY worker_id),"
            "     window_start AS (SELECT max(first) AS first, count(*) AS workers FROM firsts)"
            " SELECT w.first, w.workers, max(j.finished_at) AS last, count(*) AS jobs"
            "   FROM window_start w JOIN extraction_jobs j ON j.finished_at >= w.first"
            "  GROUP BY w.first, w.workers"
        )
        states = {r["state"]: r["n"] for r in await conn.fetch(
            "SELECT state, count(*)::int AS n FROM extraction_jobs GROUP BY state ORDER BY state"
        )}  # fmt: skip
        if states != {"SUCCEEDED": LADING_JOBS}:
            raise RuntimeError(f"lading worker --processes: not every job SUCCEEDED: {states}")
    finally:
        await conn.close()
    label = (
        f"Lading, SUCCEEDED path, `lading worker --processes {LADING_PROCESS_COUNT}` "
        f"(concurrency/claim/commit/prefetch {'/'.join(str(setting[k]) for k in setting)})"
    )
    return [(LADING_PROCESSES, Measured(
        label=label, jobs=span["jobs"], seconds=(span["last"] - span["first"]).total_seconds(),
        worker_cpu_s=round(_cpu_delta(cpu_first, cpu_last), 3), postgres_cpu_s=postgres_cpu,
        details={"setting": dict(setting), "processes": LADING_PROCESS_COUNT, "states": states,
                 "worker_ids": span["workers"], "processes_measured": processes_seen,
                 "supervisor_cpu_s": round(cpu_last.get(supervisor, 0.0) - cpu_first.get(supervisor, 0.0), 3),
                 "timing": "jobs finished from the later worker process's first attempt to the last job's "
                           "finish (database timestamps); CPU from the poll that saw both processes claim"},
    ))]  # fmt: skip


async def _watch_processes(
    conn: asyncpg.Connection, worker: asyncio.subprocess.Process, log: pathlib.Path, postgres: PostgresCpu
) -> tuple[dict[int, float], dict[int, float], int, float | None]:
    """CPU of the supervisor's process tree (and PostgreSQL's) from when every worker process claims to when
    every job has settled; the PostgreSQL part is taken before the processes stop (their backends go)."""
    import bench

    cpu_first: dict[int, float] = {}
    while True:
        if worker.returncode is not None:
            raise RuntimeError(f"lading worker --processes exited with {worker.returncode}: {_tail(log)}")
        if not cpu_first:
            claiming = await conn.fetchval("SELECT count(DISTINCT worker_id) FROM job_attempts")
            if claiming >= LADING_PROCESS_COUNT:
                cpu_first = _cpu_of(_process_tree(worker.pid))
                await postgres.start()
        else:
            settled = await conn.fetchval(
                "SELECT count(*) FROM extraction_jobs WHERE state = ANY($1::text[])", list(bench.SETTLED_STATES)
            )
            if settled >= LADING_JOBS:
                tree = _process_tree(worker.pid)
                cpu_last = _cpu_of(tree)
                return cpu_first, cpu_last, len(tree), await postgres.stop()
        await asyncio.sleep(LADING_PROCESS_POLL_S)


async def _stop_supervisor(worker: asyncio.subprocess.Process) -> int:
    """SIGTERM to the supervisor's PID (it stops its worker processes); SIGKILL to its tree if it hangs."""
    if worker.returncode is None:
        worker.send_signal(signal.SIGTERM)
        try:
            return await asyncio.wait_for(worker.wait(), 60)
        except TimeoutError:
            for pid in reversed(_process_tree(worker.pid)):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
    return await asyncio.wait_for(worker.wait(), 30)


@contextlib.contextmanager
def _log_file(path: pathlib.Path) -> Iterator[Any]:
    with path.open("w") as handle:
        yield handle


def _tail(log: pathlib.Path) -> str:
    return log.read_text(errors="replace")[-2000:]


# --------------------------------------------------------------------------------------------
# Procrastinate


@contextlib.asynccontextmanager
async def _own_database(url: str, suffix: str) -> AsyncIterator[str]:
    """A database beside the run's (`<its name>_<suffix>`), dropped afterwards; yields its URL."""
    import bench

    conn = await asyncpg.connect(url)
    try:
        name = f"{await conn.fetchval('SELECT current_database()')}_{suffix}"
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    try:
        yield bench._with_database(url, name)
    finally:
        conn = await asyncpg.connect(url)
        try:
            await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await conn.close()


async def _procrastinate(url: str) -> list[tuple[str, Measured]]:
    import procrastinate  # type: ignore[import-not-found,unused-ignore]

    measured: list[tuple[str, Measured]] = []
    async with _own_database(url, "procrastinate") as own_url:
        watcher = await asyncpg.connect(own_url)
        try:
            for concurrency in PROCRASTINATE_CONCURRENCY:
                connector = procrastinate.PsycopgConnector(conninfo=own_url, min_size=2, max_size=concurrency + 2)
                app = procrastinate.App(connector=connector)

                async def noop() -> None:
                    return None

                task = app.task(name="compare.noop")(noop)
                async with app.open_async():
                    if concurrency == PROCRASTINATE_CONCURRENCY[0]:
                        await app.schema_manager.apply_schema_async()
                    await watcher.execute("TRUNCATE procrastinate_jobs, procrastinate_events RESTART IDENTITY CASCADE")
                    for start in range(0, PROCRASTINATE_JOBS, PROCRASTINATE_DEFER_BATCH):
                        count = min(PROCRASTINATE_DEFER_BATCH, PROCRASTINATE_JOBS - start)
                        await task.batch_defer_async(*({} for _ in range(count)))
                    await watcher.execute("ANALYZE")
                    postgres = PostgresCpu(watcher)
                    await postgres.start()
                    cpu_before = _rusage_cpu_s()
                    await asyncio.wait_for(
                        app.run_worker_async(concurrency=concurrency, wait=False, install_signal_handlers=False),
                        PART_TIMEOUT_S,
                    )
                    worker_cpu = _rusage_cpu_s() - cpu_before
                    postgres_cpu = await postgres.stop()
                span = await watcher.fetchrow(
                    "SELECT min(at) FILTER (WHERE type = 'started') AS first,"
                    "       max(at) FILTER (WHERE type = 'succeeded') AS last,"
                    "       count(*) FILTER (WHERE type = 'succeeded') AS succeeded"
                    "  FROM procrastinate_events"
                )
                states = await watcher.fetch(
                    "SELECT status::text, count(*)::int AS n FROM procrastinate_jobs GROUP BY 1"
                )
                if span["succeeded"] != PROCRASTINATE_JOBS or {r["status"]: r["n"] for r in states} != {
                    "succeeded": PROCRASTINATE_JOBS
                }:
                    raise RuntimeError(f"Procrastinate: not every job succeeded: {[dict(r) for r in states]}")
                seconds = (span["last"] - span["first"]).total_seconds()
                measured.append(
                    (
                        f"procrastinate_concurrency_{concurrency}",
                        Measured(
                            label=f"Procrastinate, concurrency {concurrency}",
                            jobs=PROCRASTINATE_JOBS,
                            seconds=seconds,
                            worker_cpu_s=worker_cpu,
                            postgres_cpu_s=postgres_cpu,
                            details={
                                "concurrency": concurrency,
                                "connection_pool_max": concurrency + 2,
                                "timing": "first 'started' event to the last 'succeeded' event",
                            },
                        ),
                    )
                )
        finally:
            await watcher.close()
    return measured


# --------------------------------------------------------------------------------------------
# Celery


AMQP_ROOT = "amqp://guest:guest@127.0.0.1:5672"


@contextlib.contextmanager
def _broker_space(name: str) -> Iterator[tuple[str, str]]:
    """(broker URL, how it is isolated): a vhost made with rabbitmqctl, else a queue of its own on '/'."""
    ctl = shutil.which("rabbitmqctl") or ("/usr/sbin/rabbitmqctl" if os.path.exists("/usr/sbin/rabbitmqctl") else None)
    made = False
    if ctl is not None:
        made = _rabbitmqctl(ctl, "add_vhost", name) and _rabbitmqctl(
            ctl, "set_permissions", "-p", name, "guest", ".*", ".*", ".*"
        )
    try:
        if made:
            yield f"{AMQP_ROOT}/{name}", f"vhost {name} (rabbitmqctl)"
        else:
            yield f"{AMQP_ROOT}//", f"queue {name} on vhost / (rabbitmqctl not usable)"
    finally:
        if made and ctl is not None:
            _rabbitmqctl(ctl, "delete_vhost", name)


def _rabbitmqctl(ctl: str, *args: str) -> bool:
    try:
        done = subprocess.run([ctl, *args], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


async def _celery() -> list[tuple[str, Measured]]:
    import celery  # type: ignore[import-untyped,import-not-found,unused-ignore]  # noqa: F401  (skipped if absent)

    return await asyncio.to_thread(_celery_runs)


def _celery_runs() -> list[tuple[str, Measured]]:
    from celery import Celery  # type: ignore[import-untyped,import-not-found,unused-ignore]

    name = f"lading_bench_{os.getpid()}_celery"
    measured: list[tuple[str, Measured]] = []
    with _broker_space(name) as (broker, isolation), tempfile.TemporaryDirectory(prefix="lading-compare-") as tmp:
        publisher = Celery("lading_compare_publisher", broker=broker)
        publisher.conf.update(task_serializer="json", broker_connection_retry_on_startup=True)
        try:
            for prefetch in CELERY_PREFETCH:
                fifo = pathlib.Path(tmp) / f"done-{prefetch}"
                os.mkfifo(fifo)
                with publisher.producer_or_acquire() as producer:
                    for _ in range(CELERY_TASKS):
                        publisher.send_task("compare.noop", queue=name, producer=producer)
                run = _celery_worker_run(broker, name, prefetch, fifo, pathlib.Path(tmp) / f"worker-{prefetch}.log")
                left = _queue_depth(publisher, name)
                if left != 0:
                    raise RuntimeError(f"Celery: {left} messages left in the queue after the worker stopped")
                measured.append(
                    (
                        f"celery_prefetch_{prefetch}",
                        dataclasses.replace(
                            run,
                            details={
                                **run.details,
                                "broker_isolation": isolation,
                                "prefetch_multiplier": prefetch,
                                "processes": CELERY_PROCESSES,
                            },
                        ),
                    )
                )
        finally:
            with contextlib.suppress(Exception):
                with publisher.connection_for_write() as connection:
                    connection.default_channel.queue_delete(name)
            publisher.close()
    return measured


def _queue_depth(app: Any, queue: str) -> int:
    with app.connection_for_write() as connection:
        _, messages, _ = connection.default_channel.queue_declare(queue=queue, passive=True)
        return int(messages)


def _celery_worker_run(broker: str, queue: str, prefetch: int, fifo: pathlib.Path, log: pathlib.Path) -> Measured:
    # The read end first (non-blocking), then our own write end so that the FIFO never reads EOF.
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    keeper = os.open(fifo, os.O_WRONLY)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(HACK), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        "LADING_COMPARE_BROKER": broker,
        "LADING_COMPARE_FIFO": str(fifo),
    }
    command = [
        sys.executable, "-m", "celery", "-A", "compare_peers.celery_app", "worker",
        "--pool", "prefork", "--concurrency", str(CELERY_PROCESSES), "--prefetch-multiplier", str(prefetch),
        "--queues", queue, "--without-gossip", "--without-mingle", "--without-heartbeat", "--loglevel", "WARNING",
        "--hostname", f"{queue}-{prefetch}@localhost",
    ]  # fmt: skip
    broker_pids = _pids_named("beam.smp")
    with log.open("w") as log_file:
        worker = subprocess.Popen(
            command, env=env, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True, cwd=HACK
        )
    try:
        first = last = 0.0
        cpu_first: dict[int, float] = {}
        broker_first: dict[int, float] = {}
        count = 0
        started = False
        deadline = time.monotonic() + CELERY_START_TIMEOUT_S + PART_TIMEOUT_S
        while count < CELERY_TASKS:
            if time.monotonic() > deadline:
                raise RuntimeError(f"Celery: only {count} of {CELERY_TASKS} tasks acknowledged in time")
            if worker.poll() is not None:
                raise RuntimeError(f"Celery worker exited with {worker.returncode}: {log.read_text()[-2000:]}")
            ready, _, _ = select.select([reader], [], [], 1.0)
            if not ready:
                continue
            chunk = os.read(reader, 65536)
            now = time.perf_counter()
            if not started and b"s" in chunk:  # the first task starts: the run starts
                started = True
                first = now
                cpu_first = _cpu_of(_process_tree(worker.pid))
                broker_first = _cpu_of(broker_pids)
            acknowledged = chunk.count(b".")
            if acknowledged:
                count += acknowledged
                last = now
        cpu_last = _cpu_of(_process_tree(worker.pid))
        broker_last = _cpu_of(broker_pids)
    finally:
        _stop(worker)
        os.close(keeper)
        os.close(reader)
    return Measured(
        label=f"Celery, prefork {CELERY_PROCESSES} processes, prefetch {prefetch}",
        jobs=count,
        seconds=last - first,
        worker_cpu_s=round(_cpu_delta(cpu_first, cpu_last), 3),
        postgres_cpu_s=None,
        broker_cpu_s=round(_cpu_delta(broker_first, broker_last), 3) if broker_first else None,
        details={"timing": "first task started to the last acknowledgement", "acks_late": True},
    )


def _stop(worker: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the worker's PID (warm shutdown: in-flight acks go out), then SIGKILL to its group."""
    if worker.poll() is None:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(worker.pid, signal.SIGKILL)  # its own session: the group is the pool it forked
    worker.wait(timeout=30)


# --------------------------------------------------------------------------------------------
# Raw asyncpg ceiling

CEILING_SETUP = """
DROP TABLE IF EXISTS compare_ceiling;
CREATE TABLE compare_ceiling (
    id          bigint PRIMARY KEY,
    state       text        NOT NULL DEFAULT 'ready',
    fence       bigint      NOT NULL DEFAULT 0,
    owner       text,
    finished_at timestamptz
);
CREATE INDEX compare_ceiling_ready ON compare_ceiling (id) WHERE state = 'ready';
"""

CEILING_CLAIM = """
UPDATE compare_ceiling j SET state = 'running', fence = j.fence + 1, owner = $1
  FROM (SELECT id FROM compare_ceiling WHERE state = 'ready' ORDER BY id LIMIT $2 FOR UPDATE SKIP LOCKED) c
 WHERE j.id = c.id
RETURNING j.id, j.fence
"""

CEILING_COMPLETE = """
UPDATE compare_ceiling j SET state = 'done', finished_at = clock_timestamp()
  FROM unnest($1::bigint[], $2::bigint[]) AS c(id, fence)
 WHERE j.id = c.id AND j.fence = c.fence AND j.state = 'running'
"""


async def _ceiling(url: str) -> list[tuple[str, Measured]]:
    conn = await dbpool.connect(url)
    loops = [await asyncpg.connect(url) for _ in range(CEILING_CONNECTIONS)]
    try:
        await conn.execute(CEILING_SETUP)
        await conn.execute("INSERT INTO compare_ceiling (id) SELECT generate_series(1, $1::bigint)", CEILING_JOBS)
        await conn.execute("ANALYZE compare_ceiling")
        postgres = PostgresCpu(conn)
        await postgres.start()
        cpu_before = _rusage_cpu_s()
        started = time.perf_counter()
        done = await asyncio.wait_for(
            asyncio.gather(*(_ceiling_loop(c, f"loop-{i}") for i, c in enumerate(loops))), PART_TIMEOUT_S
        )
        seconds = time.perf_counter() - started
        worker_cpu = _rusage_cpu_s() - cpu_before
        postgres_cpu = await postgres.stop()
        finished = await conn.fetchval("SELECT count(*) FROM compare_ceiling WHERE state = 'done'")
        if sum(done) != CEILING_JOBS or finished != CEILING_JOBS:
            raise RuntimeError(f"ceiling: {sum(done)} completed, {finished} done of {CEILING_JOBS}")
        await conn.execute("DROP TABLE compare_ceiling")
    finally:
        for loop_conn in loops:
            await loop_conn.close()
        await conn.close()
    measured = Measured(
        label=f"asyncpg ceiling, claim+complete {CEILING_BATCH} per round trip, {CEILING_CONNECTIONS} connections",
        jobs=CEILING_JOBS,
        seconds=seconds,
        worker_cpu_s=worker_cpu,
        postgres_cpu_s=postgres_cpu,
        details={"batch": CEILING_BATCH, "connections": CEILING_CONNECTIONS},
    )
    return [(CEILING, measured)]


async def _ceiling_loop(conn: asyncpg.Connection, owner: str) -> int:
    completed = 0
    while True:
        claimed = await conn.fetch(CEILING_CLAIM, owner, CEILING_BATCH)
        if not claimed:
            return completed
        status = await conn.execute(CEILING_COMPLETE, [r["id"] for r in claimed], [r["fence"] for r in claimed])
        completed += int(status.split()[-1])


# --------------------------------------------------------------------------------------------
# Acceptance vs a plain COPY: the `accept` scenario measures both (hack/bench.py uses these two)

COPY_SETUP = """
DROP TABLE IF EXISTS compare_copy_jobs, compare_copy_outbox;
CREATE TABLE compare_copy_jobs (LIKE extraction_jobs INCLUDING DEFAULTS INCLUDING GENERATED);
ALTER TABLE compare_copy_jobs ADD PRIMARY KEY (id);
CREATE TABLE compare_copy_outbox (LIKE outbox_events INCLUDING DEFAULTS INCLUDING GENERATED);
ALTER TABLE compare_copy_outbox ADD PRIMARY KEY (id);
"""
"""The tables a plain COPY of the job and outbox rows goes into: the same columns, only a primary key."""
OUTBOX_COLUMNS = ("event_id", "aggregate_type", "aggregate_id", "type", "payload")
"""The outbox columns that COPY fills (one `extraction.accepted.v1` row per job)."""
COPY_DOCUMENTS_SETUP = """
DROP TABLE IF EXISTS compare_documents_jobs, compare_documents_outbox, compare_documents;
CREATE TABLE compare_documents_jobs (LIKE compare_copy_jobs INCLUDING ALL);
CREATE TABLE compare_documents_outbox (LIKE compare_copy_outbox INCLUDING ALL);
CREATE TABLE compare_documents (LIKE job_documents INCLUDING DEFAULTS INCLUDING GENERATED);
ALTER TABLE compare_documents ADD PRIMARY KEY (job_id);
"""
"""A second reference, reported beside the target's (after COPY_SETUP): the same plain COPY plus each
job's document text, what acceptance also stores and the plain COPY does not, into tables of their
own (the target's tables grow as before) with only a primary key each."""
DOCUMENT_COLUMNS = ("job_id", "text", "bytes")


async def _accept_vs_copy(url: str) -> dict[str, Any]:
    """The `accept` scenario itself (its acceptances interleaved with the plain COPY of COPY_SETUP's
    tables), on emptied tables; what compare reports of it."""
    import bench

    conn = await dbpool.connect(url)
    try:
        await conn.execute(f"TRUNCATE {bench.DATA_TABLES} RESTART IDENTITY CASCADE")
    finally:
        await conn.close()
    accepted, _, _ = await bench.bench_accept(url)
    copy = accepted["plain_copy"]
    return {
        "documents": accepted["documents_per_batch"],
        "repetitions": accepted["repetitions"],
        "accept_jobs_per_s_median": accepted["jobs_per_s_median"],
        "copy_jobs_per_s_median": copy["jobs_per_s_median"],
        "ratio": round(accepted["accept_vs_copy"], 2),
        "ratio_by_cpu": accepted.get("accept_vs_copy_cpu"),
        "ratio_to_copy_with_documents": accepted.get("accept_vs_copy_with_documents"),
        "ratio_to_copy_with_documents_by_cpu": accepted.get("accept_vs_copy_with_documents_cpu"),
        "accept_ms_all": accepted["ms_per_batch_all"],
        "copy_ms_all": copy["ms_all"],
        "accept_cpu_ms_per_batch_median": accepted.get("cpu_ms_per_batch_median"),
        "copy_cpu_ms_per_batch_median": copy.get("cpu_ms_per_batch_median"),
        "copy": copy["what"],
    }
