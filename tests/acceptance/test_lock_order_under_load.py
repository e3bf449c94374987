"""
Under load, with every loop running in two real worker processes (claimer, executor, group
commit, heartbeater, reaper, outbox relay, ingress, two delivery lanes each) and deliveries to
two endpoints interleaved in every round, PostgreSQL detects no deadlock: every statement that
locks several rows locks them in one canonical order (docs/architecture.md, "Lock order").

`deadlock_timeout` is lowered to 5 ms for the workers' connections, so a lock cycle that formed
even briefly is detected and counted in `pg_stat_database.deadlocks`, which must not move.
"""

from __future__ import annotations

import asyncio
import dataclasses
import pathlib
import signal

import asyncpg
import pytest

from lading import accepting
from lading_demo import generator
from tests.integration.delivery import helpers
from tests.support import broker, deadlocks, erp_stub, factories, processes, waiting

pytestmark = pytest.mark.slow

X, Y = "acme/erp-x", "acme/erp-y"
PER_ENDPOINT = 150
WORKERS = 2
ARGS = [
    "--poll-interval", "0.05", "--reaper-interval", "0.1", "--heartbeat-interval", "0.1", "--lease-ttl", "5",
    "--concurrency", "32", "--claim-batch", "16", "--egress-allow", "127.0.0.0/8", "--delivery-concurrency", "16",
    "--delivery-lease-ttl", "5",
]  # fmt: skip


async def _accept(db: asyncpg.Connection, *, name: str, endpoint: str, seed: int) -> int:
    samples = [s for s in generator.generate(PER_ENDPOINT * 3, seed=seed) if s.expected_state == "SUCCEEDED"]
    samples = samples[:PER_ENDPOINT]
    request = dataclasses.replace(
        factories.batch_request(name=name, count=0), endpoint=endpoint,
        documents=[accepting.DocumentInput(key=s.key, text=s.text) for s in samples],
    )  # fmt: skip
    return len((await accepting.accept_batch(db, request)).job_ids)


async def _done(db: asyncpg.Connection, jobs: int) -> bool:
    row = await db.fetchrow(
        "SELECT (SELECT count(*) FROM extraction_jobs WHERE state = 'SUCCEEDED') AS succeeded,"
        "       (SELECT count(*) FROM deliveries WHERE state = 'DELIVERED') AS delivered,"
        "       (SELECT count(*) FROM outbox_events WHERE published_at IS NULL) AS unpublished"
    )
    assert row is not None
    return bool(row["succeeded"] == jobs and row["delivered"] == jobs and row["unpublished"] == 0)


async def test_every_loop_under_load_meets_no_deadlock(
        db: asyncpg.Connection, database_url: str, amqp_url: str, tmp_path: pathlib.Path,
) -> None:
    secrets_dir = tmp_path / "endpoint-secrets"
    secrets_dir.mkdir()
    for name in (X, Y):
        (secrets_dir / name.replace("/", ".")).write_text(helpers.SECRET + "\n")
    names = broker.unique_topology()
    url, app = deadlocks.tagged(database_url)
    args = [*ARGS, "--endpoint-secrets-dir", str(secrets_dir), "--topology-prefix", names.prefix]
    async with erp_stub.running() as erp, broker.declared(amqp_url, names), deadlocks.fast_detection(db):
        erp.reply = erp_stub.slow(0.05)  # rounds fill up and their lanes record at about the same time
        for name in (X, Y):
            await helpers.register(db, erp.webhook_url, name=name)
        await factories.seed(db)
        jobs = await _accept(db, name="bx", endpoint=X, seed=21) + await _accept(db, name="by", endpoint=Y, seed=22)
        before = await deadlocks.count(db)
        workers = [
            await processes.start_worker(
                url, factories.POOL, args=args, log=tmp_path / f"worker-{i}.log", env={"LADING_AMQP_URL": amqp_url}
            )
            for i in range(WORKERS)
        ]
        try:
            await waiting.until(lambda: _done(db, jobs), timeout_s=45)
        finally:
            for worker in workers:
                if worker.returncode is None:
                    worker.send_signal(signal.SIGTERM)
            for worker in workers:
                try:
                    await asyncio.wait_for(worker.wait(), 30)
                finally:
                    await processes.stop(worker)
        await deadlocks.settled(db, application_name=app)
        after = await deadlocks.count(db)

    logs = "".join((tmp_path / f"worker-{i}.log").read_text(errors="replace") for i in range(WORKERS))
    assert after - before == 0, f"{after - before} deadlocks detected under load"
    assert "deadlock detected" not in logs
    ids = erp.ids()
    assert len(ids) == jobs and len(set(ids)) == jobs, "each result delivered exactly once"
    owners = {r["owner"] for r in await db.fetch("SELECT DISTINCT owner FROM delivery_attempts")}
    assert len(owners) == WORKERS, "both processes delivered"
