"""
The scenarios (docs/reliability.md maps each to ../RELIABILITY.md's IDs) and the profiles.

A scenario submits its batches through the Kubernetes emulator (the operator admits them), runs
its faults while the system works, undoes them, waits for the drain (every job terminal, every
delivery settled, every event published), then reads the final state. Faults are drawn from a
`random.Random` seeded with the run's seed and the scenario's name: the same seed injects the
same faults at the same moments, relative to the scenario's start.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg

from hack.reliability import cluster as cluster_
from hack.reliability import history as history_
from hack.reliability import nemesis

FAILPOINTS_ENV = "LADING_FAILPOINTS"
"""lading/failpoints.py's variable: a process started with it crashes at the named point."""
INLINE_BYTES_MAX = 480 * 1024
"""Inline texts per ExtractionBatch, under the CRD's 512 KiB: larger runs are split into batches."""


@dataclasses.dataclass
class Context:
    cluster: cluster_.Cluster
    history: history_.History
    rng: random.Random
    documents: list[tuple[str, str]]

    async def submit(
            self, name: str, documents: list[tuple[str, str]], *, deadline_s: int = 3600, suspend: bool = False
    ) -> list[str]:
        """Create one or more ExtractionBatches for `documents`; their names."""
        names: list[str] = []
        chunk: list[tuple[str, str]] = []
        size = 0
        for key, text in documents:
            if chunk and (size + len(text.encode()) > INLINE_BYTES_MAX or len(chunk) >= 1000):
                names.append(await self._create(f"{name}-{len(names)}", chunk, deadline_s, suspend))
                chunk, size = [], 0
            chunk.append((key, text))
            size += len(text.encode())
        if chunk:
            names.append(await self._create(f"{name}-{len(names)}", chunk, deadline_s, suspend))
        return names

    async def _create(self, name: str, documents: list[tuple[str, str]], deadline_s: int, suspend: bool) -> str:
        self.history.submitted[name] = [k for k, _ in documents]
        await self.cluster.create_batch(name, documents, deadline_s=deadline_s, suspend=suspend)
        return name


Body = Callable[[Context], Awaitable[None]]


@dataclasses.dataclass(frozen=True)
class Scenario:
    name: str
    covers: str
    """../RELIABILITY.md IDs this scenario injects (or the closest real fault for)."""
    fault: str
    """What is injected, in words (the table's column)."""
    documents: int
    body: Body
    drain_s: float = 120.0


# --- Scenario bodies.


async def _until_started(
        ctx: Context, *, running: int = 1, timeout_s: float = 60.0, batches: list[str] | None = None
) -> None:
    """Wait until the scenario's jobs (of `batches`, default all) are being worked on (so faults land mid-work)."""
    deadline = time.monotonic() + timeout_s
    conn = await asyncpg.connect(ctx.cluster.database_url)
    try:
        while time.monotonic() < deadline:
            count = await conn.fetchval(
                "SELECT count(*) FROM job_attempts a JOIN extraction_jobs j ON j.id = a.job_id"
                "  JOIN batches b ON b.id = j.batch_id WHERE b.name = ANY($1::text[])",
                batches if batches is not None else list(ctx.history.submitted),
            )
            if count >= running:
                return
            await asyncio.sleep(0.1)
    finally:
        await conn.close()


async def baseline(ctx: Context) -> None:
    await ctx.submit("baseline", ctx.documents)


async def _with_random(ctx: Context, kinds: tuple[str, ...], *, seconds: float, every_s: tuple[float, float]) -> None:
    await ctx.submit(ctx.history.scenario, ctx.documents)
    await _until_started(ctx)
    stop = asyncio.Event()
    task = asyncio.create_task(nemesis.random_faults(ctx.cluster, ctx.history, ctx.rng, kinds=kinds, stop=stop,
                                                     every_s=every_s))  # fmt: skip
    await asyncio.sleep(seconds)
    stop.set()
    await task


async def worker_kills(ctx: Context) -> None:
    await _with_random(ctx, ("kill-worker",), seconds=12, every_s=(1.0, 3.0))


