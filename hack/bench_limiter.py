"""
The `limiter` benchmark (run through hack/bench.py): three in-process workers, 100 attempts in
flight each, against hack/stub_model.py enforcing the same limits as the pool.

    rpm-bound     requestsPerMinute binds: requests the stub admitted in a 60 s run (from its
                  first request), as a fraction of the limit, and the most it saw in any 60 s
    tpm-bound-cold  tokensPerMinute binds: tokens (as the provider counted them) in such a run,
                  as a fraction of the limit, and the stub's own most in any 60 s; the pool has
                  no recorded prompt estimate (its first minute ever: 3 characters per token)
    tpm-bound     the same, with the prompt estimate the pool's workers recorded in the phase
                  before (a pool's every later minute, and a restarted worker's first)
    drain-100ms   the time to drain N requests of 100 ms calls vs N / capacity, where capacity is
    drain-1s      min(RPM/60, TPM/(60 * tokens per job), concurrency / latency) requests/s, and
                  N the requests the stub answered (a job answered invalid is asked twice);
                  timed from the workers' start (their connection pools open), so start-up counts;
                  also where the slots went (`_slots`): slots in use while attempts waited, the
                  time from each release to the grant that refilled its slot, where a permit's
                  hold beyond the call went (grant to the request's arrival at the stub, the
                  stub's answer to the release), the CPU of the workers, the stub and the
                  workers' PostgreSQL backends, the calls and time of each limiter function
                  in the database (track_functions), and how late the workers' event loop
                  wakes a task that sleeps 10 ms (`loop_lag_*`); and the drain time, exactly, in parts
                  (`time_parts_s`, `_time_parts`): start-up, the calls themselves, the holds beyond
                  the calls, slots empty while attempts waited, while a retry was due but not claimed,
                  and while nothing was due (retries in their backoff), and the end;
                  `ratio_less_nothing_due` leaves that last idle part out

The stub counts tokens like a hosted API (`--accounting reserved`: prompt + max_tokens when a
request arrives, for the whole window, whatever the answer used). In the drain phases it
answers `--latency-ms` after the request arrived (`--latency-from-arrival`): its own parsing
and extraction are part of the model's latency, not added to it.
`LADING_BENCH_LIMITER_PHASES` (comma-separated) runs only some phases.

Targets: achieved/limit >= 0.97 and never above 1.0 (no 429 from the stub); drain within 5 %.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import json
import os
import pathlib
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import asyncpg

from lading import accepting
from lading.db import pool as dbpool
from lading.db import registry
from lading.ids import PoolName, TenantName
from lading.settings import ClaimerSettings, LeaseSettings, ReaperSettings, WorkerProcessSettings

STUB = pathlib.Path(__file__).resolve().parent / "stub_model.py"
TENANT = TenantName("bench")
POOL = PoolName("lading-system/limited")
WORKERS = 3
CONCURRENCY = 100
WINDOW_S = 60.0
LATENCY_MS = 100.0
PHASES = ("rpm-bound", "tpm-bound-cold", "tpm-bound", "drain-100ms", "drain-1s")
DRAINS = {"drain-100ms": (100.0, 16, 1600), "drain-1s": (1000.0, 16, 480)}
"""phase: (call latency in ms, maxConcurrency, jobs): about 10 s and 30 s of work at the formula."""
ONE_PROCESS, PROCESSES, FREE = "one-process", "processes", "free"
ARRANGEMENTS = (ONE_PROCESS, PROCESSES)
"""How the drain phases run the workers: in this process, on one event loop, or each in a process of
its own, as deployed (`LADING_BENCH_LIMITER_WORKERS`; both by default, reported side by side).
`free`, asked for by name only, runs them in this process with the limiter replaced by one in-memory
semaphore of maxConcurrency permits (`_free_permits`): what the drain takes on this machine when a
permit costs nothing, the floor any limiter work can reach."""
HERE = pathlib.Path(__file__).resolve()
ROOT = HERE.parent.parent
TARGET_FRACTION = 0.97
TARGET_DRAIN_ERROR = 0.05


STUB_PIDS: dict[str, int] = {}
"""The stub process serving each URL (for its CPU time)."""


@contextlib.asynccontextmanager
async def stub(*args: str) -> AsyncIterator[str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable, str(STUB), "--port", "0", *args, stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        line = (await asyncio.wait_for(process.stdout.readline(), 30)).decode().strip()
        url = line.removeprefix("listening on ")
        STUB_PIDS[url] = process.pid
        yield url
    finally:
        if process.returncode is None:
            process.kill()
        await process.wait()


def stub_stats(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url.removesuffix("/v1") + "/admin/stats", timeout=10) as response:
        stats: dict[str, Any] = json.load(response)
        return stats


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) process `pid` has used so far (Linux /proc)."""
    try:
        fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def texts(count: int) -> list[str]:
    from lading_demo import generator

    return [s.text for s in generator.generate(count, seed=11)]


