"""
The real RabbitMQ the event tests need, and per-test topology names.

`amqp_url()`: `$AMQP_URL`, else the local broker on 127.0.0.1:5672 (guest/guest). If it is not
reachable and a `rabbitmq-server` binary exists, it is started (`-detached`) and waited for;
if the broker still cannot be reached the test fails with a message saying so, never skips.

Each test declares its topology under a unique name prefix and deletes it at the end, so runs
on one broker (and one vhost) never see each other's messages.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import secrets
import shutil
import subprocess
import time
import urllib.parse
from collections.abc import AsyncIterator

import aio_pika
import aio_pika.abc
import pytest

from lading.events import topology
from lading.settings import BrokerTopology

LOCAL_URL = "amqp://guest:guest@127.0.0.1:5672/"
START_TIMEOUT_S = 90.0


async def reachable(url: str) -> bool:
    try:
        connection = await aio_pika.connect(url, timeout=3)
    except Exception:  # any failure to connect means: not reachable
        return False
    await connection.close()
    return True


def amqp_url() -> str:
    url = os.environ.get("AMQP_URL") or LOCAL_URL
    if asyncio.run(reachable(url)):
        return url
    server = shutil.which("rabbitmq-server") or (
        "/usr/sbin/rabbitmq-server" if os.path.exists("/usr/sbin/rabbitmq-server") else None
    )
    if server is None:
        pytest.fail(f"RabbitMQ is not reachable at {_redacted(url)} and no rabbitmq-server binary is installed; "
                    "start a broker or set $AMQP_URL")  # fmt: skip
    subprocess.run([server, "-detached"], check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if asyncio.run(reachable(url)):
            return url
        time.sleep(1)
    pytest.fail(f"RabbitMQ is not reachable at {_redacted(url)}, even after starting {server} -detached "
                f"and waiting {START_TIMEOUT_S:.0f} s")  # fmt: skip


def _redacted(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    return f"{parts.scheme}://{parts.hostname}:{parts.port or 5672}{parts.path}"


def through(url: str, *, port: int) -> str:
    """The same URL pointed at 127.0.0.1:`port` (a fault proxy in front of the broker)."""
    parts = urllib.parse.urlsplit(url)
    credentials = parts.netloc.rpartition("@")[0]
    netloc = f"{credentials}@127.0.0.1:{port}" if credentials else f"127.0.0.1:{port}"
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, parts.query, ""))


def target(url: str) -> tuple[str, int]:
    parts = urllib.parse.urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or 5672


def unique_topology(**overrides: object) -> BrokerTopology:
    prefix = f"test.{os.getpid()}.{secrets.token_hex(3)}."
    return dataclasses.replace(BrokerTopology(prefix=prefix), **overrides)  # type: ignore[arg-type]


@contextlib.asynccontextmanager
async def declared(url: str, names: BrokerTopology) -> AsyncIterator[aio_pika.abc.AbstractChannel]:
    """Declare the topology for a test, yield a channel on it, delete everything afterwards."""
    connection = await aio_pika.connect(url, timeout=10)
    try:
        channel = await connection.channel()
        await topology.declare(channel, names)
        try:
            yield channel
        finally:
            cleanup = await connection.channel()
            await topology.delete(cleanup, names)
    finally:
        await connection.close()


async def queue_depth(channel: aio_pika.abc.AbstractChannel, name: str) -> int:
    """Messages ready in a queue (a passive declare)."""
    queue = await channel.declare_queue(name, passive=True)
    count = queue.declaration_result.message_count
    return int(count or 0)
