"""
The cleaner: rows that nothing needs any more are deleted after a retention, so the database
does not grow for ever.

What goes, each after its own retention (`CleanerSettings`): published outbox events, ingress
inbox rows and quarantined redeliveries, delivered deliveries with their attempts, stale-
completion records, limiter permits that hold no slot and the limiter's per-second sums; and, per
tenant whose TenantQuota sets `spec.retention`, the document (text or URI) of a job that ended
`documentsDays` ago, then its extracted result after `resultsDays` (the job row keeps digests,
states, attempts and verdict, and says when each went). What
never goes, whatever its age: an unpublished (or set-aside) event, a delivery in any state but
DELIVERED, a permit still holding a slot, the document of a job not yet ended (waiting, running,
awaiting review), a result whose delivery is still to be sent. The predicates that say so are in the SQL
(`lading/db/retention.py` names each query), next to the index each delete walks.

Why bounded batches: one `DELETE` of a month of rows would hold its locks, bloat the WAL and
stall replication for as long as it runs. Each statement here takes at most `batch_size` rows,
oldest first through an index, `FOR UPDATE SKIP LOCKED` (it never waits on the relay, the
dispatcher or the limiter, and they never wait long on it), and commits on its own; a round
stops a table after `max_batches` batches so one huge backlog cannot starve the others, and
the next round goes on where it stopped.

Why elected: two cleaners would only race for the same rows. Every worker runs a `Cleaner`, and
the one holding the cleaner's advisory lock cleans (`lading_elected.election`, as the gauge
refresher does, with its own key, so the two jobs may land in different processes). The others
export no cleaner gauges.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Final

import asyncpg

from lading import looping, metrics
from lading.db import retention
from lading_elected import election

logger = logging.getLogger(__name__)

ELECTION_LOCK_KEY: Final = 0x6C6164696E6743  # "ladingC": the cleaner's election, apart from the gauges'

HOUR_S: Final = 3600.0
DAY_S: Final = 24 * HOUR_S

INBOX_RETENTION_MIN_S: Final = DAY_S
"""The inbox is the ingress dedup window: an event redelivered after its row is gone would be
applied again. A day outlasts any broker redelivery (the consumer acks within seconds; a
publisher retrying after a day is a new intent, not a redelivery)."""
IDEMPOTENCY_KEY_RETENTION_MIN_S: Final = DAY_S
"""An Idempotency-Key of the HTTP intake is answered with its first answer for at least a day
(docs/api.md): a client retrying after its record went would be accepted again."""
PERMIT_RETENTION_MIN_S: Final = 300.0
"""Permits inside the limiter's sliding window (61 s) are counted by every acquisition; five
minutes keeps them with room to spare."""


@dataclasses.dataclass(frozen=True)
class CleanerSettings:
    """How long each kind of row is kept, and how hard the cleaner works (`lading worker` flags)."""

    interval_s: float = 60.0
    """Seconds between rounds. Retentions are hours to days: a minute's delay is invisible, and an
    idle round costs one indexed probe per table."""
    batch_size: int = 1000
    """Rows per DELETE statement: a few milliseconds of locks and WAL each (docs/benchmarks.md),
    large enough that the per-statement overhead does not dominate."""
    max_batches: int = 100
    """Batches per table per round (100,000 rows): a backlog is worked off over several rounds
    without starving the other tables."""
    outbox_published_s: float = 7 * DAY_S
    """Published outbox events, seconds after publication. Consumers dedup by event_id and never
    read the outbox; a week leaves time to inspect what was sent."""
    inbox_s: float = 7 * DAY_S
    """Ingress inbox rows, seconds after receipt: the dedup window (at least a day)."""
    quarantine_s: float = 30 * DAY_S
    """Quarantined redeliveries (a differing digest for a known event id): evidence for a
    human, kept a month."""
    delivered_s: float = 30 * DAY_S
    """DELIVERED deliveries and their attempts, seconds after delivery: a month of what the ERP
    was sent and answered, for reconciliation. After it `deliveries redeliver` answers that the
    delivery is gone."""
    stale_completions_s: float = 30 * DAY_S
    """Stale-completion records: `lading status` reports recent ones; a month is plenty."""
    api_requests_s: float = 2 * DAY_S
    """Idempotency-Key records of the HTTP intake, seconds after the answer, and of single documents
    (`document_submissions`, HTTP and queue intake), seconds after acceptance (at least a day): a
    retry within this window gets the first answer again."""
    limiter_s: float = HOUR_S
    """Limiter permits that hold no slot, and per-second sums, seconds after acquisition: the
    window is a minute; an hour leaves the recent history readable."""
    gpu_intervals_s: float = 400 * DAY_S
    """Closed GPU-time intervals of pools priced by the GPU hour (one row per pool per minute of
    GPU time or attempts), seconds after the interval started: a year and a month, for yearly
    cost reports. The attempts, jobs, batches and tenants keep their costs after it."""

    def __post_init__(self) -> None:
        if self.interval_s <= 0:
            raise ValueError(f"cleaner interval must be positive, got {self.interval_s}")
        if self.batch_size < 1 or self.max_batches < 1:
            raise ValueError(f"cleaner batch size and batches per round must be at least 1, got "
                             f"{self.batch_size} and {self.max_batches}")
        for name in ("outbox_published_s", "quarantine_s", "delivered_s", "stale_completions_s", "gpu_intervals_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"retention {name} must not be negative, got {getattr(self, name)}")
        if self.inbox_s < INBOX_RETENTION_MIN_S:
            raise ValueError(f"inbox retention must be at least {INBOX_RETENTION_MIN_S:.0f} s (the dedup "
                             f"window), got {self.inbox_s}")
        if self.api_requests_s < IDEMPOTENCY_KEY_RETENTION_MIN_S:
            raise ValueError(f"Idempotency-Key retention must be at least {IDEMPOTENCY_KEY_RETENTION_MIN_S:.0f} s, "
                             f"got {self.api_requests_s}")
        if self.limiter_s < PERMIT_RETENTION_MIN_S:
            raise ValueError(f"limiter retention must be at least {PERMIT_RETENTION_MIN_S:.0f} s (the "
                             f"limiter's window), got {self.limiter_s}")


Delete = Callable[..., Awaitable[int]]
Oldest = Callable[[asyncpg.Connection], Awaitable[float | None]]


@dataclasses.dataclass(frozen=True)
class Table:
    name: str
    """The metric label: the table rows are deleted from."""
    delete: Delete
    oldest: Oldest
    retention: Callable[[CleanerSettings], float]


TABLES: Final = (
    Table("outbox_events", retention.delete_published_outbox, retention.oldest_published_outbox_age_s,
          lambda s: s.outbox_published_s),
    Table("execution_inbox", retention.delete_expired_inbox, retention.oldest_inbox_age_s, lambda s: s.inbox_s),
    Table("inbox_quarantine", retention.delete_expired_quarantine, retention.oldest_quarantine_age_s,
          lambda s: s.quarantine_s),
    Table("deliveries", retention.delete_delivered, retention.oldest_delivered_age_s, lambda s: s.delivered_s),
    Table("stale_completions", retention.delete_stale_completions, retention.oldest_stale_completion_age_s,
          lambda s: s.stale_completions_s),
    Table("api_requests", retention.delete_expired_api_requests, retention.oldest_api_request_age_s,
          lambda s: s.api_requests_s),
    Table("document_submissions", retention.delete_expired_submissions, retention.oldest_submission_age_s,
          lambda s: s.api_requests_s),
    Table("limiter_permits", retention.delete_expired_permits, retention.oldest_permit_age_s,
          lambda s: s.limiter_s),
    Table("limiter_seconds", retention.delete_expired_limiter_seconds, retention.oldest_limiter_second_age_s,
          lambda s: s.limiter_s),
    Table("pool_gpu_intervals", retention.delete_expired_gpu_intervals, retention.oldest_gpu_interval_age_s,
          lambda s: s.gpu_intervals_s),
)
"""Every table the cleaner keeps small, in the order a round visits them."""


@contextlib.asynccontextmanager
async def cleaning(database_url: str, *, settings: CleanerSettings | None = None) -> AsyncIterator[Cleaner]:
    """Run a cleaner (election included) for the body of an `async with`; stopped on exit."""
    cleaner = Cleaner(database_url, settings=settings)
    async with election.running(cleaner, name="cleaner"):
        yield cleaner


class Cleaner:
    """The election and the cleaning rounds of one process; `leader` tells whether it cleans."""

    def __init__(self, database_url: str, *, settings: CleanerSettings | None = None) -> None:
        self.settings = settings or CleanerSettings()
        self._election = election.Election(database_url, key=ELECTION_LOCK_KEY, what="clean expired rows")

    @property
    def leader(self) -> bool:
        return self._election.leader

    async def run_forever(self, stop: asyncio.Event) -> None:
        await election.run_elected(
            stop, run_once=self.run_once, resign=self._resign,
            interval_s=lambda: looping.jittered(self.settings.interval_s), what="Cleaning",
        )

    async def run_once(self) -> dict[str, int] | None:
        """One round if elected: rows deleted per table; None when another process cleans."""
        conn = await self._election.stand()
        if conn is None:
            _clear()
            return None
        return await clean(conn, settings=self.settings)

    async def _resign(self) -> None:
        _clear()
        await self._election.resign()


async def clean(conn: asyncpg.Connection, *, settings: CleanerSettings) -> dict[str, int]:
    """One round over every table on `conn` (autocommit: each batch commits on its own)."""
    deleted: dict[str, int] = {}
    for table in TABLES:
        total = 0
        for _ in range(settings.max_batches):
            n = await table.delete(conn, older_than_s=table.retention(settings), limit=settings.batch_size)
            total += n
            if n < settings.batch_size:
                break
        if total:
            metrics.CLEANER_DELETED.labels(table.name).inc(total)
            logger.info("Cleaner deleted %d rows from %s", total, table.name)
        deleted[table.name] = total
        age = await table.oldest(conn)
        if age is None:
            with contextlib.suppress(KeyError):
                metrics.CLEANER_OLDEST_AGE.remove(table.name)
        else:
            metrics.CLEANER_OLDEST_AGE.labels(table.name).set(age)
    for what, total in (await clean_personal_data(conn, settings=settings)).items():
        deleted[what] = total
    return deleted


async def clean_personal_data(conn: asyncpg.Connection, *, settings: CleanerSettings) -> dict[str, int]:
    """Per tenant with spec.retention: documents past documentsDays, then results past resultsDays
    (documents first within a round, so a job whose both periods passed loses both in one round).
    The oldest-retained gauge of each is the oldest kept row over the tenants that set its days."""
    deleted = {"job_documents": 0, "results": 0}
    oldest: dict[str, float | None] = {"job_documents": None, "results": None}
    for tenant in await retention.tenant_retentions(conn):
        for what, days, delete, age_of in (
                ("job_documents", tenant.documents_days, retention.delete_documents, retention.oldest_document_age_s),
                ("results", tenant.results_days, retention.delete_results, retention.oldest_result_age_s),
        ):
            if days is None:
                continue
            for _ in range(settings.max_batches):
                n = await delete(conn, tenant=tenant.tenant, older_than_days=days, limit=settings.batch_size)
                deleted[what] += n
                if n < settings.batch_size:
                    break
            age = await age_of(conn, tenant=tenant.tenant)
            if age is not None:
                oldest[what] = max(age, oldest[what] or 0.0)
    for what, total in deleted.items():
        if total:
            metrics.CLEANER_DELETED.labels(what).inc(total)
            logger.info("Cleaner deleted %d %s past their tenant's retention", total, what)
    for what, age in oldest.items():
        if age is None:
            with contextlib.suppress(KeyError):
                metrics.CLEANER_OLDEST_AGE.remove(what)
        else:
            metrics.CLEANER_OLDEST_AGE.labels(what).set(age)
    return deleted


def _clear() -> None:
    """A process that does not clean exports no cleaner gauges."""
    metrics.CLEANER_OLDEST_AGE.clear()
