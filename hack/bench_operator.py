"""
The `operator` benchmark: 100 ExtractionBatches of 1,000 documents each created at once against
the Kubernetes emulator (tests/support/kube_emulator.py, served over real HTTP on loopback), with
the real operator (`lading operator`, kopf) as its own process, as in a cluster, and real PostgreSQL.

Measured:
- admission: from the first create request until every batch shows Admitted=True in its status
  (so the time includes watch delivery, acceptance of 100,000 jobs and the status write);
- API traffic at steady state: every request the emulator served during one minute after the
  admission burst settled (no workers run, so nothing changes: what is left is the operator's
  own refresh and watch traffic), per batch per minute. The operator runs with its production
  defaults (status refresh at most every 30 s, pool reconcile every 15 s).

Also reported: the CPU (user + system) during admission of the operator, of this process (the
emulator and the client creating the batches) and of the PostgreSQL backends serving the database,
and the load average before and after, since on a shared machine the admission time depends on it.

Targets: all admitted within 10 s; at most 1 request per batch per minute at steady state.

Environment, for profiling:
- LADING_BENCH_OPERATOR_STEADY_S: the steady-state window in seconds (60 by default; 0 skips it);
- LADING_BENCH_OPERATOR_PYSPY: a file to write a py-spy profile of the operator during admission to
  (`py-spy record --format raw`; py-spy from $PATH or $PY_SPY).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pathlib
import shutil
import signal
import sys
import tempfile
import time
from typing import Any

import asyncpg

_ROOT = pathlib.Path(__file__).resolve().parent.parent
for _source_root in (_ROOT / "operator", _ROOT):
    if str(_source_root) not in sys.path:
        sys.path.insert(0, str(_source_root))

import bench_compare  # noqa: E402
from lading_operator import kube  # noqa: E402

from tests.support import kube_emulator  # noqa: E402

BATCHES = 100
DOCUMENTS = 1_000
NAMESPACE = "bench-operator"
"""Not `bench`: hack/bench.py seeds a tenant covering that namespace, and a namespace two quotas cover
admits nothing (NoTenantQuota)."""
TARGET_ADMISSION_S = 10.0
TARGET_REQUESTS_PER_BATCH_PER_MIN = 1.0
STEADY_WINDOW_S = float(os.environ.get("LADING_BENCH_OPERATOR_STEADY_S", "60"))
SETTLE_S = 5.0
GROUP_VERSION = "lading.dev/v1alpha1"
BATCH_RESOURCE = f"{GROUP_VERSION}/extractionbatches"


def _batch(index: int) -> dict[str, Any]:
    documents = [
        {"key": f"inv-{index:03d}-{i:04d}", "text": f"Invoice INV-{index:03d}-{i:04d} from ACME GmbH, total {i}.00 EUR"}
        for i in range(DOCUMENTS)
    ]
    return {
        "apiVersion": GROUP_VERSION,
        "kind": "ExtractionBatch",
        "metadata": {"name": f"batch-{index:03d}", "namespace": NAMESPACE},
        "spec": {"schema": "invoice.v1", "inferencePoolRef": {"name": "bench"}, "documents": documents},
    }


async def _start_operator(kubeconfig: pathlib.Path, url: str, log: pathlib.Path) -> asyncio.subprocess.Process:
    """`lading operator` as its own process, as in a cluster (its CPU is not shared with the emulator's)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(str(_ROOT / p) for p in ("", "operator", "worker", "cli", "webhook_receiver"))
    env.pop("LADING_FAILPOINTS", None)
    with log.open("ab") as handle:
        return await asyncio.create_subprocess_exec(
            sys.executable, "-c", "import sys; from lading_cli.main import main; sys.exit(main())",
            "operator", "--kubeconfig", str(kubeconfig), "--database-url", url, "--http", "127.0.0.1:0",
            "--pool-namespaces", NAMESPACE,  # the bench pool's namespace is a platform namespace here
            env=env, stdout=handle, stderr=handle,
        )  # fmt: skip


async def _until_ready(
    emulator: kube_emulator.KubeEmulator, process: asyncio.subprocess.Process, log: pathlib.Path
) -> None:
    """Wait until the operator has its watches open (it lists TenantQuotas once it runs)."""
    for _ in range(600):
        if process.returncode is not None:
            raise RuntimeError(f"the operator exited with {process.returncode}; see its log {log}")
        await asyncio.sleep(0.1)
        if any(k.startswith("WATCH extractionbatches") for k in emulator.breakdown()):
            await asyncio.sleep(1.0)
            return
    raise RuntimeError("the operator did not start watching within 60 s")


@contextlib.asynccontextmanager
async def _postgres(url: str) -> Any:
    """CPU of the PostgreSQL backends serving the bench's database (bench_compare.PostgresCpu)."""
    conn = await asyncpg.connect(url)
    try:
        yield bench_compare.PostgresCpu(conn)
    finally:
        await conn.close()


def _peak_rss_mb(pid: int) -> float | None:
    """The peak resident memory of process `pid` so far (VmHWM), in MiB."""
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return round(int(line.split()[1]) / 1024, 1)
    return None


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system) process `pid` has used so far."""
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextlib.asynccontextmanager
async def _profiling(pid: int) -> Any:
    """py-spy recording the operator while the body runs, when LADING_BENCH_OPERATOR_PYSPY names a file."""
    output = os.environ.get("LADING_BENCH_OPERATOR_PYSPY")
    if not output:
        yield
        return
    executable = os.environ.get("PY_SPY") or shutil.which("py-spy") or "py-spy"
    spy = await asyncio.create_subprocess_exec(
        executable, "record", "--pid", str(pid), "--rate", "200", "--format", "raw", "--nonblocking",
        "--output", output, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    await asyncio.sleep(0.5)  # attached before the burst
    try:
        yield
    finally:
        spy.send_signal(signal.SIGINT)
        await asyncio.wait_for(spy.wait(), 30)


def _admitted(obj: dict[str, Any] | None) -> bool:
    if obj is None:
        return False
    return any(c["type"] == "Admitted" and c["status"] == "True" for c in obj.get("status", {}).get("conditions", []))


async def bench_operator(url: str) -> tuple[dict[str, Any], dict[str, Any], bool]:
    async with kube_emulator.serving(validate=False) as emulator:
        with tempfile.TemporaryDirectory() as tmp:
            kubeconfig = kube_emulator.write_kubeconfig(
                pathlib.Path(tmp) / "kubeconfig", server=str(emulator.servers[0].url).rstrip("/")
            )
            log = pathlib.Path(tmp) / "operator.log"
            process = await _start_operator(kubeconfig, url, log)
            try:
                await _until_ready(emulator, process, log)
                async with kube.Client(await kube.load(str(kubeconfig))) as api:
                    await api.create(
                        kube.path(GROUP_VERSION, "tenantquotas", namespace=None),
                        {"apiVersion": GROUP_VERSION, "kind": "TenantQuota", "metadata": {"name": "bench-tenant"},
                         "spec": {"namespaces": [NAMESPACE], "maxQueuedJobs": 1_000_000}},
                    )  # fmt: skip
                    await api.create(
                        kube.path(GROUP_VERSION, "inferencepools", namespace=NAMESPACE),
                        {"apiVersion": GROUP_VERSION, "kind": "InferencePool",
                         "metadata": {"name": "bench", "namespace": NAMESPACE}, "spec": {"provider": "builtin"}},
                    )  # fmt: skip
                    await asyncio.sleep(1.0)  # the pool is mirrored before the burst (it is not what is measured)
                    bodies = [_batch(i) for i in range(BATCHES)]
                    load_before = os.getloadavg()
                    async with _postgres(url) as postgres, _profiling(process.pid):
                        requests_before = emulator.count()
                        cpu_before = _cpu_s(process.pid)
                        own_cpu_before = time.process_time()
                        await postgres.start()
                        started = time.perf_counter()
                        collection = kube.path(GROUP_VERSION, "extractionbatches", namespace=NAMESPACE)
                        await asyncio.gather(*(api.create(collection, body) for body in bodies))
                        created_s = time.perf_counter() - started
                        admission_s: float | None = None
                        names = [b["metadata"]["name"] for b in bodies]
                        while time.perf_counter() - started < 120:
                            if all(_admitted(emulator.stored(BATCH_RESOURCE, NAMESPACE, name)) for name in names):
                                admission_s = time.perf_counter() - started
                                break
                            await asyncio.sleep(0.05)
                        admission_cpu_s = _cpu_s(process.pid) - cpu_before
                        own_cpu_s = time.process_time() - own_cpu_before
                        postgres_cpu_s = await postgres.stop()
                    load_after = os.getloadavg()
                    burst_requests = emulator.count() - requests_before
                    burst_breakdown = emulator.breakdown(requests_before)
                    await asyncio.sleep(SETTLE_S if STEADY_WINDOW_S else 0.0)
                    steady_from = emulator.count()
                    steady_cpu_before = _cpu_s(process.pid)
                    await asyncio.sleep(STEADY_WINDOW_S)
                    steady_requests = emulator.count() - steady_from
                    steady_cpu_s = _cpu_s(process.pid) - steady_cpu_before
                    steady_breakdown = emulator.breakdown(steady_from)
                    operator_peak_rss_mb = _peak_rss_mb(process.pid)
                    sample = emulator.stored(BATCH_RESOURCE, NAMESPACE, "batch-000") or {}
                    annotations = sample.get("metadata", {}).get("annotations", {})
            finally:
                process.terminate()
                code = await asyncio.wait_for(process.wait(), 60)
                if code != 0:
                    raise RuntimeError(f"the operator exited with {code}: {log.read_text()[-2000:]}")
    per_batch_per_min = steady_requests / BATCHES / (STEADY_WINDOW_S / 60.0) if STEADY_WINDOW_S else 0.0
    results = {
        "batches": BATCHES,
        "documents_per_batch": DOCUMENTS,
        "create_requests_s": round(created_s, 2),
        "all_admitted_s": None if admission_s is None else round(admission_s, 2),
        "operator_cpu_s_during_admission": round(admission_cpu_s, 2),
        "emulator_and_client_cpu_s_during_admission": round(own_cpu_s, 2),
        "postgres_cpu_s_during_admission": postgres_cpu_s,
        "load_average_before_admission": [round(x, 2) for x in load_before],
        "load_average_after_admission": [round(x, 2) for x in load_after],
        "operator_cpu_s_per_steady_minute": round(steady_cpu_s * 60 / STEADY_WINDOW_S, 2) if STEADY_WINDOW_S else None,
        "api_requests_during_admission": burst_requests,
        "api_requests_per_batch_during_admission": round(burst_requests / BATCHES, 2),
        "steady_window_s": STEADY_WINDOW_S,
        "steady_api_requests": steady_requests,
        "steady_requests_per_batch_per_min": round(per_batch_per_min, 3),
        "admission_requests_by_kind": burst_breakdown,
        "steady_requests_by_kind": steady_breakdown,
        "operator_peak_rss_mb": operator_peak_rss_mb,
        "batch_annotation_bytes": sum(len(k) + len(str(v)) for k, v in annotations.items()),
    }
    targets = {
        "all_admitted_s_max": TARGET_ADMISSION_S,
        "steady_requests_per_batch_per_min_max": TARGET_REQUESTS_PER_BATCH_PER_MIN,
    }
    passed = (
        admission_s is not None
        and admission_s <= TARGET_ADMISSION_S
        and per_batch_per_min <= TARGET_REQUESTS_PER_BATCH_PER_MIN
    )
    return results, targets, passed