async def worker_stops(ctx: Context) -> None:
    await ctx.submit(ctx.history.scenario, ctx.documents)
    await _until_started(ctx, running=3)
    lease = ctx.cluster.timing.lease_ttl_s
    for _ in range(2):
        worker = f"worker-{ctx.rng.randrange(cluster_.WORKERS)}"
        await nemesis.pause(ctx.cluster, ctx.history, worker, for_s=lease * ctx.rng.uniform(1.5, 2.5))
        await asyncio.sleep(ctx.rng.uniform(0.5, 1.5))


async def worker_db_cut(ctx: Context) -> None:
    await ctx.submit(ctx.history.scenario, ctx.documents)
    await _until_started(ctx, running=3)
    worker = f"worker-{ctx.rng.randrange(cluster_.WORKERS)}"
    lease = ctx.cluster.timing.lease_ttl_s
    await nemesis.leg(ctx.cluster, ctx.history, f"pg-{worker}", "stall", for_s=lease * 2, worker=worker)


async def relay_and_broker(ctx: Context) -> None:
    await _with_random(ctx, ("kill-relay", "stop-relay", "cut-amqp", "stall-amqp"), seconds=12, every_s=(0.5, 2.0))


async def postgres_restart(ctx: Context) -> None:
    await ctx.submit(ctx.history.scenario, ctx.documents)
    await _until_started(ctx, running=5)
    await nemesis.postgres_restart(ctx.cluster, ctx.history, down_s=ctx.rng.uniform(1.0, 3.0))


async def model_429_storm(ctx: Context) -> None:
    await ctx.submit(ctx.history.scenario, ctx.documents)
    await _until_started(ctx, running=3)
    await nemesis.model_storm(ctx.cluster, ctx.history, count=ctx.rng.randint(8, 15), retry_after=2)


async def model_faults(ctx: Context) -> None:
    await ctx.submit(ctx.history.scenario, ctx.documents)
    await _until_started(ctx, running=3)
    await nemesis.model_hang(ctx.cluster, ctx.history, count=3)
    for mode in ("stall_after_headers", "reset_mid_body", "slow", "reset"):
        await nemesis.leg(ctx.cluster, ctx.history, "model", mode, for_s=ctx.rng.uniform(1.0, 2.5), delay_s=0.3)
        await asyncio.sleep(ctx.rng.uniform(0.3, 1.0))


async def erp_faults(ctx: Context) -> None:
    await ctx.submit(ctx.history.scenario, ctx.documents)
    await _until_started(ctx, running=3)
    for mode in ("drop_replies", "reset_mid_body", "stall", "drop_replies"):
        await nemesis.leg(ctx.cluster, ctx.history, "erp", mode, for_s=ctx.rng.uniform(1.0, 2.5))
        await asyncio.sleep(ctx.rng.uniform(0.3, 1.0))
    await nemesis.kill(ctx.cluster, ctx.history, "receiver", down_s=1.0)


async def clock_step(ctx: Context) -> None:
    await ctx.submit(ctx.history.scenario, ctx.documents)
    await _until_started(ctx, running=3)
    await nemesis.clock_step(ctx.cluster, ctx.history, offset_s=600, for_s=6)
    await nemesis.clock_step(ctx.cluster, ctx.history, offset_s=-600, for_s=6)


async def operator_admission(ctx: Context) -> None:
    """The operator SIGKILLed at seeded moments while it admits three batches; restarted each time."""
    half = len(ctx.documents) // 3
    parts = [ctx.documents[:half], ctx.documents[half:2 * half], ctx.documents[2 * half:]]
    for i, part in enumerate(parts):
        await ctx.submit(f"{ctx.history.scenario}-{i}", part)
        await asyncio.sleep(ctx.rng.uniform(0.0, 0.3))
        await nemesis.kill(ctx.cluster, ctx.history, "operator", down_s=ctx.rng.uniform(0.2, 1.0))


DELETION_FAILPOINT = "operator.batch_deleted.after_cancel"
"""In the operator's deletion handler: the batch's jobs are cancelled and committed, the finalizer
is still on the object (operator/lading_operator/batches.py)."""