async def _prepare(conn: asyncpg.Connection, *, url: str, rpm: int, tpm: int, concurrency: int, jobs: int,
                   forget_estimates: bool = False) -> None:
    await conn.execute("TRUNCATE extraction_jobs, job_documents, job_attempts, results, outbox_events, batches, "
                       "limiter_permits, limiter_seconds RESTART IDENTITY CASCADE")
    if forget_estimates:
        await conn.execute("TRUNCATE limiter_estimates")
    await registry.upsert_pool(
        conn, name=POOL, provider="openai-compatible", model="stub-model",
        spec={"endpoint": {"url": url},
              "limits": {"requestsPerMinute": rpm, "tokensPerMinute": tpm, "maxConcurrency": concurrency}},
    )  # fmt: skip
    documents = [accepting.DocumentInput(key=f"doc-{i:06d}", text=t) for i, t in enumerate(texts(jobs))]
    await accepting.accept_batch(conn, accepting.BatchRequest(
        tenant=TENANT, namespace=TENANT, name=f"limiter-{time.monotonic_ns()}", uid=f"uid-{time.monotonic_ns()}",
        schema="invoice.v1", pool=POOL, model_policy={"pool": POOL}, validation_policy="invoice-strict-v1",
        priority="normal", deadline_s=3600, max_attempts=20, documents=documents,
    ))  # fmt: skip


def _settings() -> WorkerProcessSettings:
    return WorkerProcessSettings(
        pool=POOL,
        claimer=ClaimerSettings(concurrency=CONCURRENCY, batch_size=50, poll_interval_s=0.1),
        lease=LeaseSettings(),
        reaper=ReaperSettings(),
    )


async def _worker_pool(url: str) -> asyncpg.Pool:
    """Sized and configured like `running.serve`'s (no reset query when a connection goes back)."""
    return await dbpool.create_pool(url, min_size=2, max_size=8, reset_sessions=False)


@contextlib.asynccontextmanager
async def workers(url: str, *, arrangement: str = ONE_PROCESS) -> AsyncIterator[Workers]:
    """`WORKERS` workers with their connection pools open; they start when the body begins."""
    if arrangement == PROCESSES:
        async with _worker_processes(url) as started:
            yield started
        return
    from lading_worker import running

    pools = [await _worker_pool(url) for _ in range(WORKERS)]
    stop = asyncio.Event()
    lags: list[float] = []
    lagging = asyncio.create_task(_loop_lag(lags))
    tasks = [asyncio.create_task(running.Worker(p, settings=_settings()).run(stop)) for p in pools]
    started = Workers(cpu_s=time.process_time, lags=lambda: _lag_summary(lags))
    try:
        yield started
    finally:
        lagging.cancel()
        stop.set()
        await asyncio.wait(tasks, timeout=30)
        for p in pools:
            await p.close()


