"""
Real worker processes deliver: secrets from a mounted directory, loopback allowed by
`--egress-allow`, a dispatcher SIGKILLed between sending and recording leaves its deliveries to
another replica, which sends them again with the same delivery id (the receiver dedups).
"""

from __future__ import annotations

import asyncio
import dataclasses
import pathlib
import signal

import asyncpg
import pytest
import standardwebhooks

from lading import accepting
from lading_demo import generator
from tests.integration.delivery import helpers
from tests.support import erp_stub, factories, processes, waiting

pytestmark = pytest.mark.slow

ARGS = ["--poll-interval", "0.1", "--reaper-interval", "0.2", "--egress-allow", "127.0.0.0/8",
        "--delivery-lease-ttl", "2"]  # fmt: skip


async def _accept(db: asyncpg.Connection, count: int) -> list[int]:
    await factories.seed(db)
    samples = [s for s in generator.generate(count * 3, seed=11) if s.expected_state == "SUCCEEDED"][:count]
    request = dataclasses.replace(
        factories.batch_request(count=0), endpoint=helpers.ENDPOINT,
        documents=[accepting.DocumentInput(key=s.key, text=s.text) for s in samples],
    )  # fmt: skip
    return list((await accepting.accept_batch(db, request)).job_ids)


async def _delivered(db: asyncpg.Connection, n: int) -> bool:
    return await helpers.states(db) == {"DELIVERED": n}


async def test_a_worker_delivers_signed_with_the_mounted_secret_and_a_killed_dispatchers_deliveries_are_resent(
        db: asyncpg.Connection, database_url: str, tmp_path: pathlib.Path,
) -> None:
    secrets_dir = tmp_path / "endpoint-secrets"
    secrets_dir.mkdir()
    (secrets_dir / "acme.erp").write_text(helpers.SECRET + "\n")
    secret_args = ["--endpoint-secrets-dir", str(secrets_dir)]
    async with erp_stub.running() as erp:
        await helpers.register(db, erp.webhook_url)
        job_ids = await _accept(db, 8)
        doomed = await processes.start_worker(
            database_url, factories.POOL, args=[*ARGS, *secret_args],
            failpoints="delivery.after_send_before_record=kill", log=tmp_path / "doomed.log",
        )  # fmt: skip
        try:
            assert await asyncio.wait_for(doomed.wait(), 60) == -signal.SIGKILL
        finally:
            await processes.stop(doomed)
        first_round = set(erp.ids())
        assert first_round, "the killed dispatcher had sent before dying"
        # Its lanes may also have claimed deliveries they had not sent yet (or whose request the
        # stub had not read yet): those are in flight too, and are sent by the survivor.
        in_flight = {r["id"] for r in await db.fetch(
            "SELECT delivery_id::text AS id FROM deliveries WHERE state = 'IN_FLIGHT'"
        )}  # fmt: skip
        assert first_round <= in_flight, "nothing the killed dispatcher sent was recorded as delivered"

        survivor = await processes.start_worker(
            database_url, factories.POOL, args=[*ARGS, *secret_args], log=tmp_path / "survivor.log"
        )
        try:
            await waiting.until(lambda: _accepted_then(db, len(job_ids)), timeout_s=60)
        finally:
            survivor.send_signal(signal.SIGTERM)
            await asyncio.wait_for(survivor.wait(), 30)

    for request in erp.requests:
        standardwebhooks.Webhook(helpers.SECRET).verify(request.body, request.headers)
    ids = erp.ids()
    assert len(set(ids)) == len(job_ids)
    resent = {i for i in ids if ids.count(i) > 1}
    assert first_round <= resent <= in_flight, "what was sent before the kill was sent again, nothing else twice"
    rows = await db.fetch("SELECT delivery_id::text AS id, ambiguous_attempts FROM deliveries")
    assert {r["id"] for r in rows if r["ambiguous_attempts"] == 1} == in_flight


async def _accepted_then(db: asyncpg.Connection, n: int) -> bool:
    jobs_done = await db.fetchval("SELECT count(*) FROM extraction_jobs WHERE state = 'SUCCEEDED'") == n
    return jobs_done and await _delivered(db, n)


async def test_two_worker_processes_deliver_each_result_once_and_never_one_delivery_twice_at_a_time(
        db: asyncpg.Connection, database_url: str, tmp_path: pathlib.Path,
) -> None:
    secrets_dir = tmp_path / "endpoint-secrets"
    secrets_dir.mkdir()
    (secrets_dir / "acme.erp").write_text(helpers.SECRET + "\n")
    async with erp_stub.running() as erp:
        erp.reply = erp_stub.slow(0.1)
        await helpers.register(db, erp.webhook_url)
        job_ids = await helpers.succeed(db, count=60)  # only the dispatchers have work: 60 x 0.1 s over 8 slots
        args = [*ARGS, "--endpoint-secrets-dir", str(secrets_dir), "--delivery-concurrency", "4"]
        workers = [
            await processes.start_worker(database_url, factories.POOL, args=args, log=tmp_path / f"worker-{i}.log")
            for i in range(2)
        ]
        try:
            await waiting.until(lambda: _accepted_then(db, len(job_ids)), timeout_s=60)
        finally:
            for worker in workers:
                worker.send_signal(signal.SIGTERM)
            for worker in workers:
                await asyncio.wait_for(worker.wait(), 30)
    ids = erp.ids()
    assert sorted(ids) == sorted(set(ids)) and len(ids) == len(job_ids), "each result delivered exactly once"
    assert max(erp.max_in_flight_per_id.values()) == 1
    owners = {r["owner"] for r in await db.fetch("SELECT DISTINCT owner FROM delivery_attempts")}
    assert len(owners) == 2, "both processes delivered"