async def operator_deletion(ctx: Context) -> None:
    """A running batch deleted, and `lading operator` killed inside its deletion handler (a failpoint,
    right after the cancellation committed and before the finalizer is removed); restarted without
    the failpoint, it must finish the deletion: nothing cancelled twice, the object gone."""
    c, h = ctx.cluster, ctx.history
    operator = c.processes["operator"]
    operator.env[FAILPOINTS_ENV] = f"{DELETION_FAILPOINT}=kill"
    await operator.terminate()
    await operator.start()
    third = len(ctx.documents) // 3
    [name] = await ctx.submit(f"{h.scenario}-deleted", ctx.documents[third:])
    await ctx.submit(f"{h.scenario}-kept", ctx.documents[:third])
    await _until_started(ctx, running=8, batches=[name])
    # A slow model, so attempts are in flight when the deletion cancels them.
    slow = asyncio.create_task(nemesis.leg(c, h, "model", "slow", for_s=6.0, delay_s=0.3))
    await asyncio.sleep(ctx.rng.uniform(0.3, 1.0))
    h.expect.update(cancelled_batches=[name], failpoint_kills=1)
    pid = operator.pid
    await c.delete_batch(name)
    h.deleted_batches.append(name)
    if await _until(lambda: not operator.running, timeout_s=30):
        h.kills.append({"kind": "operator", "name": "operator", "pid": pid, "signal": f"failpoint {DELETION_FAILPOINT}",
                        "at": time.time()})  # fmt: skip
    else:
        h.notes.append(f"the failpoint {DELETION_FAILPOINT} did not kill the operator within 30 s")
    operator.env.pop(FAILPOINTS_ENV, None)
    await operator.kill()
    await operator.start()
    if not await _until(lambda: not c.batch_exists(name), timeout_s=60):
        h.notes.append(f"ExtractionBatch {name} still exists 60 s after the operator's restart")
        h.faults.append({"kind": "deletion-not-converged", "target": name, "start": time.time(), "end": None})
    await slow
    await asyncio.sleep(1.0)  # kopf posts Events in the background
    h.kube_events = await c.kube_events()


async def _until(condition: Callable[[], bool], *, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.1)
    return True


DEADLINE_IN_S = 10.0
"""How far the suite moves the deadlines of the deadline scenario's jobs: an ExtractionBatch takes
no deadline under 60 s, so the suite shortens it in the database, after admission, before any
attempt (the batch is admitted suspended, then resumed)."""


async def deadline(ctx: Context) -> None:
    """C7: jobs whose deadline passes while the model hangs (past the attempt timeout), then refuses
    every request with 503 and Retry-After: 1 (each attempt given back, retried after the cooldown:
    only the deadline bounds how often). No attempt may begin after a job's deadline; every job ends
    FAILED_TERMINAL for its deadline (DEADLINE_EXHAUSTED: no attempt fits before it any more, or
    DEADLINE_EXCEEDED: it passed while the job waited)."""
    c, h = ctx.cluster, ctx.history
    assert c.model is not None
    [name] = await ctx.submit(h.scenario, ctx.documents, suspend=True)
    await _until_admitted(ctx, name, count=len(ctx.documents))
    entry = h.fault("model-hang-then-503", "model", hang=c.model_limits.concurrency, retry_after=1)
    await c.model.fault("hang", count=c.model_limits.concurrency)
    await c.model.fault("503", count=1_000_000, retry_after=1)
    conn = await asyncpg.connect(c.database_url)
    try:
        await conn.execute(
            "UPDATE extraction_jobs j SET deadline_at = clock_timestamp() + make_interval(secs => $2)"
            "  FROM batches b WHERE b.id = j.batch_id AND b.name = $1",
            name, DEADLINE_IN_S,
        )  # fmt: skip
    finally:
        await conn.close()
    h.expect["deadline_batches"] = [name]
    await c.resume_batch(name)
    await asyncio.sleep(DEADLINE_IN_S + 1.0)  # the hung attempts time out before it
    entry["end"] = time.time()


async def _until_admitted(ctx: Context, name: str, *, count: int, timeout_s: float = 60.0) -> None:
    deadline_at = time.monotonic() + timeout_s
    conn = await asyncpg.connect(ctx.cluster.database_url)
    try:
        while time.monotonic() < deadline_at:
            admitted = await conn.fetchval(
                "SELECT count(*) FROM extraction_jobs j JOIN batches b ON b.id = j.batch_id WHERE b.name = $1", name
            )
            if admitted >= count:
                return
            await asyncio.sleep(0.1)
    finally:
        await conn.close()
    raise RuntimeError(f"batch {name}: {count} jobs not admitted within {timeout_s:.0f} s")


