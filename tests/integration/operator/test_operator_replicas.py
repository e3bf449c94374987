"""
Two `lading operator --peering` processes, one active: the active one is SIGKILLed, the standby
takes over within the peering lifetime plus a bound, and nothing is admitted twice.

kopf peering, as configured by `app.kopf_settings`: both replicas keep a record (priority, last seen,
lifetime) in the ClusterKopfPeering's status; each draws a random priority at start, and the one with
the lower priority pauses while the other's record is alive. Which replica is active is read from
those records, as an operator on a cluster would (`kubectl get clusterkopfpeering -o yaml`).
"""

from __future__ import annotations

import asyncio
import pathlib
import signal
import sys
import time
from typing import Any

import asyncpg
import pytest
from lading_operator import kube

from tests.integration.operator import conftest
from tests.integration.operator import test_api_calls_and_rbac as rbac
from tests.integration.operator import test_operator_process as operator_process
from tests.support import kube_emulator, processes
from tests.support.waiting import until

BATCHES = "lading.dev/v1alpha1/extractionbatches"
PEERINGS = "kopf.dev/v1/clusterkopfpeerings"
PEERING = "lading"
LIFETIME_S = 3
TAKEOVER_BOUND_S = LIFETIME_S + 12
"""The standby resumes once the dead record is LIFETIME_S old, then lists and admits what waited."""
PAUSED, RESUMED = "Pausing operations in favour of", "Resuming operations after the pause"
"""kopf's log lines when a replica stands by and when it becomes the active one."""


def _state(log: pathlib.Path) -> str:
    """'active' when the replica's last peering decision was to resume, else 'paused' (also before any)."""
    decisions = [line for line in log.read_text().splitlines() if PAUSED in line or RESUMED in line]
    return "active" if decisions and RESUMED in decisions[-1] else "paused"


def _records(emulator: kube_emulator.KubeEmulator) -> dict[str, Any]:
    peering = emulator.stored(PEERINGS, None, PEERING)
    return dict((peering or {}).get("status") or {})


def _running(emulator: kube_emulator.KubeEmulator, name: str) -> bool:
    obj = emulator.stored(BATCHES, "acme", name)
    return obj is not None and obj.get("status", {}).get("phase") == "Running"


@pytest.mark.slow
async def test_the_standby_replica_takes_over_when_the_active_one_is_killed_and_admits_nothing_twice(
    emulator: kube_emulator.KubeEmulator,
    api: kube.Client,
    db: asyncpg.Connection,
    kubeconfig: pathlib.Path,
    database_url: str,
    tmp_path: pathlib.Path,
) -> None:
    peering = {"apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering", "metadata": {"name": PEERING}}
    await api.create(kube.path("kopf.dev/v1", "clusterkopfpeerings", namespace=None), peering)
    await conftest.create_quota(api, "acme", ["acme"])
    await conftest.create_pool(api, "acme", "builtin")
    await conftest.create_batch(api, "acme", "one", documents=20)
    flags = ("--peering", "--peering-name", PEERING, "--peering-lifetime", str(LIFETIME_S))
    replicas: dict[str, asyncio.subprocess.Process] = {}
    logs = {name: tmp_path / f"{name}.log" for name in ("op-a", "op-b")}
    try:
        for name in ("op-a", "op-b"):
            replicas[name] = await _start(kubeconfig, database_url, logs[name], name, *flags)
        await until(lambda: _true(set(_records(emulator)) == {"op-a", "op-b"}), timeout_s=30)
        records = _records(emulator)
        active = max(records, key=lambda name: records[name]["priority"])
        standby = next(name for name in records if name != active)
        # kopf starts paused until it has seen its peers; the one of lower priority stays (or goes back) paused.
        await until(lambda: _true(_state(logs[active]) == "active" and _state(logs[standby]) == "paused"))
        await until(lambda: _true(_running(emulator, "one")), timeout_s=30)
        await conftest.create_batch(api, "acme", "two", documents=30)
        await until(lambda: _true(_running(emulator, "two")), timeout_s=30)
        assert _state(logs[standby]) == "paused", "the standby stayed paused while the active one admitted"

        replicas[active].send_signal(signal.SIGKILL)
        assert await asyncio.wait_for(replicas[active].wait(), 10) == -9
        killed_at = time.monotonic()
        await conftest.create_batch(api, "acme", "three", documents=40)
        await until(lambda: _true(_running(emulator, "three")), timeout_s=TAKEOVER_BOUND_S + 15)
        took_over_s = time.monotonic() - killed_at
        assert took_over_s <= TAKEOVER_BOUND_S, f"the standby took {took_over_s:.1f} s"
        assert _state(logs[standby]) == "active"
    finally:
        for process in replicas.values():
            await processes.stop(process)

    assert await db.fetchval("SELECT count(*) FROM batches") == 3
    assert await db.fetchval("SELECT count(*) FROM extraction_jobs") == 90
    duplicates = await db.fetchval(
        "SELECT count(*) FROM (SELECT batch_id, document_key FROM extraction_jobs GROUP BY 1, 2 HAVING count(*) > 1) d"
    )
    assert duplicates == 0
    # Peering's own calls are granted by the chart's RBAC (the test itself only created the object).
    peering_calls = {call for call in rbac.calls_since(emulator, 0) if call[0] == "kopf.dev" and call[2] != "create"}
    assert {("kopf.dev", "clusterkopfpeerings", "patch")} <= peering_calls <= rbac.granted()


async def _start(
    kubeconfig: pathlib.Path, database_url: str, log: pathlib.Path, name: str, *flags: str
) -> asyncio.subprocess.Process:
    handle = log.open("ab")
    try:
        return await asyncio.create_subprocess_exec(
            sys.executable, "-c", operator_process.LAUNCH, "--log-level", "INFO", "operator",
            "--kubeconfig", str(kubeconfig), "--database-url", database_url,
            "--pool-namespaces", "acme", *flags,
            env=processes.environment(POD_ID=name), stdout=handle, stderr=handle,
        )  # fmt: skip
    finally:
        handle.close()


async def _true(value: bool) -> bool:
    return value