@dataclasses.dataclass
class Workers:
    cpu_s: Callable[[], float]
    """CPU seconds the workers used so far (with the bench process itself, when they run in it)."""
    lags: Callable[[], dict[str, float | None]]
    """How late the workers' event loop(s) woke a task sleeping 10 ms (`_lag_summary`)."""


@contextlib.asynccontextmanager
async def _worker_processes(url: str) -> AsyncIterator[Workers]:
    """`WORKERS` worker processes (each one event loop, as deployed: separate processes or pods),
    started together once all have their connection pool open (`worker_main`)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(ROOT / d) for d in ("", "api", "worker", "cli"))}
    children = [
        await asyncio.create_subprocess_exec(
            sys.executable, str(HERE), "--worker", url, env=env,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        )
        for _ in range(WORKERS)
    ]  # fmt: skip
    reports: list[dict[str, Any]] = []
    try:
        for child in children:
            assert child.stdout is not None
            line = await asyncio.wait_for(child.stdout.readline(), 60)
            if line.strip() != b"ready":
                raise RuntimeError(f"a worker process did not start: {line!r}")
        for child in children:
            assert child.stdin is not None
            child.stdin.write(b"go\n")
        await asyncio.gather(*(c.stdin.drain() for c in children if c.stdin is not None))

        def lags() -> dict[str, float | None]:
            if not reports:
                return {"loop_lag_mean_ms": None, "loop_lag_p90_ms": None}
            return {key: round(sum(r[key] or 0.0 for r in reports) / len(reports), 2)
                    for key in ("loop_lag_mean_ms", "loop_lag_p90_ms")}

        yield Workers(cpu_s=lambda: sum(cpu_s(c.pid) for c in children), lags=lags)
        for child in children:
            assert child.stdin is not None
            child.stdin.write(b"stop\n")
        for child in children:
            assert child.stdout is not None
            line = await asyncio.wait_for(child.stdout.readline(), 60)
            reports.append(json.loads(line))
    finally:
        for child in children:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(child.wait(), 30)
            if child.returncode is None:
                child.kill()
                await child.wait()


async def _worker_process(url: str) -> None:
    """One worker process of `_worker_processes`: opens its pool, says `ready`, runs from `go` to
    `stop` (stdin), then prints how late its event loop woke a task (JSON) and closes."""
    from lading_worker import running

    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    db = await _worker_pool(url)
    try:
        print("ready", flush=True)
        if (await reader.readline()).strip() != b"go":
            return
        stop = asyncio.Event()
        lags: list[float] = []
        lagging = asyncio.create_task(_loop_lag(lags))
        task = asyncio.create_task(running.Worker(db, settings=_settings()).run(stop))
        await reader.readline()  # stop (or the parent is gone)
        lagging.cancel()
        print(json.dumps(_lag_summary(lags)), flush=True)
        stop.set()
        await asyncio.wait([task], timeout=30)
    finally:
        await db.close()


async def _window(conn: asyncpg.Connection, url: str, stub_url: str, *, rpm: int, tpm: int, concurrency: int,
                  jobs: int, forget_estimates: bool = False) -> dict[str, Any]:
    await _prepare(conn, url=stub_url, rpm=rpm, tpm=tpm, concurrency=concurrency, jobs=jobs,
                   forget_estimates=forget_estimates)
    factors = dict(await conn.fetch("SELECT schema, factor FROM limiter_estimates"))
    async with workers(url):
        await asyncio.sleep(WINDOW_S + 5)  # a timed measurement window, not a race
    stats = stub_stats(stub_url)
    learned = dict(await conn.fetch("SELECT schema, factor FROM limiter_estimates"))
    # What the limiter counted for the permits of its own first 60 s, against what the stub counted.
    counted = await conn.fetchrow(
        "SELECT count(*) AS permits, sum(coalesce(tokens_used, tokens_reserved))::bigint AS tokens FROM limiter_permits"
        " WHERE acquired_at < (SELECT min(acquired_at) FROM limiter_permits) + interval '60 seconds'"
    )
    # The run: the first 60 s from the first request the server admitted.
    window_start = min(t for t, _ in stats["admitted"])
    admitted = [(t, n) for t, n in stats["admitted"] if window_start <= t < window_start + WINDOW_S]
    return {
        "requests_in_window": len(admitted), "tokens_in_window": sum(n for _, n in admitted),
        "max_requests_any_60s": stats["max_window_requests"], "max_tokens_any_60s": stats["max_window_tokens"],
        "stub_429s": stats["statuses"].get("429", 0), "max_concurrent": stats["max_concurrent"],
        "prompt_factor_at_start": factors, "prompt_factor_recorded": learned,
        "limiter_permits_first_60s": counted["permits"], "limiter_tokens_first_60s": counted["tokens"],
    }


async def _drain(conn: asyncpg.Connection, url: str, *, latency_ms: float, concurrency: int, jobs: int,
                 arrangement: str = ONE_PROCESS, rpm: int = 1_000_000, tpm: int = 1_000_000_000) -> dict[str, Any]:
    if arrangement == FREE:
        return await _drain_free(conn, url, latency_ms=latency_ms, concurrency=concurrency, jobs=jobs)
    async with stub("--latency-ms", str(latency_ms), "--concurrency", str(concurrency), "--accounting", "reserved",
                    "--rpm", str(rpm), "--tpm", str(tpm), "--latency-from-arrival") as stub_url:
        await _prepare(conn, url=stub_url, rpm=rpm, tpm=tpm, concurrency=concurrency, jobs=jobs)
        await _track_functions(conn)
        async with workers(url, arrangement=arrangement) as started_workers:
            stub_cpu, own_cpu = cpu_s(STUB_PIDS[stub_url]), started_workers.cpu_s()
            started, started_wall = time.perf_counter(), time.time()
            drained_s = await _drained(conn) - started
            stub_cpu, own_cpu = cpu_s(STUB_PIDS[stub_url]) - stub_cpu, started_workers.cpu_s() - own_cpu
            # The workers' backends, opened with their connection pools: PostgreSQL's CPU for the run.
            backends = await conn.fetch(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                " AND backend_type = 'client backend' AND pid <> pg_backend_pid()"
            )
            db_cpu = sum(cpu_s(b["pid"]) for b in backends)
        lag = started_workers.lags()  # the processes report theirs when they stop
        stats = stub_stats(stub_url)
        functions = await _function_times(conn)
        first = await conn.fetchrow(
            "SELECT extract(epoch FROM (SELECT min(started_at) FROM job_attempts))::float8 AS claim, "
            "       extract(epoch FROM (SELECT min(acquired_at) FROM limiter_permits))::float8 AS grant"
        )
        slots = await _slots(conn, concurrency=concurrency)
        parts = await _time_parts(conn, concurrency=concurrency, latency_s=latency_ms / 1000,
                                  started_at=started_wall, drained_at=started_wall + drained_s)
        holds = await conn.fetchrow(
            f"SELECT avg(extract(epoch FROM released_at - s.slot_at))::float8 AS hold,"
            f"       sum(extract(epoch FROM released_at - s.slot_at))::float8 AS held,"
            f"       avg(extract(epoch FROM s.slot_at))::float8 AS granted_at,"
            f"       avg(extract(epoch FROM released_at))::float8 AS released_at,"
            f"       extract(epoch FROM max(released_at) - min(s.slot_at))::float8 AS span"
            f"  FROM ({SLOT_PERMITS}) s"
        )
    requests = len(stats["admitted"])
    tokens_per_job = sum(n for _, n in stats["admitted"]) / max(1, requests)
    capacity = min(rpm / 60, tpm / (60 * tokens_per_job), concurrency / (latency_ms / 1000))
    expected_s = requests / capacity
    return {"jobs": jobs, "requests": requests, "concurrency": concurrency, "latency_ms": latency_ms,
            "seconds": round(drained_s, 2), "formula_s": round(expected_s, 2),
            "ratio": round(drained_s / expected_s, 4), "ratio_per_job": round(drained_s / (jobs / capacity), 4),
            "first_claim_s": round(first["claim"] - started_wall, 3),
            "first_grant_s": round(first["grant"] - started_wall, 3),
            "permit_held_ms": round(holds["hold"] * 1000, 1),
            **_hold_parts(holds, stats["admitted"], latency_ms=latency_ms),
            "mean_in_flight": round(holds["held"] / holds["span"], 2),
            "time_parts_s": parts,
            "ratio_less_nothing_due": round((drained_s - parts.get("idle_nothing_due", 0.0)) / expected_s, 4),
            **slots,
            "workers": arrangement,
            "cpu_s": {"workers" if arrangement == PROCESSES else "workers_and_bench": round(own_cpu, 2),
                      "stub": round(stub_cpu, 2), "postgres_backends": round(db_cpu, 2)},
            "limiter_functions": functions,
            **lag,
            "stub_answer_late_ms": stats.get("answer_late_mean_ms"),
            "stub_429s": stats["statuses"].get("429", 0), "max_concurrent": stats["max_concurrent"]}


async def _drained(conn: asyncpg.Connection) -> float:
    """Wait until no job is left to run (polled every 50 ms); when that was seen (`time.perf_counter`)."""
    while True:
        left = await conn.fetchval(
            "SELECT count(*) FROM extraction_jobs WHERE state IN ('READY', 'RUNNING', 'RETRY_SCHEDULED')"
        )
        if left == 0:
            return time.perf_counter()
        await asyncio.sleep(0.05)


async def _drain_free(conn: asyncpg.Connection, url: str, *, latency_ms: float, concurrency: int,
                      jobs: int) -> dict[str, Any]:
    """The drain with the workers in this process and no limiter: `concurrency` in-memory permits."""
    async with stub("--latency-ms", str(latency_ms), "--concurrency", str(concurrency), "--accounting", "reserved",
                    "--latency-from-arrival") as stub_url:
        await _prepare(conn, url=stub_url, rpm=1_000_000, tpm=1_000_000_000, concurrency=concurrency, jobs=jobs)
        with _free_permits(concurrency):
            async with workers(url) as started_workers:
                started = time.perf_counter()
                drained_s = await _drained(conn) - started
        stats = stub_stats(stub_url)
    requests = len(stats["admitted"])
    expected_s = requests / (concurrency / (latency_ms / 1000))
    return {"jobs": jobs, "requests": requests, "concurrency": concurrency, "latency_ms": latency_ms,
            "seconds": round(drained_s, 2), "formula_s": round(expected_s, 2),
            "ratio": round(drained_s / expected_s, 4), "workers": FREE, **started_workers.lags(),
            "stub_answer_late_ms": stats.get("answer_late_mean_ms"),
            "stub_429s": stats["statuses"].get("429", 0), "max_concurrent": stats["max_concurrent"]}


@contextlib.contextmanager
def _free_permits(concurrency: int) -> Iterator[None]:
    """Every `PoolLimiter` of this process acquires and releases permits of one in-memory semaphore."""
    from lading import limiting

    semaphore = asyncio.Semaphore(concurrency)
    ids = itertools.count(1)

    async def acquire(_self: limiting.PoolLimiter, *, job_id: object, fence: int, tokens: int) -> limiting.Permit:
        await semaphore.acquire()
        return limiting.Permit(id=next(ids), tokens_reserved=tokens)

    async def release(_self: limiting.PoolLimiter, permit: limiting.Permit, *, tokens_used: int | None) -> None:
        semaphore.release()

    saved = limiting.PoolLimiter.acquire, limiting.PoolLimiter.release
    limiting.PoolLimiter.acquire, limiting.PoolLimiter.release = acquire, release  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        limiting.PoolLimiter.acquire, limiting.PoolLimiter.release = saved  # type: ignore[method-assign]


async def _loop_lag(lags: list[float], *, every_s: float = 0.01) -> None:
    """How late the workers' event loop (one loop for the three workers and this bench) wakes a
    task that sleeps `every_s`: the wait any ready callback, a permit's hand-over included, has."""
    while True:
        before = time.perf_counter()
        await asyncio.sleep(every_s)
        lags.append(time.perf_counter() - before - every_s)


