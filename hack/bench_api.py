"""
The `api` benchmark (run through hack/bench.py): single-document POSTs to the HTTP intake
(`lading api`, a separate process) with unique Idempotency-Keys, from a load generator in another
separate process (this file with `--load`).

    open loop   fixed offered rates (200, 500, 1,000 req/s, LADING_BENCH_API_SECONDS each, default
                30): request i is sent at t0 + i/rate whether or not earlier ones were answered, so a
                slow server shows as latency, not as a lower offered rate (no coordinated omission:
                latency is measured from the scheduled send time)
    saturation  closed loop, LADING_BENCH_API_CLIENTS concurrent clients (default 64) for 10 s:
                documents/s accepted, the intake's ceiling on this machine
    core        the same closed loop calling `lading.intake.submit_document` in-process (no HTTP,
                no token, no Idempotency-Key record), one transaction per document, 20 callers; and
                `lading.intake.GroupSubmitter` with LADING_BENCH_API_CLIENTS callers (group commit,
                as the intake accepts documents): what the core allows, to tell which layer a
                ceiling belongs to
    floor       last, the 500 req/s open loop against a bare aiohttp server that only writes each
                document's rows in one statement (hack/bench_api_floor.py): what this machine
                allows any intake on this stack at that rate, measured in the same run;
                `vs_floor_at_500` is Lading's p50 and p99 over the floor's
                (LADING_BENCH_API_FLOOR=0 leaves it out)

The tenant has maxQueuedJobs 1,000,000 (never reached), so every admission reads its queue room.

Each 202 leaves only after the commit that holds its document (synchronous_commit on). Reports
p50/p95/p99 latency, errors by status, the achieved rate, the intake process's CPU seconds and
PostgreSQL's (its client backends of the benchmark's database, from /proc), each also per accepted
request, the load generator's own CPU (`load_cpu_s`, `load_cpu_ms_per_request`: it shares the
machine's CPUs with both), and the load average. The load generator is a plain asyncio HTTP/1.1
client over keep-alive connections, with each request's bytes spliced from a template, so it takes
less of the CPUs from what it measures than a general client would (docs/benchmarks.md, `api`).
Targets: at 500 req/s p50 <= 3 ms and p99 <= 10 ms with no errors; saturation >= 2,000
documents/s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.parse
from typing import Any

from lading import access, intake
from lading.db import api_tokens, registry
from lading.db import pool as dbpool
from lading.ids import TenantName

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAMESPACE = "bench"
RATES = (200, 500, 1000)
SECONDS = float(os.environ.get("LADING_BENCH_API_SECONDS", "30"))
CLIENTS = int(os.environ.get("LADING_BENCH_API_CLIENTS", "64"))
SATURATION_S = 10.0
TARGET_P50_MS = 3.0
TARGET_P99_MS = 10.0
TARGET_SATURATION_PER_S = 2000.0
FLOOR = os.environ.get("LADING_BENCH_API_FLOOR", "1") != "0"
FLOOR_RATE = 500
TEXT = "ACME GmbH\nInvoice {n}\nDate 2026-03-01\nNet 100.00 EUR\nVAT 19% 19.00 EUR\nTotal 119.00 EUR\n" * 8


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered) + 0.5) - 1))] if ordered else 0.0


BODY_TEMPLATE = json.dumps({"key": "doc-{n}", "text": TEXT, "inferencePoolRef": "lading-system/bench"})
"""A POST's body with `{n}` where the document's number goes (json.dumps keeps the braces)."""


class _Requests:
    """The bytes of each POST, built by splicing: the load generator shares the machine's two CPUs
    with the intake and PostgreSQL, so it spends as little as it can per request."""

    def __init__(self, url: str, token: str) -> None:
        parsed = urllib.parse.urlsplit(url)
        self.host = parsed.hostname or "127.0.0.1"
        self.port = parsed.port or 80
        self.head = (f"POST {parsed.path} HTTP/1.1\r\nHost: {parsed.netloc}\r\nAuthorization: Bearer {token}\r\n"
                     "Content-Type: application/json\r\n").encode()

    def post(self, key: str, n: int) -> bytes:
        body = BODY_TEMPLATE.replace("{n}", str(n)).encode()
        return self.head + f"Idempotency-Key: {key}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body


class _Connections:
    """Keep-alive HTTP/1.1 connections, one request at a time each, opened as needed (at most
    `limit`): a plain asyncio stream client, a fraction of a general client's CPU per request."""

    def __init__(self, requests: _Requests, limit: int) -> None:
        self.requests = requests
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        self.room = asyncio.Semaphore(limit)

    async def post(self, key: str, n: int) -> int:
        """The answer's status; 0 when none came (the connection failed)."""
        async with self.room:
            if self.idle:
                reader, writer = self.idle.pop()
            else:
                try:
                    reader, writer = await asyncio.open_connection(self.requests.host, self.requests.port)
                except OSError:
                    return 0
            try:
                writer.write(self.requests.post(key, n))
                status, keep = await _answer(reader)
            except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
                writer.close()
                return 0
            if keep:
                self.idle.append((reader, writer))
            else:
                writer.close()
            return status

    def close(self) -> None:
        for _, writer in self.idle:
            writer.close()
        self.idle.clear()


