"""
Real relay and consumer processes, real SIGKILL at named failpoints:

- a relay killed after the broker confirmed a batch but before it marked the rows published
  republishes them once its claim expires: every event reaches the broker twice, the inbox
  keeps one row each;
- a consumer killed after its inbox commit but before its ack gets the message redelivered:
  the redelivery is a no-op, one inbox row.
"""

from __future__ import annotations

import asyncio
import functools
import pathlib
import signal
import sys
from collections.abc import Sequence

import aio_pika.abc
import asyncpg
import pytest
from lading_worker import consuming, relaying

from lading.settings import BrokerTopology, EventSettings, IngressSettings, RelaySettings
from tests.support import broker, processes, waiting

pytestmark = pytest.mark.slow


async def _start(
        database_url: str,
        amqp_url: str,
        names: BrokerTopology,
        *,
        args: Sequence[str],
        failpoints: str,
        log: pathlib.Path,
) -> asyncio.subprocess.Process:
    handle = log.open("ab")
    try:
        return await asyncio.create_subprocess_exec(
            sys.executable, "-m", "lading_cli.relay", "--database-url", database_url,
            "--topology-prefix", names.prefix, *args,
            env=processes.environment(**({"LADING_FAILPOINTS": failpoints} if failpoints else {}),
                                      LADING_AMQP_URL=amqp_url),
            stdout=handle, stderr=handle,
        )  # fmt: skip
    finally:
        handle.close()


def _settings(names: BrokerTopology) -> EventSettings:
    return EventSettings(
        topology=names,
        relay=RelaySettings(claim_ttl_s=5, poll_interval_s=0.05, publish_timeout_s=2, reconnect_base_s=0.05),
        ingress=IngressSettings(reconnect_base_s=0.05),
    )


async def _add_events(db: asyncpg.Connection, n: int) -> None:
    await db.execute(
        "INSERT INTO outbox_events (event_id, aggregate_type, aggregate_id, type, payload)"
        " SELECT gen_random_uuid(), 'job', i, 'extraction.completed.v1', jsonb_build_object('job_id', i)"
        "   FROM generate_series(1, $1) i",
        n,
    )


async def _count(db: asyncpg.Connection, sql: str) -> int:
    return int(await db.fetchval(sql))


async def _handled(consumer: consuming.IngressConsumer, n: int) -> bool:
    c = consumer.counts
    return c.recorded + c.duplicate + c.quarantined + c.rejected >= n


async def _drained(db: asyncpg.Connection) -> bool:
    return await _count(db, "SELECT count(*) FROM outbox_events WHERE published_at IS NULL") == 0


async def test_a_relay_killed_between_confirm_and_mark_republishes_and_the_inbox_keeps_one_row_each(
        db: asyncpg.Connection, dbpool: asyncpg.Pool, database_url: str, amqp_url: str, tmp_path: pathlib.Path
) -> None:
    n = 20
    names = broker.unique_topology()
    await _add_events(db, n)
    async with broker.declared(amqp_url, names) as channel:
        doomed = await _start(
            database_url, amqp_url, names, log=tmp_path / "relay.log",
            args=["--no-ingress", "--claim-ttl", "2", "--publish-timeout", "1", "--poll-interval", "0.1"],
            failpoints="relay.after_publish_before_mark=kill",
        )  # fmt: skip
        try:
            assert await asyncio.wait_for(doomed.wait(), 60) == -signal.SIGKILL
        finally:
            await processes.stop(doomed)
        # Confirmed by the broker, never marked: still unpublished and claimed by the dead relay.
        assert await _count(db, "SELECT count(*) FROM outbox_events WHERE published_at IS NULL") == n
        assert await _count(db, "SELECT count(*) FROM outbox_events WHERE claim_owner LIKE 'relay-%'") == n
        assert await broker.queue_depth(channel, names.name(names.ingress_queue)) == n

        settings = _settings(names)
        survivor = relaying.OutboxRelay(dbpool, amqp_url=amqp_url, settings=settings)
        consumer = consuming.IngressConsumer(dbpool, amqp_url=amqp_url, settings=settings)
        async with waiting.running(consumer.run_forever), waiting.running(survivor.run_forever):
            await waiting.until(functools.partial(_drained, db), timeout_s=30)  # after the dead claim expired
            await waiting.until(functools.partial(_handled, consumer, 2 * n), timeout_s=30)
    assert (consumer.counts.recorded, consumer.counts.duplicate) == (n, n)
    assert await _count(db, "SELECT count(*) FROM execution_inbox") == n


async def test_a_consumer_killed_between_commit_and_ack_gets_a_redelivery_that_changes_nothing(
        db: asyncpg.Connection, dbpool: asyncpg.Pool, database_url: str, amqp_url: str, tmp_path: pathlib.Path
) -> None:
    n = 5
    names = broker.unique_topology()
    settings = _settings(names)
    await _add_events(db, n)
    async with broker.declared(amqp_url, names) as channel:
        publisher = relaying.OutboxRelay(dbpool, amqp_url=amqp_url, settings=settings)
        await publisher.connect()
        try:
            assert (await publisher.run_once()).marked == n
        finally:
            await publisher.close()
        doomed = await _start(
            database_url, amqp_url, names, log=tmp_path / "consumer.log",
            args=["--no-relay", "--prefetch", "1"],  # one message at a time: exactly one commit before the kill
            failpoints="ingress.after_commit_before_ack=kill",
        )  # fmt: skip
        try:
            assert await asyncio.wait_for(doomed.wait(), 60) == -signal.SIGKILL
        finally:
            await processes.stop(doomed)
        assert await _count(db, "SELECT count(*) FROM execution_inbox") == 1  # committed, never acked
        await waiting.until(lambda: _ready(channel, names, n), timeout_s=10)  # the broker requeued it

        consumer = consuming.IngressConsumer(dbpool, amqp_url=amqp_url, settings=settings)
        async with waiting.running(consumer.run_forever):
            await waiting.until(functools.partial(_handled, consumer, n), timeout_s=30)
    assert (consumer.counts.recorded, consumer.counts.duplicate) == (n - 1, 1)
    assert consumer.counts.redelivered >= 1
    assert await _count(db, "SELECT count(*) FROM execution_inbox") == n


async def _ready(channel: aio_pika.abc.AbstractChannel, names: BrokerTopology, n: int) -> bool:
    return await broker.queue_depth(channel, names.name(names.ingress_queue)) == n


async def test_lading_relay_relays_into_the_inbox_and_exits_cleanly_on_sigterm(
        db: asyncpg.Connection, database_url: str, amqp_url: str, tmp_path: pathlib.Path
) -> None:
    n = 10
    names = broker.unique_topology()
    await _add_events(db, n)
    async with broker.declared(amqp_url, names):
        process = await _start(database_url, amqp_url, names, log=tmp_path / "relay.log",
                               args=["--poll-interval", "0.1"], failpoints="")  # fmt: skip
        try:
            await waiting.until(functools.partial(_drained, db), timeout_s=30)
            await waiting.until(lambda: _inbox_has(db, n), timeout_s=30)
            process.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(process.wait(), 30) == 0
        finally:
            await processes.stop(process)
    assert "guest:guest" not in (tmp_path / "relay.log").read_text()  # the URL's password is never logged


async def _inbox_has(db: asyncpg.Connection, n: int) -> bool:
    return await _count(db, "SELECT count(*) FROM execution_inbox") == n
