"""
The `delivery` benchmark (run through hack/bench.py): signed deliveries per second from ONE
dispatcher to ONE reference receiver (a separate process running what `lading receiver` runs)
that commits each delivery durably (inbox row + ledger row, synchronous_commit on) before
answering 2xx.

    setup     N jobs accepted and succeeded with real invoice.v1 results (the trigger writes
              their N PENDING deliveries), an endpoint registered at the receiver
    measure   one in-process Dispatcher (its claim/sign/post/record loop, fenced and leased)
              until all N are DELIVERED; for several dispatcher concurrencies
              (LADING_BENCH_DELIVERY_RUNS="64x2,128x4": concurrency x lanes) and two receiver
              modes (LADING_BENCH_DELIVERY_MODES): `grouped`, the receiver's defaults (group
              commit), and `one-per-transaction` (a group holds one delivery, as many
              transactions at once as connections: the receiver before group commit)

Reports deliveries/s end to end (first claim to last DELIVERED commit), the receiver's accepted/s
(its inbox rows over the span of their receipt times), and CPU seconds of the dispatcher
process, of the receiver process and of PostgreSQL's backends serving each (from /proc), and
their sum per delivery. Target: >= 1,000 deliveries/s end to end. One more, informational run sends to a null
receiver (a separate process answering 204 at once, no verification, no database): the
dispatcher's own ceiling, to tell which side a result is bound by.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
from lading_worker import dispatching

from lading import accepting
from lading.db import jobs, registry
from lading.db import pool as dbpool
from lading.delivery import egress
from lading.delivery import secrets as delivery_secrets
from lading.ids import PoolName, TenantName, WorkerId
from lading.jobs import transitions
from lading.settings import DeliverySettings
from lading_demo import generator

TENANT = TenantName("bench")
POOL = PoolName("lading-system/bench")
ENDPOINT = "bench/erp"
SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
DELIVERIES = int(os.environ.get("LADING_BENCH_DELIVERIES", "5000"))
RUNS = tuple(
    (int(c), int(lanes))
    for c, lanes in (run.split("x") for run in os.environ.get("LADING_BENCH_DELIVERY_RUNS", "64x2,128x4").split(","))
)
"""(concurrency, lanes) of the dispatcher runs; LADING_BENCH_DELIVERY_RUNS="64x2,128x4" chooses others."""
RECEIVER_POOL = int(os.environ.get("LADING_BENCH_RECEIVER_POOL", "16"))
TARGET_PER_S = 1000.0
WORKER = WorkerId("bench")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


async def _prepare(conn: asyncpg.Connection, name: str, receiver_url: str) -> None:
    """N succeeded jobs of a fresh batch (so N PENDING deliveries) with real invoices as results."""
    await conn.execute("TRUNCATE deliveries, delivery_attempts")
    await registry.upsert_endpoint(
        conn, name=ENDPOINT, url=receiver_url,
        spec={"url": receiver_url, "secretRef": {"name": "s", "key": "secret"}},
    )  # fmt: skip
    await conn.execute("UPDATE endpoints SET breaker_state = 'closed', breaker_failures = 0")
    samples = [s for s in generator.generate(DELIVERIES * 2, seed=5) if s.truth is not None][:DELIVERIES]
    request = accepting.BatchRequest(
        tenant=TENANT, namespace=str(TENANT), name=name, uid="uid-" + name, schema="invoice.v1", pool=POOL,
        model_policy={"pool": POOL}, validation_policy="invoice-strict-v1", priority="normal", deadline_s=86400,
        documents=[accepting.DocumentInput(key=f"doc-{i:06d}", text=s.text) for i, s in enumerate(samples)],
        endpoint=ENDPOINT,
    )  # fmt: skip
    await accepting.accept_batch(conn, request)
    truth = {f"doc-{i:06d}": s.truth for i, s in enumerate(samples)}
    while True:
        claimed = await jobs.claim_batch(conn, pool=POOL, worker_id=WORKER, limit=1000, lease_ttl_s=600)
        if not claimed:
            break
        finishes = [
            transitions.succeed(c.id, c.fence, result=truth[c.document_key] or {},
                                validation={"passed": True, "failed_checks": []})
            for c in claimed
        ]  # fmt: skip
        await jobs.finish_many(conn, finishes, worker_id=WORKER)


TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def _cpu_s_of(pids: list[int]) -> dict[int, float]:
    """utime + stime of each process (seconds) from /proc/<pid>/stat; a vanished one is left out."""
    out: dict[int, float] = {}
    for pid in pids:
        try:
            fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[pid] = (int(fields[11]) + int(fields[12])) * TICK_S
    return out


async def _backends(conn: asyncpg.Connection) -> dict[str, list[int]]:
    """PostgreSQL backends of this database by side: the receiver's pool, and the rest (the dispatcher's)."""
    rows = await conn.fetch(
        "SELECT pid, application_name FROM pg_stat_activity"
        " WHERE datname = current_database() AND pid <> pg_backend_pid()"
    )
    return {
        "receiver": [r["pid"] for r in rows if r["application_name"] == "lading-receiver"],
        "dispatcher": [r["pid"] for r in rows if r["application_name"] != "lading-receiver"],
    }


class _Cpu:
    """CPU seconds of the receiver process and of PostgreSQL's backends per side, over a run."""

    def __init__(self, receiver_pid: int | None) -> None:
        self.receiver_pid = receiver_pid
        self.before: dict[str, dict[int, float]] = {}

    async def start(self, conn: asyncpg.Connection) -> None:
        sides = await _backends(conn)
        self.before = {side: _cpu_s_of(pids) for side, pids in sides.items()}
        self.before["receiver_process"] = _cpu_s_of([self.receiver_pid] if self.receiver_pid else [])

    async def spent(self, conn: asyncpg.Connection) -> dict[str, float]:
        sides = await _backends(conn)
        sides["receiver_process"] = [self.receiver_pid] if self.receiver_pid else []
        out: dict[str, float] = {}
        for side, pids in sides.items():
            now = _cpu_s_of(pids)
            out[side] = round(sum(v - self.before.get(side, {}).get(pid, 0.0) for pid, v in now.items()), 2)
        return {
            "receiver_process_cpu_s": out["receiver_process"],
            "receiver_postgres_cpu_s": out["receiver"],
            "dispatcher_postgres_cpu_s": out["dispatcher"],
        }