async def mixed(ctx: Context) -> None:
    """Every kind of fault, one at a time, drawn at random: the short profile's scenario."""
    await ctx.submit(ctx.history.scenario, ctx.documents)
    await _until_started(ctx)
    stop = asyncio.Event()
    task = asyncio.create_task(nemesis.random_faults(ctx.cluster, ctx.history, ctx.rng, kinds=nemesis.RANDOM_KINDS,
                                                     stop=stop, every_s=(0.3, 1.0)))  # fmt: skip
    await nemesis.model_storm(ctx.cluster, ctx.history, count=6, retry_after=2, timeout_s=20)
    await asyncio.sleep(8)
    stop.set()
    await task


async def soak(ctx: Context) -> None:
    """Many jobs through three workers with random kills and stops and a 429 storm."""
    await ctx.submit(ctx.history.scenario, ctx.documents)
    await _until_started(ctx)
    stop = asyncio.Event()
    task = asyncio.create_task(nemesis.random_faults(ctx.cluster, ctx.history, ctx.rng,
                                                     kinds=("kill-worker", "stop-worker", "kill-relay"),
                                                     stop=stop, every_s=(5.0, 15.0)))  # fmt: skip
    await nemesis.model_storm(ctx.cluster, ctx.history, count=50, retry_after=3, timeout_s=120)
    await _drained_or_timeout(ctx, timeout_s=1200)
    stop.set()
    await task


