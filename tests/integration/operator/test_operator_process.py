"""
`lading operator` as a real process: killed in the middle of admitting (SIGKILL from a failpoint
inside the acceptance transaction), restarted, and nothing is inserted twice.
"""

from __future__ import annotations

import asyncio
import pathlib
import sys

import aiohttp
import asyncpg
from lading_operator import kube

from tests.integration.operator import conftest
from tests.support import kube_emulator, processes
from tests.support.waiting import until

BATCHES = "lading.dev/v1alpha1/extractionbatches"
LAUNCH = "import sys; from lading_cli.main import main; sys.exit(main())"


async def _start(
    kubeconfig: pathlib.Path, database_url: str, log: pathlib.Path, *extra: str, failpoints: str | None = None
) -> asyncio.subprocess.Process:
    env = processes.environment(**({"LADING_FAILPOINTS": failpoints} if failpoints else {}))
    handle = log.open("ab")
    try:
        return await asyncio.create_subprocess_exec(
            sys.executable, "-c", LAUNCH, "--log-level", "INFO", "operator", "--kubeconfig", str(kubeconfig),
            "--database-url", database_url, "--pool-namespaces", "acme", *extra, env=env, stdout=handle, stderr=handle,
        )  # fmt: skip
    finally:
        handle.close()


async def test_operator_killed_mid_admission_and_restarted_inserts_nothing_twice(
    emulator: kube_emulator.KubeEmulator,
    api: kube.Client,
    db: asyncpg.Connection,
    kubeconfig: pathlib.Path,
    database_url: str,
    tmp_path: pathlib.Path,
) -> None:
    await conftest.create_quota(api, "acme", ["acme"])
    await conftest.create_pool(api, "acme", "builtin")
    for name, documents in (("one", 40), ("two", 30), ("three", 20)):
        await conftest.create_batch(api, "acme", name, documents=documents)
    log = tmp_path / "operator.log"

    # The second acceptance to write its job and document rows dies before its commit. Admissions
    # of one tenant run concurrently, so the first may or may not have committed by then.
    first = await _start(kubeconfig, database_url, log, failpoints="accept.after_bulk_inserts=kill@2")
    try:
        assert await asyncio.wait_for(first.wait(), 60) == -9, log.read_text()[-3000:]
    finally:
        await processes.stop(first)
    committed = await db.fetchval("SELECT count(*) FROM batches")
    assert committed <= 1
    assert await db.fetchval("SELECT count(*) FROM extraction_jobs") in (0, 40, 30, 20)

    # A second crash just before COMMIT of the first admission to get there: nothing more commits.
    second = await _start(kubeconfig, database_url, log, failpoints="accept.before_commit=kill")
    try:
        assert await asyncio.wait_for(second.wait(), 60) == -9, log.read_text()[-3000:]
    finally:
        await processes.stop(second)
    assert await db.fetchval("SELECT count(*) FROM batches") == committed

    third = await _start(kubeconfig, database_url, log, "--http", "127.0.0.1:0")
    try:

        async def all_running() -> bool:
            objects = [emulator.stored(BATCHES, "acme", n) for n in ("one", "two", "three")]
            return all(o is not None and o.get("status", {}).get("phase") == "Running" for o in objects)

        await until(all_running, timeout_s=30)
    finally:
        third.terminate()
        assert await asyncio.wait_for(third.wait(), 30) == 0, log.read_text()[-3000:]
    assert await db.fetchval("SELECT count(*) FROM batches") == 3
    assert await db.fetchval("SELECT count(*) FROM extraction_jobs") == 90
    assert await db.fetchval("SELECT count(*) FROM job_documents") == 90
    duplicates = await db.fetchval(
        "SELECT count(*) FROM (SELECT batch_id, document_key FROM extraction_jobs GROUP BY 1, 2 HAVING count(*) > 1) d"
    )
    assert duplicates == 0
    for name, documents in (("one", 40), ("two", 30), ("three", 20)):
        obj = emulator.stored(BATCHES, "acme", name)
        assert obj is not None and obj["status"]["total"] == documents


async def test_health_endpoints_of_the_operator(
    emulator: kube_emulator.KubeEmulator,
    db: asyncpg.Connection,
    kubeconfig: pathlib.Path,
    database_url: str,
    tmp_path: pathlib.Path,
    unused_tcp_port: int,
) -> None:
    log = tmp_path / "operator.log"
    process = await _start(kubeconfig, database_url, log, "--http", f"127.0.0.1:{unused_tcp_port}")
    try:
        async with aiohttp.ClientSession() as session:

            async def ready() -> bool:
                try:
                    async with session.get(f"http://127.0.0.1:{unused_tcp_port}/readyz") as response:
                        return response.status == 200
                except aiohttp.ClientError:
                    return False

            await until(ready, timeout_s=30)
            async with session.get(f"http://127.0.0.1:{unused_tcp_port}/metrics") as response:
                assert response.status == 200
    finally:
        process.terminate()
        assert await asyncio.wait_for(process.wait(), 30) == 0, log.read_text()[-3000:]
