"""
The system under test, as separate real processes on loopback, and the network legs between them.

    stub model  <-model proxy-  lading worker x3 -pg proxy (one each)-> PostgreSQL (owned here)
    lading receiver <-erp proxy- (the workers' dispatchers)    -amqp proxy-> RabbitMQ
    Kubernetes emulator <- lading operator -pg proxy-> ;  lading relay -pg proxy, amqp proxy->

PostgreSQL is a server this suite initialises and owns (`initdb`/`pg_ctl` on a private port and
socket directory under the run's temporary directory), so the crash-restart fault never touches the
machine's shared server. RabbitMQ is the machine's broker: the run declares everything under a
private name prefix and deletes it at the end. Each fault proxy is tests/support/faultproxy.py.

Processes are started through the documented command lines (`lading worker --help`, ...), each
logging to its own file, and are killed by PID at the end, whatever happened.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import glob
import json
import os
import pathlib
import secrets
import shutil
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import aiohttp
import asyncpg

from tests.support import faultproxy, kube_emulator, processes, stub_model

LADING = str(pathlib.Path(sys.executable).parent / "lading")
NAMESPACE = "acme"
POOL = "stub"
ENDPOINT = "erp"
SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
GROUP = "/apis/lading.dev/v1alpha1"
WORKERS = 3
LIBFAKETIME = next(iter(sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))), None)
"""Debian's libfaketime (package `faketime`); the clock-step fault needs it."""


@dataclasses.dataclass(frozen=True)
class Timing:
    """The workers' clocks and bounds: short, so a kill is recovered within seconds."""

    lease_ttl_s: float = 3.0
    heartbeat_s: float = 0.75
    reaper_s: float = 0.5
    backoff_base_s: float = 0.2
    attempt_timeout_s: float = 6.0
    poll_s: float = 0.1
    delivery_lease_ttl_s: float = 3.0
    concurrency: int = 8

    @property
    def recovery_bound_s(self) -> float:
        """Lease + reaper interval + the largest first backoff (full jitter: at most the base)."""
        return self.lease_ttl_s + self.reaper_s + self.backoff_base_s


@dataclasses.dataclass(frozen=True)
class ModelLimits:
    rpm: int = 60_000
    tpm: int = 100_000_000
    concurrency: int = 16
    latency_ms: int = 100


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Process:
    """One Lading process: started, signalled, restarted and killed by PID."""

    def __init__(self, *, kind: str, name: str, argv: Sequence[str], env: Mapping[str, str], log: pathlib.Path):
        self.kind = kind
        self.name = name
        self.argv = list(argv)
        self.env = dict(env)
        self.log = log
        self.process: asyncio.subprocess.Process | None = None
        self.stopped = False
        self.pids: list[int] = []

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None and self.process.returncode is None else None

    async def start(self) -> None:
        with self.log.open("ab") as handle:
            self.process = await asyncio.create_subprocess_exec(
                *self.argv, env=self.env, stdout=handle, stderr=handle, start_new_session=True
            )
        self.stopped = False
        self.pids.append(self.process.pid)

    def signal(self, sig: signal.Signals) -> None:
        if self.process is not None and self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(sig)
            if sig == signal.SIGSTOP:
                self.stopped = True
            elif sig == signal.SIGCONT:
                self.stopped = False

    async def kill(self) -> None:
        """SIGKILL (after SIGCONT: a stopped process must run to die) and reap."""
        if self.process is not None:
            await processes.stop(self.process)
        self.stopped = False

    async def terminate(self, timeout_s: float = 15.0) -> None:
        if self.process is None or self.process.returncode is not None:
            return
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(self.process.wait(), timeout_s)
        except TimeoutError:
            await self.kill()

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.returncode is None