def _lag_summary(lags: list[float]) -> dict[str, float | None]:
    if not lags:
        return {"loop_lag_mean_ms": None, "loop_lag_p90_ms": None}
    ordered = sorted(lags)
    return {"loop_lag_mean_ms": round(sum(ordered) / len(ordered) * 1000, 2),
            "loop_lag_p90_ms": round(ordered[int(len(ordered) * 0.9)] * 1000, 2)}


def _hold_parts(holds: asyncpg.Record, admitted: list[tuple[float, int]], *, latency_ms: float) -> dict[str, float]:
    """Where a permit's hold beyond the call went, on average over the run (every permit is one
    request the stub admitted): from the grant to the request's arrival at the stub (the permit's
    way to the attempt, the worker's note of its reservation, the HTTP request), and from the
    stub's answer (arrival + latency) to the release (the answer's way back, its parsing, the
    release's wait for a connection and the pool's lock)."""
    arrival = sum(t for t, _ in admitted) / max(1, len(admitted))
    return {"grant_to_arrival_ms": round((arrival - holds["granted_at"]) * 1000, 1),
            "answer_to_release_ms": round((holds["released_at"] - arrival) * 1000 - latency_ms, 1)}


TIME_PARTS_SQL = """
SELECT extract(epoch FROM p.acquired_at)::float8 AS granted, extract(epoch FROM p.released_at)::float8 AS released,
       extract(epoch FROM a.started_at)::float8 AS claimed,
       CASE WHEN a.attempt > 1 AND a.attempt = j.attempt THEN extract(epoch FROM j.available_at)::float8 END AS due
  FROM limiter_permits p
  JOIN job_attempts a ON a.job_id = p.job_id AND a.fence = p.fence
  JOIN extraction_jobs j ON j.id = p.job_id
"""