async def _answer(reader: asyncio.StreamReader) -> tuple[int, bool]:
    """An answer's status, and whether the connection stays open; its body is read and dropped."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split(b" ", 2)[1])
    length = 0
    keep = True
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            length = int(value)
        elif name == b"connection" and value.strip().lower() == b"close":
            keep = False
    if length:
        await reader.readexactly(length)
    return status, keep


async def _open_loop(url: str, token: str, rate: float, seconds: float, prefix: str) -> dict[str, Any]:
    count = int(rate * seconds)
    latencies: list[float] = []
    statuses: dict[str, int] = {}
    lag: list[float] = []
    connections = _Connections(_Requests(url, token), limit=512)
    loop = asyncio.get_running_loop()
    cpu = time.process_time()
    start = loop.time() + 0.2

    async def one(i: int, scheduled: float) -> None:
        lag.append(loop.time() - scheduled)
        status = await connections.post(f"{prefix}-{i}", i)
        latencies.append((loop.time() - scheduled) * 1000)
        statuses[str(status)] = statuses.get(str(status), 0) + 1

    # Request i is started once its time t0 + i/rate has come: one timer for the loop, not one per
    # request, and each request's latency counted from its scheduled time, not from when it was sent.
    sent: set[asyncio.Task[None]] = set()
    i = 0
    while i < count:
        now = loop.time()
        while i < count and start + i / rate <= now:
            task = asyncio.create_task(one(i, start + i / rate))
            sent.add(task)
            task.add_done_callback(sent.discard)
            i += 1
        if i < count:
            await asyncio.sleep(max(0.0, start + i / rate - loop.time()))
    while sent:
        await asyncio.gather(*list(sent))
    elapsed = loop.time() - start
    load_cpu = time.process_time() - cpu
    connections.close()
    return {
        "offered_per_s": rate, "requests": count, "achieved_per_s": round(count / elapsed, 1),
        "p50_ms": round(_quantile(latencies, 0.50), 2), "p95_ms": round(_quantile(latencies, 0.95), 2),
        "p99_ms": round(_quantile(latencies, 0.99), 2), "max_ms": round(max(latencies), 2),
        "statuses": statuses, "errors": count - statuses.get("202", 0),
        "send_lag_p99_ms": round(_quantile(lag, 0.99) * 1000, 2),
        "load_cpu_s": round(load_cpu, 2), "load_cpu_ms_per_request": _per_request_ms(load_cpu, count),
    }  # fmt: skip


async def _closed_loop(url: str, token: str, clients: int, seconds: float, prefix: str) -> dict[str, Any]:
    accepted = 0
    errors = 0
    counter = iter(range(10**9))
    connections = _Connections(_Requests(url, token), limit=clients)
    loop = asyncio.get_running_loop()
    cpu = time.process_time()
    end = loop.time() + seconds

    async def client() -> None:
        nonlocal accepted, errors
        while loop.time() < end:
            n = next(counter)
            if await connections.post(f"{prefix}-{n}", n) == 202:
                accepted += 1
            else:
                errors += 1

    started = loop.time()
    await asyncio.gather(*(client() for _ in range(clients)))
    elapsed = loop.time() - started
    load_cpu = time.process_time() - cpu
    connections.close()
    return {"clients": clients, "accepted_per_s": round(accepted / elapsed, 1), "errors": errors,
            "load_cpu_s": round(load_cpu, 2), "load_cpu_ms_per_request": _per_request_ms(load_cpu, accepted + errors)}


def load_main(argv: list[str]) -> int:
    """The load generator's process: `bench_api.py --load URL TOKEN MODE ARG SECONDS PREFIX`."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--load", nargs=6, metavar=("URL", "TOKEN", "MODE", "ARG", "SECONDS", "PREFIX"))
    url, token, mode, arg, seconds, prefix = parser.parse_args(argv).load
    if mode == "open":
        report = asyncio.run(_open_loop(url, token, float(arg), float(seconds), prefix))
    else:
        report = asyncio.run(_closed_loop(url, token, int(arg), float(seconds), prefix))
    print(json.dumps(report), flush=True)
    return 0