class OwnedPostgres:
    """A PostgreSQL cluster of the suite's own: initdb'd under `base`, listening on 127.0.0.1 only."""

    def __init__(self, base: pathlib.Path) -> None:
        found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
        if not found:
            raise SystemExit("reliability: no PostgreSQL server binaries (/usr/lib/postgresql/*/bin/pg_ctl); "
                             "install the Debian package postgresql")  # fmt: skip
        self.bin = pathlib.Path(found[-1]).parent
        self.base = base
        self.data = base / "pgdata"
        self.sockets = base / "pgsock"
        self.port = free_port()
        self.restarts = 0

    @property
    def admin_url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def url(self, database: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def _as_owner(self, *argv: str) -> list[str]:
        # The server refuses to run as root: run it as the `postgres` system user when we are root.
        if os.geteuid() == 0:
            return ["runuser", "-u", "postgres", "--", *argv]
        return list(argv)

    async def _run(self, *argv: str, check: bool = True) -> None:
        process = await asyncio.create_subprocess_exec(
            *self._as_owner(*argv), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )
        out, _ = await asyncio.wait_for(process.communicate(), 120)
        if check and process.returncode != 0:
            raise RuntimeError(f"{' '.join(argv[:2])} failed: {out.decode(errors='replace')[-2000:]}")

    async def init(self) -> None:
        self.sockets.mkdir(parents=True)
        if os.geteuid() == 0:
            shutil.chown(self.base, "postgres")
            shutil.chown(self.sockets, "postgres")
        await self._run(str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust",
                        "--no-sync", "-E", "UTF8")  # fmt: skip
        await self.start()

    async def start(self) -> None:
        options = (f"-p {self.port} -k {self.sockets} -c listen_addresses=127.0.0.1 -c max_connections=300 "
                   "-c fsync=off -c full_page_writes=off")  # fmt: skip
        await self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-o", options,
                        "-l", str(self.base / "postgresql.log"), "-w", "-t", "60", "start")  # fmt: skip

    async def crash(self) -> None:
        """`pg_ctl stop -m immediate`: every server process exits at once, without a checkpoint."""
        await self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop")
        self.restarts += 1

    async def destroy(self) -> None:
        with contextlib.suppress(Exception):
            await self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop",
                            check=False)  # fmt: skip


