"""
The faults, each logged in the history with its wall-clock window before it is undone.

Every fault here is real: a signal to a process, a fault proxy's mode on one network leg, an
immediate stop of the PostgreSQL server, faults the stub model serves, a step of one worker's wall
clock (libfaketime reading its offset from a file). `heal()` undoes whatever is still in effect, so
a scenario always ends with every process running and every leg passing.
"""

from __future__ import annotations

import asyncio
import random
import signal
import time

from hack.reliability import cluster as cluster_
from hack.reliability import history as history_


async def kill(c: cluster_.Cluster, h: history_.History, name: str, *, down_s: float = 0.5) -> None:
    """SIGKILL a process, leave it dead for `down_s`, start it again."""
    process = c.processes[name]
    if not process.running or process.stopped:
        return
    h.kills.append({"kind": process.kind, "name": name, "pid": process.pid, "signal": "SIGKILL", "at": time.time()})
    await process.kill()
    await asyncio.sleep(down_s)
    await process.start()


async def pause(c: cluster_.Cluster, h: history_.History, name: str, *, for_s: float) -> None:
    """SIGSTOP a process for `for_s` (past its lease when longer than the lease TTL), then SIGCONT."""
    process = c.processes[name]
    if not process.running or process.stopped:
        return
    entry = {"kind": process.kind, "name": name, "pid": process.pid, "signal": "SIGSTOP", "at": time.time()}
    h.kills.append(entry)
    process.signal(signal.SIGSTOP)
    await asyncio.sleep(for_s)
    process.signal(signal.SIGCONT)
    entry["until"] = time.time()


async def leg(c: cluster_.Cluster, h: history_.History, name: str, mode: str, *, for_s: float,
              worker: str | None = None, **attributes: float) -> None:  # fmt: skip
    """Put the fault proxy of one leg in `mode` for `for_s`, then back to `pass`.

    `worker`: the leg is that worker's only way to PostgreSQL; its jobs count for recovery time."""
    proxy = c.proxies[name]
    for attribute, value in attributes.items():
        setattr(proxy, attribute, value)
    entry = h.fault(f"proxy-{mode}", name, **attributes)
    if worker is not None:
        process = c.processes[worker]
        h.kills.append({"kind": "worker", "name": worker, "pid": process.pid, "signal": f"proxy-{mode}",
                        "at": entry["start"]})  # fmt: skip
    proxy.set_mode(mode)
    try:
        await asyncio.sleep(for_s)
    finally:
        proxy.set_mode("pass")
        entry["end"] = time.time()


async def postgres_restart(c: cluster_.Cluster, h: history_.History, *, down_s: float = 2.0) -> None:
    """`pg_ctl stop -m immediate`, `down_s` without a server, then start it again."""
    entry = h.fault("postgres-crash-restart", "postgres", down_s=down_s)
    await c.postgres.crash()
    await asyncio.sleep(down_s)
    await c.postgres.start()
    entry["end"] = time.time()


async def model_storm(c: cluster_.Cluster, h: history_.History, *, count: int, retry_after: int,
                      timeout_s: float = 120.0) -> None:  # fmt: skip
    """The next `count` model requests get 429 with `Retry-After: retry_after`; returns once all were served."""
    assert c.model is not None
    entry = h.fault("model-429", "model", count=count, retry_after=retry_after)
    await c.model.fault("429", count=count, retry_after=retry_after)
    deadline = time.monotonic() + timeout_s
    while True:
        if (await c.model.stats())["faults_left"] == 0 or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.2)
    entry["end"] = time.time()


async def model_hang(c: cluster_.Cluster, h: history_.History, *, count: int) -> None:
    """The next `count` model requests are read and never answered (until the attempt timeout)."""
    assert c.model is not None
    entry = h.fault("model-hang", "model", count=count)
    await c.model.fault("hang", count=count)
    entry["end"] = time.time()


async def clock_step(c: cluster_.Cluster, h: history_.History, *, offset_s: int, for_s: float) -> None:
    """Step the last worker's wall clock by `offset_s` for `for_s` (libfaketime), then back."""
    if cluster_.LIBFAKETIME is None:
        h.notes.append("clock step not injected: libfaketime is not installed (Debian package faketime)")
        return
    entry = h.fault("clock-step", f"worker-{cluster_.WORKERS - 1}", offset_s=offset_s)
    c.clock_file.write_text(f"{offset_s:+d}\n")
    await asyncio.sleep(for_s)
    c.clock_file.write_text("+0\n")
    entry["end"] = time.time()


async def heal(c: cluster_.Cluster) -> None:
    """Undo every fault still in effect: legs pass, processes run, the clock is true."""
    for proxy in c.proxies.values():
        proxy.set_mode("pass")
    c.clock_file.write_text("+0\n")
    for process in c.processes.values():
        if process.stopped:
            process.signal(signal.SIGCONT)
        if not process.running:
            await process.start()


RANDOM_KINDS = ("kill-worker", "stop-worker", "kill-relay", "stop-relay", "kill-receiver", "stop-receiver",
                "kill-operator", "stop-operator", "cut-amqp", "stall-amqp", "cut-model", "slow-model",
                "reset-erp", "drop-erp", "slow-pg")  # fmt: skip


async def random_faults(c: cluster_.Cluster, h: history_.History, rng: random.Random, *, kinds: tuple[str, ...],
                        stop: asyncio.Event, every_s: tuple[float, float] = (1.0, 3.0)) -> None:  # fmt: skip
    """Draw a fault from `kinds` at seeded random moments until `stop`; one at a time."""
    lease = c.timing.lease_ttl_s
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), rng.uniform(*every_s))
            return
        except TimeoutError:
            pass
        kind = rng.choice(kinds)
        worker = f"worker-{rng.randrange(cluster_.WORKERS)}"
        if kind == "kill-worker":
            await kill(c, h, worker, down_s=rng.uniform(0.2, 1.5))
        elif kind == "stop-worker":
            await pause(c, h, worker, for_s=rng.uniform(0.5, 2 * lease))
        elif kind in ("kill-relay", "kill-receiver", "kill-operator"):
            await kill(c, h, kind.split("-")[1], down_s=rng.uniform(0.2, 1.5))
        elif kind in ("stop-relay", "stop-receiver", "stop-operator"):
            await pause(c, h, kind.split("-")[1], for_s=rng.uniform(0.5, 4.0))
        elif kind == "cut-amqp":
            await leg(c, h, "amqp", "reset", for_s=rng.uniform(0.5, 3.0))
        elif kind == "stall-amqp":
            await leg(c, h, "amqp", "stall", for_s=rng.uniform(0.5, 3.0))
        elif kind == "cut-model":
            await leg(c, h, "model", rng.choice(("reset", "reset_mid_body", "stall_after_headers")),
                      for_s=rng.uniform(0.5, 2.0))  # fmt: skip
        elif kind == "slow-model":
            await leg(c, h, "model", "slow", for_s=rng.uniform(1.0, 3.0), delay_s=rng.uniform(0.1, 0.5))
        elif kind == "reset-erp":
            await leg(c, h, "erp", rng.choice(("reset", "reset_mid_body", "stall")), for_s=rng.uniform(0.5, 2.0))
        elif kind == "drop-erp":
            await leg(c, h, "erp", "drop_replies", for_s=rng.uniform(0.5, 2.0))
        elif kind == "slow-pg":
            await leg(c, h, f"pg-{worker}", "slow", for_s=rng.uniform(0.5, 2.0), delay_s=rng.uniform(0.05, 0.3))
        else:
            raise ValueError(f"unknown random fault {kind!r}; one of {', '.join(RANDOM_KINDS)}")