async def _time_parts(conn: asyncpg.Connection, *, concurrency: int, latency_s: float, started_at: float,
                      drained_at: float) -> dict[str, float]:
    """The drain time, exactly, in parts (seconds; they add up to it):

        start               from the workers' start to the first grant
        calls               permits x latency / concurrency: the formula when concurrency binds
        hold_beyond_call    each permit's hold beyond the call's latency, / concurrency
        idle_while_waiting  the pool's empty slots (as a fraction of all) while an attempt waited for a permit
        idle_due_unclaimed  ... while none waited, but a retry was due and not yet claimed
        idle_nothing_due    ... while none waited and nothing was due (retries in their backoff)
        end                 from the last release to the bench seeing every job finished

    An attempt waits from its claim (job_attempts.started_at) to its grant; a retry is due at the
    job's available_at, as set by the failed attempt before it."""
    rows = await conn.fetch(TIME_PARTS_SQL)
    if not rows:
        return {}
    events: list[tuple[float, int, int, int]] = []  # (time, in use, waiting, due unclaimed) changes
    for r in rows:
        events += [(r["granted"], 1, -1, 0), (r["released"], -1, 0, 0), (r["claimed"], 0, 1, 0)]
        if r["due"] is not None and r["due"] < r["claimed"]:
            events += [(r["due"], 0, 0, 1), (r["claimed"], 0, 0, -1)]
    events.sort()
    first, last = min(r["granted"] for r in rows), max(r["released"] for r in rows)
    idle = {"idle_while_waiting": 0.0, "idle_due_unclaimed": 0.0, "idle_nothing_due": 0.0}
    in_use = waiting = due = 0
    at = first
    for t, d_use, d_wait, d_due in events:
        if t > at and first <= at < last:
            span = (min(t, last) - at) * (concurrency - in_use) / concurrency
            key = "idle_while_waiting" if waiting > 0 else "idle_due_unclaimed" if due > 0 else "idle_nothing_due"
            idle[key] += span
        at = max(at, t)
        in_use, waiting, due = in_use + d_use, waiting + d_wait, due + d_due
    held = sum(r["released"] - r["granted"] for r in rows)
    parts = {"start": first - started_at, "calls": len(rows) * latency_s / concurrency,
             "hold_beyond_call": (held - len(rows) * latency_s) / concurrency, **idle, "end": drained_at - last}
    return {k: round(v, 3) for k, v in parts.items()}


