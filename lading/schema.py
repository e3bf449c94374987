"""
Waiting for the schema: one migrator, every other process waits.

Only `lading migrate` applies Lading's migrations (in a cluster, the chart's pre-install and
pre-upgrade hook Job; `lading run` migrates the embedded database it owns). A worker, a relay or
the operator that starts against a database with pending migrations does not migrate it and does
not work against it: it waits here, says in its log which migrations it waits for and what to run,
and its /readyz answers 503 with the same reason (`lading.health`) until they are applied. Two
versions of the code never race to change the schema, and a process never runs its queries
against a schema older than its code.

    wait_until_current(dsn, stop)
      connect, read pending versions  ──▶ none pending: return True
      pending                          ──▶ log "waiting for migrations ...", look again after poll_s
      database unavailable             ──▶ log, back off (lading.looping), look again
      stop set                         ──▶ return False
"""

from __future__ import annotations

import asyncio
import logging
from typing import Final

import asyncpg

from lading import looping
from lading.db import migrating
from lading.db import pool as dbpool

logger = logging.getLogger(__name__)

POLL_S_DEFAULT: Final = 2.0
"""How often a waiting process looks again: a hook Job's migrations take seconds, so a pod is ready
within a couple of seconds of them."""
BACKOFF_CAP_S: Final = 30.0
"""The longest wait between tries while the database does not answer at all."""


MIGRATOR: Final = "`lading migrate` (the chart's migration Job)"
"""What applies Lading's migrations, as a waiting process names it."""


def describe(pending: list[int], *, migrator: str = MIGRATOR) -> str:
    """The reason given in logs and on /readyz: which versions, and what applies them."""
    versions = ", ".join(f"{v:04d}" for v in pending)
    return f"migrations pending: {versions}; waiting for {migrator}"


async def pending_versions(dsn: str, *, source: migrating.MigrationSet = migrating.LADING) -> list[int]:
    """Versions of the set's migrations (Lading's unless told) not yet applied to the database at `dsn`."""
    conn = await dbpool.connect(dsn)
    try:
        return await migrating.pending(conn, source)
    finally:
        await conn.close()


async def wait_until_current(
        dsn: str,
        *,
        stop: asyncio.Event,
        what: str,
        poll_s: float = POLL_S_DEFAULT,
        source: migrating.MigrationSet = migrating.LADING,
        migrator: str = MIGRATOR,
        waiting: str = "does not start yet",
) -> bool:
    """Return True once no migration is pending, False if `stop` is set first. `what` names the
    waiting process in its log lines ("worker", "relay", "operator"); `source` is the migration set
    it waits for (the receiver waits for its own) and `migrator` what applies that set. `waiting`
    says what the process does meanwhile (a server that already listens and answers 503 says so)."""
    backoff = looping.Backoff(base_s=poll_s, cap_s=max(poll_s, BACKOFF_CAP_S))
    said: str | None = None
    while not stop.is_set():
        try:
            pending = await pending_versions(dsn, source=source)
        except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            wait = backoff.failed()
            logger.warning("%s waits for the database (%s); trying again in %.1f s", what, type(exc).__name__, wait)
            await looping.wait_or_stop(stop, wait)
            continue
        backoff.succeeded()
        if not pending:
            if said is not None:
                now = "starting" if waiting == "does not start yet" else "serving"
                logger.info("%s: migrations applied; %s", what, now)
            return True
        reason = describe(pending, migrator=migrator)
        if reason != said:  # say it once per change, not once per poll
            logger.warning("%s %s: %s", what, waiting, reason)
            said = reason
        await looping.wait_or_stop(stop, poll_s)
    return False
