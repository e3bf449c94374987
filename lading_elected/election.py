"""
An election among every replica: one process holds a session-level advisory lock and does a
database-wide job (the gauge refresher, `lading_elected.gauges`; the GPU-time allocator,
`lading_elected.gpu_costs`; the worker's cleaner, `lading_worker.cleaning`), each job with its own
key, so they may be elected in different processes. The lock lives on a dedicated connection:
when the holder dies or loses its connection, PostgreSQL releases the lock and another replica
takes over within one interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Protocol

import asyncpg

from lading import looping
from lading.db import locks
from lading.db import pool as dbpool

logger = logging.getLogger(__name__)


class Election:
    """One process among every replica holds session-level advisory lock `key` on a dedicated
    connection; `leader` tells whether this one does. Used by the gauge refresher and the cleaner
    (`lading_worker.cleaning`), each with its own key."""

    def __init__(self, database_url: str, *, key: int, what: str) -> None:
        self._url = database_url
        self._key = key
        self._what = what
        self.conn: asyncpg.Connection | None = None
        self.leader = False

    async def stand(self) -> asyncpg.Connection | None:
        """Try to be (or stay) the leader; the election's connection if elected, else None."""
        if self.conn is None or self.conn.is_closed():
            self.conn = await dbpool.connect(self._url)
            self.leader = False
        if not self.leader:
            self.leader = await locks.try_session_lock(self.conn, key=self._key)
            if self.leader:
                logger.info("Elected to %s", self._what)
        return self.conn if self.leader else None

    async def resign(self) -> None:
        self.leader = False
        if self.conn is not None:
            with contextlib.suppress(Exception):
                await self.conn.close()  # closing the session releases the advisory lock
            self.conn = None


async def run_elected(
        stop: asyncio.Event,
        *,
        run_once: Callable[[], Awaitable[object]],
        resign: Callable[[], Awaitable[None]],
        interval_s: Callable[[], float],
        what: str,
) -> None:
    """The loop of an elected job (the gauge refresher, the cleaner): `run_once` stands for election
    and works if elected, every `interval_s()` until `stop`. A database failure resigns, so another
    replica may take over while this one reconnects; stopping always resigns."""
    try:
        while not stop.is_set():
            try:
                await run_once()
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
                logger.warning("%s failed: %s", what, exc)
                await resign()
            await looping.wait_or_stop(stop, interval_s())
    finally:
        await resign()


class RunsForever(Protocol):
    async def run_forever(self, stop: asyncio.Event) -> None: ...


@contextlib.asynccontextmanager
async def running(job: RunsForever, *, name: str, stop: asyncio.Event | None = None) -> AsyncIterator[None]:
    """Run an elected job's loop (`job.run_forever`) as the task `name` for the body of an `async
    with`; on exit stop it, wait for it, and re-raise what it failed with. `stop`, when given, also
    ends the loop once set, before the block ends (a caller whose framework stops first)."""
    stop = stop if stop is not None else asyncio.Event()
    task = asyncio.create_task(job.run_forever(stop), name=name)
    try:
        yield
    finally:
        stop.set()
        # Not `await task`: a framework that cancels every task of the loop at shutdown (kopf does)
        # may have cancelled it already, and that must not turn a clean exit into an error.
        await asyncio.wait([task])
        failure = None if task.cancelled() else task.exception()
        if failure is not None:
            raise failure