RECEIVER_PID: list[int] = []
"""The receiver process's pid while it runs (for its CPU)."""


@contextlib.asynccontextmanager
async def _receiver(url: str, mode: str) -> AsyncIterator[str]:
    """The receiver in its own process on a free port (what `lading receiver` runs, with the settings
    of `mode`); yields the webhook URL."""
    root = ROOT
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(os.path.join(root, p) for p in ("", "worker", "cli", "webhook_receiver"))
    env["LADING_RECEIVER_SECRETS"] = SECRET
    migrate = await asyncio.create_subprocess_exec(  # the receiver waits for its schema, never applies it
        sys.executable, "-c", "from lading_cli.main import main; raise SystemExit(main())", "migrate", "--receiver",
        "--database-url", url, env=env, stdout=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    if await migrate.wait() != 0:
        raise RuntimeError("lading migrate --receiver failed")
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", RECEIVER_PROCESS, url,
        json.dumps(dict(RECEIVER_MODES[mode], pool_max_size=RECEIVER_POOL)), env=env, stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        line = (await asyncio.wait_for(process.stdout.readline(), 60)).decode()
        found = re.search(r"listening on (\S+)", line)
        if not found:
            raise RuntimeError(f"the receiver did not start: {line!r}")
        RECEIVER_PID[:] = [process.pid]
        yield found.group(1)
    finally:
        RECEIVER_PID.clear()
        if process.returncode is None:
            process.terminate()
        await process.wait()


RECEIVER_PROCESS = """
import asyncio, json, os, sys
from lading_webhook_receiver import main, settings
asyncio.run(main.serve(database_url=sys.argv[1], secrets=[os.environ["LADING_RECEIVER_SECRETS"]], host="127.0.0.1",
                       port=0, config=settings.ReceiverSettings(**json.loads(sys.argv[2]))))
"""
RECEIVER_MODES: dict[str, dict[str, int]] = {
    "grouped": {},
    "one-per-transaction": {"commit_group_max": 1, "commit_groups": RECEIVER_POOL},
}
"""The receiver's settings per mode: its defaults (group commit), and one delivery per transaction with as
many transactions at once as connections (what the receiver did before group commit), for comparison."""
MODES = tuple(os.environ.get("LADING_BENCH_DELIVERY_MODES", ",".join(RECEIVER_MODES)).split(","))

NULL_RECEIVER = """
import asyncio, sys
from aiohttp import web
async def ok(_):
    return web.Response(status=204)
async def main():
    app = web.Application()
    app.router.add_post("/webhooks/lading", ok)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = [a[1] for a in runner.addresses if isinstance(a, tuple)][0]
    print(f"listening on http://127.0.0.1:{port}/webhooks/lading", flush=True)
    await asyncio.Event().wait()
asyncio.run(main())
"""


@contextlib.asynccontextmanager
async def _null_receiver() -> AsyncIterator[str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", NULL_RECEIVER, stdout=asyncio.subprocess.PIPE
    )
    try:
        assert process.stdout is not None
        line = (await asyncio.wait_for(process.stdout.readline(), 60)).decode()
        found = re.search(r"listening on (\S+)", line)
        if not found:
            raise RuntimeError(f"the null receiver did not start: {line!r}")
        yield found.group(1)
    finally:
        if process.returncode is None:
            process.terminate()
        await process.wait()


async def _run(pool: asyncpg.Pool, conn: asyncpg.Connection, concurrency: int, lanes: int) -> dict[str, Any]:
    settings = DeliverySettings(concurrency=concurrency, lanes=lanes, poll_interval_s=0.02)
    dispatcher = dispatching.Dispatcher(
        pool, secrets=delivery_secrets.StaticSecrets({ENDPOINT: [SECRET]}),
        policy=egress.EgressPolicy(endpoint_allow={ENDPOINT: egress.parse_cidrs(["127.0.0.0/8"])}),
        settings=settings, owner=f"bench-{concurrency}",
    )  # fmt: skip
    inbox_before = int(await conn.fetchval("SELECT count(*) FROM erp_inbox"))
    other_cpu = _Cpu(RECEIVER_PID[0] if RECEIVER_PID else None)
    await other_cpu.start(conn)
    cpu0, started = time.process_time(), time.monotonic()
    stop = asyncio.Event()
    task = asyncio.create_task(dispatcher.run_forever(stop))
    try:
        while not task.done():
            done = await conn.fetchval("SELECT count(*) FROM deliveries WHERE state = 'DELIVERED'")
            if done >= DELIVERIES:
                break
            await asyncio.sleep(0.02)
        elapsed = time.monotonic() - started
    finally:
        stop.set()
        await task
    cpu = time.process_time() - cpu0
    spent = await other_cpu.spent(conn)
    delivered = int(await conn.fetchval("SELECT count(*) FROM deliveries WHERE state = 'DELIVERED'"))
    states = {r["state"]: r["n"] for r in await conn.fetch("SELECT state, count(*) AS n FROM deliveries GROUP BY 1")}
    span = await conn.fetchrow(
        "SELECT count(*) AS n, extract(epoch FROM max(received_at) - min(received_at)) AS s FROM erp_inbox "
        "WHERE status = 'accepted'"
    )
    accepted = int(span["n"]) - inbox_before
    return {
        "concurrency": concurrency,
        "lanes": lanes,
        "deliveries": DELIVERIES,
        "seconds": round(elapsed, 2),
        "deliveries_per_s": round(delivered / elapsed, 1),
        "states": states,
        "receiver_accepted": accepted,
        "receiver_accepted_per_s": round(accepted / float(span["s"]), 1) if span["s"] else None,
        "dispatcher_cpu_s": round(cpu, 2),
        **spent,
        "cpu_ms_per_delivery": round((cpu + sum(spent.values())) * 1000 / DELIVERIES, 2),
    }


async def bench_delivery(url: str) -> tuple[dict[str, Any], dict[str, Any], bool]:
    conn = await dbpool.connect(url)
    pool = await dbpool.create_pool(url, min_size=2, max_size=4)
    runs: list[dict[str, Any]] = []
    try:
        for mode in MODES:
            async with _receiver(url, mode) as receiver_url:
                for i, (concurrency, lanes) in enumerate(RUNS):
                    await conn.execute("TRUNCATE erp_inbox, ledger_invoices")
                    await _prepare(conn, f"delivery-{mode}-{i}", receiver_url)
                    runs.append({"receiver_mode": mode, **await _run(pool, conn, concurrency, lanes)})
                    print(f"bench: delivery {runs[-1]}", file=sys.stderr, flush=True)
        async with _null_receiver() as null_url:
            await _prepare(conn, "delivery-null", null_url)
            null_run = await _run(pool, conn, 64, 2)
            print(f"bench: delivery (null receiver) {null_run}", file=sys.stderr, flush=True)
    finally:
        await pool.close()
        await conn.close()
    best = max((r for r in runs if r["receiver_mode"] == MODES[0]), key=lambda r: r["deliveries_per_s"])
    complete = all(r["states"] == {"DELIVERED": DELIVERIES} for r in runs)
    results = {
        "receiver": f"lading receiver (separate process, ledger adapter, pool {RECEIVER_POOL}), durable commits",
        "receiver_modes": {mode: RECEIVER_MODES[mode] for mode in MODES},
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "runs": runs,
        "deliveries_per_s_best": best["deliveries_per_s"],
        "every_run_complete": complete,
        "null_receiver_run": {k: v for k, v in null_run.items() if not k.startswith("receiver_")},
    }
    targets = {"deliveries_per_s_min": TARGET_PER_S}
    return results, targets, complete and best["deliveries_per_s"] >= TARGET_PER_S
