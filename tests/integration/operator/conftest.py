"""
Fixtures for operator tests: the Kubernetes emulator on a loopback port, a kubeconfig for it,
an API client, and the real operator (kopf) running in its own thread with its own event loop,
stopped cleanly after each test.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import pathlib
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
from lading_operator import app, kube, settings

from tests.support import kube_emulator

GROUP_VERSION = "lading.dev/v1alpha1"


@pytest.fixture
async def emulator() -> AsyncIterator[kube_emulator.KubeEmulator]:
    async with kube_emulator.serving() as emu:
        yield emu


@pytest.fixture
def kubeconfig(emulator: kube_emulator.KubeEmulator, tmp_path: pathlib.Path) -> pathlib.Path:
    return kube_emulator.write_kubeconfig(tmp_path / "kubeconfig", server=str(emulator.servers[0].url).rstrip("/"))


@pytest.fixture
async def api(kubeconfig: pathlib.Path) -> AsyncIterator[kube.Client]:
    async with kube.Client(await kube.load(str(kubeconfig))) as client:
        yield client


def fast_settings(database_url: str, kubeconfig: pathlib.Path, **overrides: Any) -> settings.OperatorSettings:
    values: dict[str, Any] = {
        "database_url": database_url,
        "kubeconfig": str(kubeconfig),
        "status_interval_s": 0.3,
        "idle_interval_s": 5.0,
        "quota_interval_s": 0.5,
        "pool_interval_s": 0.5,
        "retry_initial_s": 0.2,
        "retry_max_s": 1.0,
        "watch_server_timeout_s": 60,
        # Tests that are not about pool namespaces put pools where they like; those that are pass their own.
        "pool_namespaces": ("lading-system", "acme", "gpu"),
    }
    values.update(overrides)
    return settings.OperatorSettings(**values)


@dataclasses.dataclass
class OperatorThread:
    thread: threading.Thread
    stop: threading.Event
    ready: threading.Event
    failure: list[BaseException]


@contextlib.contextmanager
def operator_thread(config: settings.OperatorSettings) -> Iterator[OperatorThread]:
    """The real operator in a thread with its own loop; stopped and joined at the end of the block."""
    stop, ready = threading.Event(), threading.Event()
    failure: list[BaseException] = []

    def main() -> None:
        try:
            asyncio.run(app.operate(config, stop_flag=stop, ready_flag=ready))
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=main, name="lading-operator", daemon=True)
    thread.start()
    handle = OperatorThread(thread, stop, ready, failure)
    try:
        yield handle
    finally:
        stop.set()
        thread.join(30)
        assert not thread.is_alive(), "the operator did not stop within 30 s"
        if failure:
            raise failure[0]


@pytest.fixture
def operator_factory(
    database_url: str, kubeconfig: pathlib.Path
) -> Iterator[Callable[..., contextlib.AbstractContextManager[OperatorThread]]]:
    def start(**overrides: Any) -> contextlib.AbstractContextManager[OperatorThread]:
        return operator_thread(fast_settings(database_url, kubeconfig, **overrides))

    yield start


@pytest.fixture
async def operator(
    db: Any, operator_factory: Callable[..., contextlib.AbstractContextManager[OperatorThread]]
) -> AsyncIterator[OperatorThread]:
    with operator_factory() as handle:
        await asyncio.get_running_loop().run_in_executor(None, handle.ready.wait, 30)
        yield handle


# --- Object helpers.


def batch_path(namespace: str, name: str | None = None, sub: str | None = None) -> str:
    return kube.path(GROUP_VERSION, "extractionbatches", namespace=namespace, name=name, sub=sub)


def quota_body(name: str, namespaces: list[str], **spec: Any) -> dict[str, Any]:
    return {"apiVersion": GROUP_VERSION, "kind": "TenantQuota", "metadata": {"name": name},
            "spec": {"namespaces": namespaces, **spec}}  # fmt: skip


def pool_body(namespace: str, name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": GROUP_VERSION, "kind": "InferencePool", "metadata": {"name": name, "namespace": namespace},
            "spec": {"provider": "builtin", **spec}}  # fmt: skip


def batch_body(namespace: str, name: str, *, documents: int, pool: str = "builtin", **spec: Any) -> dict[str, Any]:
    docs = [{"key": f"inv-{i:04d}", "text": f"Invoice INV-{i:04d} total 100.00 EUR"} for i in range(documents)]
    return {
        "apiVersion": GROUP_VERSION,
        "kind": "ExtractionBatch",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"schema": "invoice.v1", "inferencePoolRef": {"name": pool}, "documents": docs, **spec},
    }


async def create_quota(api: kube.Client, name: str, namespaces: list[str], **spec: Any) -> dict[str, Any]:
    return await api.create(
        kube.path(GROUP_VERSION, "tenantquotas", namespace=None), quota_body(name, namespaces, **spec)
    )


async def create_pool(api: kube.Client, namespace: str, name: str, **spec: Any) -> dict[str, Any]:
    path = kube.path(GROUP_VERSION, "inferencepools", namespace=namespace)
    return await api.create(path, pool_body(namespace, name, **spec))


async def create_batch(api: kube.Client, namespace: str, name: str, *, documents: int, **spec: Any) -> dict[str, Any]:
    return await api.create(batch_path(namespace), batch_body(namespace, name, documents=documents, **spec))