async def _track_functions(conn: asyncpg.Connection) -> None:
    """Count the database functions' calls and time from here on (the workers' connections, opened
    next, take the setting; their statistics are flushed when they close)."""
    database = await conn.fetchval("SELECT current_database()")
    await conn.execute(f'ALTER DATABASE "{database}" SET track_functions = \'all\'')
    await conn.execute("SELECT pg_stat_reset()")


async def _function_times(conn: asyncpg.Connection) -> dict[str, Any]:
    """The limiter's functions: calls, and ms spent in each (total: nested calls included; self:
    not), as PostgreSQL counted them (wall time inside the backend, lock waits included)."""
    await conn.execute("SELECT pg_stat_clear_snapshot()")
    rows = await conn.fetch(
        "SELECT funcname, calls, total_time, self_time FROM pg_stat_user_functions"
        " WHERE funcname LIKE 'lading_limiter%' ORDER BY total_time DESC"
    )
    return {r["funcname"].removeprefix("lading_limiter_"): {
        "calls": r["calls"], "total_ms": round(r["total_time"]), "self_ms": round(r["self_time"])} for r in rows}


SLOT_PERMITS = """
SELECT p.*, p.acquired_at AS slot_at
  FROM limiter_permits p
"""
"""The permits, each with when it took its slot (`slot_at`): when it was granted."""