class Cluster:
    """Everything a scenario needs, started by `running()`."""

    def __init__(self, *, base: pathlib.Path, seed: int, timing: Timing, amqp_url: str) -> None:
        self.base = base
        self.seed = seed
        self.timing = timing
        self.amqp_url = amqp_url
        self.prefix = f"reliability.{os.getpid()}.{secrets.token_hex(3)}."
        self.logs = base / "logs"
        self.postgres = OwnedPostgres(base)
        self.proxies: dict[str, faultproxy.FaultProxy] = {}
        self.processes: dict[str, Process] = {}
        self.model: stub_model.StubProcess | None = None
        self.model_port = free_port()
        self.model_limits = ModelLimits()
        self.receiver_port = free_port()
        self.emulator: kube_emulator.KubeEmulator | None = None
        self.kube_url = ""
        self.session: aiohttp.ClientSession | None = None
        self.clock_file = base / "clock-offset"
        self._stack = contextlib.AsyncExitStack()

    # --- Addresses.

    @property
    def database_url(self) -> str:
        return self.postgres.url("lading")

    @property
    def erp_database_url(self) -> str:
        return self.postgres.url("erp")

    def through(self, proxy: str, url: str) -> str:
        """`url` with its host and port replaced by the proxy's."""
        host_port = url.split("@", 1)[1].split("/", 1)[0]
        return url.replace(f"@{host_port}/", f"@127.0.0.1:{self.proxies[proxy].port}/", 1)

    def model_url(self) -> str:
        return f"http://127.0.0.1:{self.proxies['model'].port}/v1"

    def erp_url(self) -> str:
        return f"http://127.0.0.1:{self.proxies['erp'].port}/webhooks/lading"

    def workers(self) -> list[Process]:
        return [p for p in self.processes.values() if p.kind == "worker"]

    # --- Life cycle.

    async def start(self) -> None:
        self.logs.mkdir(parents=True, exist_ok=True)
        await self.postgres.init()
        self._stack.push_async_callback(self.postgres.destroy)
        admin = await asyncpg.connect(self.postgres.admin_url)
        try:
            await admin.execute("CREATE DATABASE lading")
            await admin.execute("CREATE DATABASE erp")
        finally:
            await admin.close()
        await self._cli("migrate", "--database-url", self.database_url)
        await self._cli("migrate", "--receiver", "--database-url", self.erp_database_url)

        pg_target = ("127.0.0.1", self.postgres.port)
        amqp_host, amqp_port = _host_port(self.amqp_url, 5672)
        legs = {
            **{f"pg-worker-{i}": pg_target for i in range(WORKERS)},
            "pg-relay": pg_target, "pg-operator": pg_target,
            "amqp": (amqp_host, amqp_port), "model": ("127.0.0.1", self.model_port),
            "erp": ("127.0.0.1", self.receiver_port),
        }  # fmt: skip
        for name, (host, port) in legs.items():
            proxy = faultproxy.FaultProxy(target_host=host, target_port=port, target_unix=None)
            await proxy.start()
            self._stack.push_async_callback(proxy.stop)
            self.proxies[name] = proxy

        await self.start_model(self.model_limits)
        self._stack.push_async_callback(self.stop_model)
        self.session = await self._stack.enter_async_context(aiohttp.ClientSession())
        self.emulator = await self._stack.enter_async_context(kube_emulator.serving())
        self.kube_url = str(self.emulator.servers[0].url).rstrip("/")
        kubeconfig = kube_emulator.write_kubeconfig(self.base / "kubeconfig", server=self.kube_url)
        secrets_dir = self.base / "endpoint-secrets"
        secrets_dir.mkdir()
        (secrets_dir / f"{NAMESPACE}.{ENDPOINT}").write_text(SECRET + "\n")
        receiver_secrets = self.base / "receiver-secrets"
        receiver_secrets.write_text(SECRET + "\n")
        self.clock_file.write_text("+0\n")
        self._stack.push_async_callback(self.stop_all)

        amqp = self.through_amqp()
        self._add("receiver", "receiver", ["receiver", "--port", str(self.receiver_port), "--database-url",
                                           self.erp_database_url, "--secret-file", str(receiver_secrets),
                                           "--grace", "1"])  # fmt: skip
        self._add("operator", "operator", ["operator", "--kubeconfig", str(kubeconfig), "--database-url",
                                           self.through("pg-operator", self.database_url),
                                           "--pool-namespaces", NAMESPACE, "--standalone"])  # fmt: skip
        self._add("relay", "relay", ["relay", "--database-url", self.through("pg-relay", self.database_url),
                                     "--topology-prefix", self.prefix, "--claim-ttl", "3", "--publish-timeout", "2",
                                     "--poll-interval", "0.1"], env={"LADING_AMQP_URL": amqp})  # fmt: skip
        t = self.timing
        for i in range(WORKERS):
            env = {"LADING_AMQP_URL": amqp}
            if i == WORKERS - 1 and LIBFAKETIME:
                # The last worker's wall clock can be stepped at run time (the clock-step fault):
                # libfaketime reads the offset from a file; monotonic time is left alone.
                env.update(LD_PRELOAD=LIBFAKETIME, FAKETIME_TIMESTAMP_FILE=str(self.clock_file),
                           FAKETIME_CACHE_DURATION="1", FAKETIME_DONT_FAKE_MONOTONIC="1")  # fmt: skip
            self._add("worker", f"worker-{i}", [
                "worker", "--database-url", self.through(f"pg-worker-{i}", self.database_url),
                "--pool", f"{NAMESPACE}/{POOL}", "--concurrency", str(t.concurrency),
                "--poll-interval", str(t.poll_s), "--lease-ttl", str(t.lease_ttl_s),
                "--heartbeat-interval", str(t.heartbeat_s), "--reaper-interval", str(t.reaper_s),
                "--attempt-timeout", str(t.attempt_timeout_s), "--backoff-base", str(t.backoff_base_s),
                "--egress-allow", "127.0.0.0/8", "--endpoint-secrets-dir", str(secrets_dir),
                "--delivery-lease-ttl", str(t.delivery_lease_ttl_s), "--topology-prefix", self.prefix, "--grace", "2",
            ], env=env)  # fmt: skip

        await self.processes["receiver"].start()
        await self.processes["operator"].start()
        await self.apply_tenant()
        await self._wait_for_pool()
        for process in self.processes.values():
            if not process.running:
                await process.start()
        self._stack.push_async_callback(self.delete_topology)

    async def close(self) -> None:
        await self._stack.aclose()

    def _add(self, kind: str, name: str, args: Sequence[str], *, env: Mapping[str, str] | None = None) -> None:
        environment = processes.environment(LADING_EGRESS_ALLOW="127.0.0.0/8", **(env or {}))
        self.processes[name] = Process(kind=kind, name=name, argv=[LADING, "--log-level", "INFO", *args],
                                       env=environment, log=self.logs / f"{name}.log")  # fmt: skip

    def through_amqp(self) -> str:
        parts = self.amqp_url.split("@", 1)
        credentials = parts[0] + "@" if len(parts) == 2 else "amqp://"
        rest = parts[1] if len(parts) == 2 else self.amqp_url.split("://", 1)[1]
        path = "/" + rest.split("/", 1)[1] if "/" in rest else "/"
        return f"{credentials}127.0.0.1:{self.proxies['amqp'].port}{path}"

    async def _cli(self, *args: str) -> None:
        process = await asyncio.create_subprocess_exec(
            LADING, *args, env=processes.environment(), stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        out, _ = await asyncio.wait_for(process.communicate(), 120)
        if process.returncode != 0:
            raise RuntimeError(f"lading {args[0]} failed: {out.decode(errors='replace')[-2000:]}")

    async def stop_all(self) -> None:
        for process in self.processes.values():
            await process.kill()

    async def start_model(self, limits: ModelLimits) -> None:
        """(Re)start the stub model on its fixed port with fresh statistics and these limits."""
        await self.stop_model()
        self.model_limits = limits
        context = stub_model.running(
            "--port", str(self.model_port), "--latency-ms", str(limits.latency_ms), "--rpm", str(limits.rpm),
            "--tpm", str(limits.tpm), "--concurrency", str(limits.concurrency),
        )  # fmt: skip
        self._model_context = context
        self.model = await context.__aenter__()

    async def stop_model(self) -> None:
        if self.model is not None:
            await self._model_context.__aexit__(None, None, None)
            self.model = None

    async def delete_topology(self) -> None:
        import aio_pika

        with contextlib.suppress(Exception):
            connection = await aio_pika.connect(self.amqp_url, timeout=10)
            async with connection:
                for queue in ("lading.ingress", "lading.ingress.dead", "reliability.history"):
                    channel = await connection.channel()
                    with contextlib.suppress(Exception):
                        await channel.queue_delete(self.prefix + queue)
                for exchange in ("lading.events", "lading.dlx"):
                    channel = await connection.channel()
                    with contextlib.suppress(Exception):
                        await channel.exchange_delete(self.prefix + exchange)

    # --- Kubernetes objects.

    async def kube(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        assert self.session is not None
        headers = {"Content-Type": "application/merge-patch+json"} if method == "PATCH" else {}
        async with self.session.request(method, self.kube_url + path, json=body, headers=headers) as response:
            text = await response.text()
            if response.status >= 400 and response.status != 404:
                raise RuntimeError(f"{method} {path}: {response.status} {text[:500]}")
            result: dict[str, Any] = json.loads(text) if text else {}
            return result

    async def apply_tenant(self) -> None:
        limits = self.model_limits
        await self.kube("POST", f"{GROUP}/tenantquotas", {
            "apiVersion": "lading.dev/v1alpha1", "kind": "TenantQuota", "metadata": {"name": NAMESPACE},
            "spec": {"namespaces": [NAMESPACE], "maxQueuedJobs": 100_000, "maxInFlight": 64, "weight": 1},
        })  # fmt: skip
        await self.kube("POST", f"{GROUP}/namespaces/{NAMESPACE}/inferencepools", {
            "apiVersion": "lading.dev/v1alpha1", "kind": "InferencePool",
            "metadata": {"name": POOL, "namespace": NAMESPACE},
            "spec": {"provider": "openai-compatible", "model": "stub-model", "endpoint": {"url": self.model_url()},
                     "limits": {"requestsPerMinute": limits.rpm, "tokensPerMinute": limits.tpm,
                                "maxConcurrency": limits.concurrency},
                     "workers": {"minReplicas": 0, "maxReplicas": WORKERS, "concurrency": self.timing.concurrency}},
        })  # fmt: skip
        await self.kube("POST", f"/api/v1/namespaces/{NAMESPACE}/secrets", {
            "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "erp-signing", "namespace": NAMESPACE},
            "stringData": {"secret": SECRET}, "data": {},
        })  # fmt: skip
        await self.kube("POST", f"{GROUP}/namespaces/{NAMESPACE}/deliveryendpoints", {
            "apiVersion": "lading.dev/v1alpha1", "kind": "DeliveryEndpoint",
            "metadata": {"name": ENDPOINT, "namespace": NAMESPACE},
            "spec": {"url": self.erp_url(), "secretRef": {"name": "erp-signing", "key": "secret"},
                     "retryBudget": {"maxAttempts": 50, "maxAgeSeconds": 3600}},
        })  # fmt: skip

    async def _wait_for_pool(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            conn = await asyncpg.connect(self.database_url)
            try:
                pools = await conn.fetchval("SELECT count(*) FROM pools")
                endpoints = await conn.fetchval("SELECT count(*) FROM endpoints")
            finally:
                await conn.close()
            if pools and endpoints:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the operator did not register the pool and the endpoint within {timeout_s:.0f} s; "
                                   f"see {self.logs / 'operator.log'}")  # fmt: skip
            await asyncio.sleep(0.2)

    async def create_batch(
            self, name: str, documents: Sequence[tuple[str, str]], *, deadline_s: int = 3600, suspend: bool = False
    ) -> None:
        await self.kube("POST", f"{GROUP}/namespaces/{NAMESPACE}/extractionbatches", {
            "apiVersion": "lading.dev/v1alpha1", "kind": "ExtractionBatch",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"schema": "invoice.v1", "inferencePoolRef": {"name": POOL},
                     "deliveryEndpointRef": {"name": ENDPOINT}, "deadlineSeconds": deadline_s, "suspend": suspend,
                     "documents": [{"key": k, "text": t} for k, t in documents]},
        })  # fmt: skip

    async def resume_batch(self, name: str) -> None:
        """`spec.suspend: false` (the operator releases the batch's jobs to the workers)."""
        await self.kube("PATCH", f"{GROUP}/namespaces/{NAMESPACE}/extractionbatches/{name}",
                        {"spec": {"suspend": False}})  # fmt: skip

    async def kube_events(self) -> list[dict[str, Any]]:
        """The namespace's Kubernetes Events: {reason, type, object (the involved object's name), message}."""
        listed = await self.kube("GET", f"/api/v1/namespaces/{NAMESPACE}/events")
        return [{"reason": e.get("reason"), "type": e.get("type"), "message": e.get("message"),
                 "object": (e.get("involvedObject") or {}).get("name")} for e in listed.get("items", [])]  # fmt: skip

    async def delete_batch(self, name: str) -> None:
        await self.kube("DELETE", f"{GROUP}/namespaces/{NAMESPACE}/extractionbatches/{name}")

    def batch_exists(self, name: str) -> bool:
        assert self.emulator is not None
        return self.emulator.stored("lading.dev/v1alpha1/extractionbatches", NAMESPACE, name) is not None


def _host_port(url: str, default: int) -> tuple[str, int]:
    rest = url.split("://", 1)[1].split("@")[-1].split("/", 1)[0]
    host, _, port = rest.partition(":")
    return host or "127.0.0.1", int(port or default)


@contextlib.asynccontextmanager
async def running(*, base: pathlib.Path, seed: int, timing: Timing, amqp_url: str) -> AsyncIterator[Cluster]:
    cluster = Cluster(base=base, seed=seed, timing=timing, amqp_url=amqp_url)
    try:
        await cluster.start()
        yield cluster
    finally:
        await cluster.close()