async def _drained_or_timeout(ctx: Context, *, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if time.monotonic() > deadline or await drained(ctx.cluster, ctx.history):
            break
        await asyncio.sleep(2.0)


SCENARIOS = {s.name: s for s in (
    Scenario("baseline", "—", "none (the reference for throughput)", 60, baseline),
    Scenario("worker-kill", "C1, C4", "SIGKILL of a random worker every 1-3 s, restarted", 400, worker_kills),
    Scenario("worker-stop", "C2", "SIGSTOP of a worker for 1.5-2.5 x the lease, then SIGCONT", 80, worker_stops),
    Scenario("worker-db-cut", "C3", "one worker's PostgreSQL leg stalled for 2 x the lease", 80, worker_db_cut),
    Scenario("relay-broker", "B1, B2, B3", "SIGKILL/SIGSTOP of lading relay; AMQP leg reset or stalled "
             "(unconfirmed publishes in flight)", 120, relay_and_broker),
    Scenario("postgres-restart", "C6", "pg_ctl stop -m immediate, 1-3 s down, start", 80, postgres_restart),
    Scenario("model-429", "D1", "429 storm with Retry-After: 2 (8-15 requests)", 80, model_429_storm),
    Scenario("model-faults", "D2, D3, B6", "model hangs (before and after headers), resets mid-body, slow, refused",
             80, model_faults),
    Scenario("erp-faults", "F1, F5", "ERP commits then the reply is dropped; reset mid-body; stalled; receiver "
             "SIGKILLed", 80, erp_faults),
    Scenario("clock-step", "C5", "one worker's wall clock stepped +10 min, then -10 min (libfaketime)", 60,
             clock_step),
    Scenario("operator-admission", "I2, A3", "lading operator SIGKILLed while admitting three batches", 90,
             operator_admission),
    Scenario("operator-deletion", "I2", "a running batch deleted; lading operator killed inside its deletion "
             "handler (failpoint after the cancel commit, before the finalizer goes), restarted", 120,
             operator_deletion),
    Scenario("deadline", "C7", "deadlines (10 s) pass while the model hangs, then answers 503 + Retry-After: 1 "
             "to everything", 80, deadline),
    Scenario("mixed", "B, C, D, F, I", "every fault kind above drawn at random, one at a time, + a 429 storm",
             200, mixed),
    Scenario("soak", "C, B, D1", "20,000 jobs, random worker kills/stops and relay kills, a 429 storm (50)",
             20_000, soak, drain_s=1200),
    Scenario("soak-baseline", "—", "the soak's jobs without faults (the throughput reference)", 20_000, baseline,
             drain_s=1200),
)}  # fmt: skip

PROFILES: dict[str, tuple[str, ...]] = {
    "short": ("mixed",),
    "full": ("baseline", "worker-kill", "worker-stop", "worker-db-cut", "relay-broker", "postgres-restart",
             "model-429", "model-faults", "erp-faults", "clock-step", "operator-admission", "operator-deletion",
             "deadline", "mixed"),
    "soak": ("soak-baseline", "soak"),
}  # fmt: skip


SOAK_TIMING = cluster_.Timing(lease_ttl_s=12.0, heartbeat_s=2.0, reaper_s=1.0, attempt_timeout_s=10.0)
"""The soak's clocks: its thousands of jobs run for many minutes under `nice` on a shared machine,
where a process can wait seconds for a CPU; with the 3 s lease of the short scenarios every
attempt lost its lease before its model call answered (the last soak before this setting: 269
leases lost, nothing finished in 5 minutes). Recovery is bounded the same way, by these values."""


def timing_for(names: list[str]) -> cluster_.Timing:
    """The soak's timing when only soak scenarios run; the short default otherwise."""
    return SOAK_TIMING if names and all(n in PROFILES["soak"] for n in names) else cluster_.Timing()


async def drained(c: cluster_.Cluster, h: history_.History) -> bool:
    """Every job of the scenario terminal, every delivery settled, every event published."""
    try:
        conn = await asyncpg.connect(c.database_url, timeout=5)
    except (OSError, asyncpg.PostgresError, TimeoutError):
        return False
    try:
        row = await conn.fetchrow(
            "SELECT count(*) FILTER (WHERE j.state IN ('READY', 'RUNNING', 'RETRY_SCHEDULED')) AS busy,"
            "       count(*) AS total,"
            "       (SELECT count(*) FROM deliveries d JOIN extraction_jobs dj ON dj.id = d.job_id"
            "          JOIN batches db ON db.id = dj.batch_id"
            "         WHERE db.name = ANY($1::text[]) AND d.state IN ('PENDING', 'IN_FLIGHT', 'RETRY_SCHEDULED'))"
            "       AS sending,"
            "       (SELECT count(*) FROM outbox_events WHERE published_at IS NULL) AS unpublished"
            "  FROM extraction_jobs j JOIN batches b ON b.id = j.batch_id WHERE b.name = ANY($1::text[])",
            list(h.submitted),
        )
    except (OSError, asyncpg.PostgresError):
        return False
    finally:
        await conn.close()
    expected = sum(len(v) for k, v in h.submitted.items() if k not in h.deleted_batches)
    assert row is not None
    return bool(row["busy"] == 0 and row["total"] >= expected and row["sending"] == 0 and row["unpublished"] == 0)


async def run(
        scenario: Scenario,
        *,
        c: cluster_.Cluster,
        seed: int,
        command: str,
        documents: list[tuple[str, str]],
) -> dict[str, Any]:
    """One scenario from a fresh model stub to its history (a JSON-able dict)."""
    h = history_.History(scenario=scenario.name, seed=seed, command=command,
                         bounds={"recovery_s": c.timing.recovery_bound_s})  # fmt: skip
    await c.start_model(c.model_limits)
    assert c.model is not None
    recorder = history_.Recorder(database_url=c.database_url, amqp_url=c.amqp_url, prefix=c.prefix, history=h,
                                 model_origin=c.model.origin)  # fmt: skip
    await recorder.start()
    ctx = Context(cluster=c, history=h, rng=random.Random(f"{seed}:{scenario.name}"), documents=documents)
    h.started = time.time()
    try:
        await scenario.body(ctx)
    finally:
        await nemesis.heal(c)
    deadline = time.monotonic() + scenario.drain_s
    while not await drained(c, h):
        if time.monotonic() > deadline:
            h.notes.append(f"not drained within {scenario.drain_s:.0f} s after the faults ended")
            break
        await asyncio.sleep(0.5)
    await asyncio.sleep(1.0)  # the side queue's last deliveries
    h.ended = time.time()
    stats = await recorder.stop()
    limits = c.model_limits
    h.model = {"limits": {"rpm": limits.rpm, "tpm": limits.tpm, "concurrency": limits.concurrency},
               "stats": stats}  # fmt: skip
    h.final = await history_.read_final(database_url=c.database_url, erp_database_url=c.erp_database_url)
    return dataclasses.asdict(h)