SLOTS_SQL = f"""
WITH grants AS (
    SELECT slot_at AS a, row_number() OVER (ORDER BY slot_at, id) AS n FROM ({SLOT_PERMITS}) s
), releases AS (
    SELECT released_at AS r, row_number() OVER (ORDER BY released_at, id) AS n
      FROM ({SLOT_PERMITS}) s WHERE released_at IS NOT NULL
), gaps AS (
    SELECT extract(epoch FROM g.a - r.r)::float8 AS g FROM releases r JOIN grants g ON g.n = r.n + $1
)
SELECT (SELECT count(*) FROM grants) AS permits,
       (SELECT extract(epoch FROM max(a) - min(a))::float8 FROM grants) AS busy_s,
       (SELECT extract(epoch FROM max(r) - max(a))::float8 FROM releases, grants) AS tail_s,
       (SELECT extract(epoch FROM (SELECT a FROM grants WHERE n = $1) - min(a))::float8 FROM grants) AS full_after_s,
       count(*) AS refills,
       count(*) FILTER (WHERE g < 0.001) AS in_release,
       sum(g) AS empty_slot_s,
       avg(g) AS gap_mean_s,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY g) FILTER (WHERE g >= 0.001) AS other_gap_p50_s,
       percentile_cont(0.9) WITHIN GROUP (ORDER BY g) FILTER (WHERE g >= 0.001) AS other_gap_p90_s
  FROM gaps
"""