async def _core_loop(url: str, clients: int, seconds: float, *, grouped: bool = False) -> dict[str, Any]:
    """`submit_document` directly (or through a GroupSubmitter), `clients` at once, for `seconds`."""
    db = await dbpool.create_pool(url, min_size=1, max_size=min(clients, 20))
    submitter = intake.GroupSubmitter(db)
    accepted = 0
    errors = 0
    counter = iter(range(10**9))
    try:
        loop = asyncio.get_running_loop()
        end = loop.time() + seconds

        async def client() -> None:
            nonlocal accepted, errors
            while loop.time() < end:
                n = next(counter)
                document = intake.SubmittedDocument(
                    key=f"core-{n}", text=TEXT.format(n=n), uri=None, sha256=None, bytes=None,
                    inference_pool_ref="lading-system/bench", delivery_endpoint_ref=None, priority=None,
                    deadline_seconds=None,
                )  # fmt: skip
                try:
                    if grouped:
                        request = intake.validated(document, namespace=NAMESPACE, idempotency_key=f"group-{n}")
                        await submitter.submit(namespace=NAMESPACE, request=request, idempotency_key=f"group-{n}",
                                               request_digest=f"d{n}")
                    else:
                        await intake.submit_document(db, namespace=NAMESPACE, document=document,
                                                     idempotency_key=f"core-{n}", request_digest=f"d{n}")
                    accepted += 1
                except Exception:
                    errors += 1

        started = loop.time()
        await asyncio.gather(*(client() for _ in range(clients)))
        elapsed = loop.time() - started
    finally:
        await db.close()
    groups = submitter.groups.applied_groups
    report: dict[str, Any] = {"clients": clients, "accepted_per_s": round(accepted / elapsed, 1), "errors": errors}
    if grouped:
        report["mean_group"] = round(submitter.groups.applied_items / groups, 1) if groups else 0
    return report


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _postgres_cpu_s(conn: Any) -> dict[int, float]:
    """CPU seconds so far of each client backend of this database (from /proc: this machine's server)."""
    rows = await conn.fetch("SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                            "AND backend_type = 'client backend' AND pid <> pg_backend_pid()")
    found: dict[int, float] = {}
    for row in rows:
        try:
            found[row["pid"]] = _cpu_s(row["pid"])
        except (OSError, ValueError, IndexError):
            continue
    return found


def _per_request_ms(cpu_s: float, requests: float) -> float | None:
    return round(cpu_s * 1000 / requests, 3) if requests else None


def _load(url: str, token: str, *args: str) -> dict[str, Any]:
    """Run the load generator in its own process (blocking: the benchmark does nothing else meanwhile)."""
    done = subprocess.run(
        [sys.executable, __file__, "--load", url, token, *args], capture_output=True, text=True, check=False,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    if done.returncode != 0:
        return {"error": done.stderr[-2000:]}
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _count_cpu(
        report: dict[str, Any],
        pid: int,
        cpu: float,
        postgres: dict[int, float],
        postgres_after: dict[int, float],
        *,
        requests: float,
) -> None:
    """The intake's and PostgreSQL's CPU over one run, in total and per accepted request."""
    server_s = _cpu_s(pid) - cpu
    postgres_s = sum(after - postgres.get(backend, 0.0) for backend, after in postgres_after.items())
    report["server_cpu_s"] = round(server_s, 2)
    report["server_cpu_ms_per_request"] = _per_request_ms(server_s, requests)
    report["postgres_cpu_s"] = round(postgres_s, 2)
    report["postgres_cpu_ms_per_request"] = _per_request_ms(postgres_s, requests)
    report["loadavg_1m"] = os.getloadavg()[0]


def _start_server(command: list[str]) -> tuple[subprocess.Popen[bytes] | None, str]:
    """A server process started and the documents URL of namespace NAMESPACE on it, once it says
    where it listens; (None, what it said) when it did not start."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.join(ROOT, "api"), *sys.path])}
    server = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert server.stdout is not None
    line = server.stdout.readline().decode()
    match = re.search(r"listening on (http://\S+)", line)
    if match is None:
        _stop(server)
        return None, line
    # What it writes later is drained, so a server that logs a lot never blocks on a full pipe.
    threading.Thread(target=server.stdout.read, daemon=True).start()
    return server, match[1] + f"/v1/namespaces/{NAMESPACE}/documents"


def _stop(server: subprocess.Popen[bytes]) -> None:
    server.kill()
    server.wait()
    if server.stdout is not None:
        server.stdout.close()


async def _measured(conn: Any, pid: int, base: str, token: str, rate: float, prefix: str) -> dict[str, Any]:
    """One open-loop run at `rate` against the server `pid` at `base`, with its and PostgreSQL's CPU."""
    cpu, postgres = _cpu_s(pid), await _postgres_cpu_s(conn)
    report = _load(base, token, "open", str(rate), str(SECONDS), prefix)
    _count_cpu(report, pid, cpu, postgres, await _postgres_cpu_s(conn),
               requests=report.get("statuses", {}).get("202", 0))
    return report


async def _floor(conn: Any, url: str, token: str) -> dict[str, Any]:
    """The floor (hack/bench_api_floor.py) at FLOOR_RATE, measured as the intake is: what a server
    that only writes a document's rows, in one statement, answers with on this machine now."""
    batch_id = await conn.fetchval("SELECT min(id) FROM batches WHERE namespace = $1", NAMESPACE)
    if batch_id is None:
        return {"error": "no batch of the intake's to append the floor's jobs to"}
    server, base = _start_server([sys.executable, os.path.join(ROOT, "hack", "bench_api_floor.py"), url,
                                  str(batch_id)])
    if server is None:
        return {"error": f"the floor's server did not start: {base}"}
    try:
        _load(base, token, "open", "50", "2", "floor-warm")
        return await _measured(conn, server.pid, base, token, FLOOR_RATE, "floor")
    finally:
        _stop(server)


async def bench(url: str) -> tuple[dict[str, Any], dict[str, Any], bool]:
    conn = await dbpool.connect(url)
    try:
        await registry.upsert_tenant(conn, name=TenantName(NAMESPACE), namespaces=[NAMESPACE], weight=1,
                                     max_queued_jobs=1_000_000, max_in_flight=None, spec={})
        token = access.mint()
        await api_tokens.insert(conn, name="bench", token_sha256=access.digest(token), namespaces=[NAMESPACE],
                                expires_at=None)
        synchronous_commit = await conn.fetchval("SHOW synchronous_commit")
    except BaseException:
        await conn.close()
        raise
    server, base = _start_server([sys.executable, "-m", "lading_api", "--port", "0", "--database-url", url,
                                  "--pool-size", "20"])
    if server is None:
        await conn.close()
        return {"error": f"lading api did not start: {base}"}, {}, False
    results: dict[str, Any] = {"synchronous_commit": synchronous_commit, "seconds_per_rate": SECONDS, "rates": []}
    try:
        _load(base, token, "open", "50", "2", "warm")  # connections, caches, plans
        for rate in RATES:
            report = await _measured(conn, server.pid, base, token, rate, f"r{rate}")
            results["rates"].append(report)
        cpu, postgres = _cpu_s(server.pid), await _postgres_cpu_s(conn)
        saturation = _load(base, token, "closed", str(CLIENTS), str(SATURATION_S), "sat")
        _count_cpu(saturation, server.pid, cpu, postgres, await _postgres_cpu_s(conn),
                   requests=saturation.get("accepted_per_s", 0) * SATURATION_S)
        results["saturation"] = saturation
        core = await _core_loop(url, min(CLIENTS, 20), SATURATION_S)
        core["loadavg_1m"] = os.getloadavg()[0]
        results["core_submit"] = core
        grouped = await _core_loop(url, CLIENTS, SATURATION_S, grouped=True)
        grouped["loadavg_1m"] = os.getloadavg()[0]
        results["core_group_submit"] = grouped
        if FLOOR:  # last: the rows it writes (and their vacuum) would weigh on whatever came after
            results["floor"] = await _floor(conn, url, token)
    finally:
        _stop(server)
        await conn.close()
    at_500: dict[str, Any] = next((r for r in results["rates"] if r.get("offered_per_s") == 500), {})
    floor = results.get("floor", {})
    if floor.get("errors") == 0 and at_500.get("p50_ms"):
        results["vs_floor_at_500"] = {"p50": round(at_500["p50_ms"] / floor["p50_ms"], 2),
                                      "p99": round(at_500["p99_ms"] / floor["p99_ms"], 2)}
    targets = {"p50_ms_at_500": TARGET_P50_MS, "p99_ms_at_500": TARGET_P99_MS, "errors_at_500": 0,
               "saturation_per_s": TARGET_SATURATION_PER_S}
    passed = (at_500.get("p50_ms", 1e9) <= TARGET_P50_MS and at_500.get("p99_ms", 1e9) <= TARGET_P99_MS
              and at_500.get("errors", 1) == 0
              and results["saturation"].get("accepted_per_s", 0) >= TARGET_SATURATION_PER_S)
    return results, targets, passed


if __name__ == "__main__":
    raise SystemExit(load_main(sys.argv[1:]))
