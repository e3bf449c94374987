"""
The inbox cleaner: `erp_inbox` rows are deleted once they are older than the inbox retention, so
the receiver's database does not grow for ever. Booked invoices (`ledger_invoices`) are the ERP's
records and are never deleted here.

The retention is bounded below by the dedup window (`settings.dedup_window_s`: the sender's
longest retry span plus the replay tolerance), checked when the settings are built: a row a
retry or a replay could still meet is never taken. Each round deletes in statements of at most
`cleaner_batch_size` rows, oldest first through the `received_at` index, `FOR UPDATE SKIP LOCKED`,
each committing on its own (a delivery never waits behind the cleaner), and stops after
`cleaner_max_batches` statements; the next round goes on. Every replica runs one: SKIP LOCKED
lets them share a backlog without waiting on each other, and an idle round is one index probe.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable

import asyncpg

from lading import looping
from lading_webhook_receiver import inbox, metrics, settings

logger = logging.getLogger(__name__)

TRANSIENT = (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError)
"""A round that fails on these (the database away, a statement timeout) is retried after a backoff."""


@dataclasses.dataclass(frozen=True)
class CleanResult:
    deleted: int = 0
    oldest_age_s: float | None = None
    """The oldest row left, in seconds (None: the inbox is empty)."""


class InboxCleaner:
    """Deletes inbox rows past the retention, in bounded batches; `run_once` is one round."""

    def __init__(
            self,
            pool: asyncpg.Pool,
            *,
            config: settings.ReceiverSettings,
            observe: metrics.ReceiverMetrics,
            schema_current: Callable[[], bool] = lambda: True,
    ) -> None:
        self.pool = pool
        self.config = config
        self.observe = observe
        self.schema_current = schema_current
        """False while the receiver's migrations are pending: a round then does nothing."""

    async def run_once(self) -> CleanResult:
        if not self.schema_current():
            return CleanResult()
        deleted = 0
        async with self.pool.acquire(timeout=self.config.database_timeout_s) as conn:
            for _ in range(self.config.cleaner_max_batches):
                n = await inbox.delete_expired(
                    conn, older_than_s=self.config.inbox_retention_s, limit=self.config.cleaner_batch_size
                )
                deleted += n
                if n < self.config.cleaner_batch_size:
                    break
            oldest = await inbox.oldest_age_s(conn)
        if deleted:
            self.observe.cleaner_deleted.inc(deleted)
            logger.info("Cleaner deleted %d inbox rows past the %g h retention", deleted,
                        self.config.inbox_retention_s / settings.HOUR_S)  # fmt: skip
        self.observe.inbox_oldest_age.set(oldest or 0.0)
        return CleanResult(deleted=deleted, oldest_age_s=oldest)

    async def run_forever(self, stop: asyncio.Event) -> None:
        await looping.run_forever(
            self.run_once, stop, name="inbox cleaner", transient=TRANSIENT, logger=logger,
            pause_s=lambda _: looping.jittered(self.config.cleaner_interval_s),
            backoff=looping.Backoff(base_s=1.0, cap_s=self.config.cleaner_interval_s),
        )  # fmt: skip