async def _slots(conn: asyncpg.Connection, *, concurrency: int) -> dict[str, Any]:
    """Where the slots went, from the permits. With every slot in use from the first grants on, the
    grant that refills the slot of the i-th release is the (i + concurrency)-th: the time between
    them is the slot standing empty (under 1 ms: granted in the release's own transaction). Also:
    the slots in use between the first and the last grant (attempts were waiting throughout), how
    long after the first grant every slot was in use, and the tail from the last grant to the last
    release."""
    row = await conn.fetchrow(SLOTS_SQL, concurrency)
    assert row is not None

    def ms(value: float | None) -> float | None:
        return None if value is None else round(value * 1000, 2)

    busy_s, empty_s = row["busy_s"] or 0.0, row["empty_slot_s"] or 0.0
    return {"busy_in_flight": round(concurrency - empty_s / busy_s, 2) if busy_s else None,
            "tail_ms": ms(row["tail_s"]), "all_slots_in_use_after_ms": ms(row["full_after_s"]),
            "permits": row["permits"], "refills": row["refills"], "refilled_in_release": row["in_release"],
            "release_to_grant_mean_ms": ms(row["gap_mean_s"]),
            "release_to_grant_other_p50_ms": ms(row["other_gap_p50_s"]),
            "release_to_grant_other_p90_ms": ms(row["other_gap_p90_s"])}


async def bench_limiter(url: str) -> tuple[dict[str, Any], dict[str, Any], bool]:
    phases = [p for p in os.environ.get("LADING_BENCH_LIMITER_PHASES", ",".join(PHASES)).split(",") if p]
    arrangements = [a for a in os.environ.get("LADING_BENCH_LIMITER_WORKERS", ",".join(ARRANGEMENTS)).split(",") if a]
    results: dict[str, Any] = {}
    conn = await dbpool.connect(url)
    try:
        if "rpm-bound" in phases:
            rpm = 1200
            async with stub("--latency-ms", str(LATENCY_MS), "--rpm", str(rpm), "--accounting", "reserved") as s_url:
                found = await _window(conn, url, s_url, rpm=rpm, tpm=1_000_000_000, concurrency=64, jobs=4000)
            results["rpm_bound"] = {**found, "limit": rpm, "fraction": round(found["requests_in_window"] / rpm, 4),
                                    "max_fraction": round(found["max_requests_any_60s"] / rpm, 4)}
        for phase in ("tpm-bound-cold", "tpm-bound"):
            if phase not in phases:
                continue
            tpm = 200_000
            async with stub("--latency-ms", str(LATENCY_MS), "--tpm", str(tpm), "--accounting", "reserved") as s_url:
                found = await _window(conn, url, s_url, rpm=1_000_000, tpm=tpm, concurrency=64, jobs=2000,
                                      forget_estimates=phase == "tpm-bound-cold")
            results[phase.replace("-", "_")] = {
                **found, "limit": tpm, "fraction": round(found["tokens_in_window"] / tpm, 4),
                "max_fraction": round(found["max_tokens_any_60s"] / tpm, 4),
            }
        for phase, (latency_ms, concurrency, jobs) in DRAINS.items():
            if phase not in phases:
                continue
            for arrangement in arrangements:
                suffix = {PROCESSES: "_processes", FREE: "_free"}.get(arrangement, "")
                results[phase.replace("-", "_") + suffix] = await _drain(
                    conn, url, latency_ms=latency_ms, concurrency=concurrency, jobs=jobs, arrangement=arrangement
                )
    finally:
        await conn.close()
    targets = {"fraction_min": TARGET_FRACTION, "fraction_max": 1.0, "drain_error_max": TARGET_DRAIN_ERROR}
    # A pool's first minute ever reserves at the conservative default: it must not overshoot, and
    # the fraction target applies from the recorded estimate on.
    passed = all(
        (r["fraction"] >= (0.0 if name == "tpm_bound_cold" else TARGET_FRACTION)
         and r["max_fraction"] <= 1.0 and r["stub_429s"] == 0)
        if "fraction" in r else abs(r["ratio"] - 1) <= TARGET_DRAIN_ERROR
        for name, r in results.items()
    )
    return results, targets, passed


if __name__ == "__main__" and sys.argv[1:2] == ["--worker"]:
    asyncio.run(_worker_process(sys.argv[2]))
