"""
The history of a scenario, Jepsen-style: what was asked, what each fault did and when, what the
system showed while it ran, and what it left behind. The checker reads nothing else.

While a scenario runs, the recorder polls the jobs (state, attempt, fence) every few hundred
milliseconds, consumes a side queue bound to the events exchange (every event the relays
published, as the broker routed it) and streams the model stub's log (every request's arrival,
every admitted request's arrival and tokens: the stub keeps only its last 10,000, so a long run
is read as it goes, by the stub's running totals; `model_log_missed` counts what a slow poll
lost). At the end it reads the final tables of Lading (jobs, attempts, results, stale
completions, outbox, inbox, deliveries and their attempts) and of the ERP (the receiver's inbox
by delivery id, the ledger by business intent).
A history is plain JSON: it is written next to the table, so a failing seed can be checked again.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
import urllib.request
from typing import Any

import aio_pika
import aio_pika.abc
import asyncpg

POLL_S = 0.3
MODEL_POLL_S = 1.0
"""The stub keeps 10,000 entries: at the pool's 60,000 requests a minute a second is 1,000."""


@dataclasses.dataclass
class History:
    scenario: str
    seed: int
    command: str
    started: float = 0.0
    ended: float = 0.0
    submitted: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    """Batch name -> document keys asked for."""
    deleted_batches: list[str] = dataclasses.field(default_factory=list)
    expect: dict[str, Any] = dataclasses.field(default_factory=dict)
    """What the scenario's fault must lead to, checked by the checker's `outcome_violations`:
    `deadline_batches` (every job FAILED_TERMINAL for its deadline), `cancelled_batches` (every job
    CANCELLED or ended before the cancellation, no result or delivery for a cancelled one, the
    object gone), `failpoint_kills` (how many processes a failpoint must have killed)."""
    kube_events: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    """The namespace's Kubernetes Events at the end (scenarios that check the operator's)."""
    faults: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    """{kind, target, start, end, ...}: every fault injected, with its wall-clock window."""
    kills: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    """{kind, name, pid, signal, at, until}: every signal that took a process away."""
    observations: list[list[Any]] = dataclasses.field(default_factory=list)
    """[t, job id, state, attempt, fence], polled."""
    events_seen: list[str] = dataclasses.field(default_factory=list)
    cooldowns: list[list[float]] = dataclasses.field(default_factory=list)
    """[t, cooldown_until], polled: when each new `pools.cooldown_until` (the pool's cooldown after a
    429, committed by the worker that got it) was first seen."""
    final: dict[str, Any] = dataclasses.field(default_factory=dict)
    model: dict[str, Any] = dataclasses.field(default_factory=dict)
    """{limits, stats}: the stub's final stats, with `arrivals` and `admitted` the whole streamed log."""
    bounds: dict[str, float] = dataclasses.field(default_factory=dict)
    notes: list[str] = dataclasses.field(default_factory=list)

    def fault(self, kind: str, target: str, **detail: Any) -> dict[str, Any]:
        entry: dict[str, Any] = {"kind": kind, "target": target, "start": time.time(), "end": None, **detail}
        self.faults.append(entry)
        return entry


class ModelLog:
    """The stub model's arrivals and admitted requests, streamed: each poll asks only for the
    entries after the totals seen so far (hack/stub_model.py `?arrivals_after=&admitted_after=`)."""

    def __init__(self, origin: str) -> None:
        self.origin = origin
        self.arrivals: list[float] = []
        self.admitted: list[list[float]] = []
        self.missed = 0
        """Entries the stub let go before a poll read them (more than it keeps between two polls)."""
        self._arrivals_total = 0
        self._admitted_total = 0

    async def poll(self) -> dict[str, Any]:
        """Read the new entries; the stub's stats as they are now."""
        query = f"?arrivals_after={self._arrivals_total}&admitted_after={self._admitted_total}"
        stats: dict[str, Any] = await asyncio.to_thread(_get_json, self.origin + "/admin/stats" + query)
        self._take(stats["arrivals"], stats["arrivals_total"] - self._arrivals_total, self.arrivals)
        self._take(stats["admitted"], stats["admitted_total"] - self._admitted_total, self.admitted)
        self._arrivals_total, self._admitted_total = stats["arrivals_total"], stats["admitted_total"]
        return stats

    def _take(self, entries: list[Any], new: int, into: list[Any]) -> None:
        into.extend(entries)
        self.missed += max(0, new - len(entries))


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.load(response)


class Recorder:
    """Polls jobs, streams the model's log and consumes the events side queue for the duration
    of a scenario."""

    def __init__(
            self, *, database_url: str, amqp_url: str, prefix: str, history: History, model_origin: str
    ) -> None:
        self.database_url = database_url
        self.amqp_url = amqp_url
        self.prefix = prefix
        self.history = history
        self.model_log = ModelLog(model_origin)
        self._tasks: list[asyncio.Task[None]] = []
        self._stop = asyncio.Event()

    async def start(self) -> None:
        self._tasks = [asyncio.create_task(self._poll(), name="poll jobs"),
                       asyncio.create_task(self._consume(), name="events side queue"),
                       asyncio.create_task(self._poll_model(), name="model log")]  # fmt: skip

    async def stop(self) -> dict[str, Any]:
        """Stop recording; the model's final stats with its whole log (`arrivals`, `admitted`)."""
        self._stop.set()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        stats = await self.model_log.poll()
        return {**stats, "arrivals": self.model_log.arrivals, "admitted": self.model_log.admitted,
                "log_missed": self.model_log.missed}  # fmt: skip

    async def _poll_model(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(OSError, ValueError, KeyError):
                await self.model_log.poll()
            await asyncio.sleep(MODEL_POLL_S)

    async def _poll(self) -> None:
        since = 0.0
        seen: dict[int, tuple[str, int, int]] = {}
        cooldowns: set[float] = set()
        conn: asyncpg.Connection | None = None
        while not self._stop.is_set():
            try:
                if conn is None or conn.is_closed():
                    conn = await asyncpg.connect(self.database_url, timeout=3)
                rows = await conn.fetch(
                    "SELECT id, state, attempt, fence, extract(epoch FROM updated_at)::float8 AS u,"
                    "       extract(epoch FROM clock_timestamp())::float8 AS now"
                    "  FROM extraction_jobs WHERE updated_at >= to_timestamp($1)",
                    since,
                )
                for row in rows:
                    key = (row["state"], row["attempt"], row["fence"])
                    if seen.get(row["id"]) != key:
                        seen[row["id"]] = key
                        self.history.observations.append([row["now"], row["id"], *key])
                if rows:
                    # Commits become visible after their updated_at: look back far enough to see them.
                    since = max(since, rows[0]["now"] - 5.0)
                for row in await conn.fetch(
                    "SELECT extract(epoch FROM cooldown_until)::float8 AS until,"
                    "       extract(epoch FROM clock_timestamp())::float8 AS now"
                    "  FROM pools WHERE cooldown_until IS NOT NULL"
                ):
                    if row["until"] not in cooldowns:
                        cooldowns.add(row["until"])
                        self.history.cooldowns.append([row["now"], row["until"]])
            except (OSError, asyncpg.PostgresError, TimeoutError, asyncpg.InterfaceError):
                conn = None  # the server restarts in some scenarios: reconnect on the next round
            await asyncio.sleep(POLL_S)
        if conn is not None:
            await conn.close()

    async def _consume(self) -> None:
        while not self._stop.is_set():
            try:
                connection = await aio_pika.connect(self.amqp_url, timeout=5)
                async with connection:
                    channel = await connection.channel()
                    exchange = await _events_exchange(channel, self.prefix + "lading.events")
                    queue = await channel.declare_queue(self.prefix + "reliability.history", durable=False)
                    await queue.bind(exchange, routing_key="#")
                    async with queue.iterator(no_ack=True) as messages:
                        async for message in messages:
                            if message.message_id:
                                self.history.events_seen.append(message.message_id)
            except asyncio.CancelledError:
                raise
            except Exception:  # the exchange may not exist yet; the broker may be away: try again
                await asyncio.sleep(0.5)


async def _events_exchange(channel: aio_pika.abc.AbstractChannel, name: str) -> aio_pika.abc.AbstractExchange:
    return await channel.declare_exchange(name, aio_pika.ExchangeType.TOPIC, durable=True, passive=True)


async def bind_side_queue(*, amqp_url: str, prefix: str, timeout_s: float = 60.0) -> None:
    """Declare and bind the side queue once the relays declared the exchange, before any event exists."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            connection = await aio_pika.connect(amqp_url, timeout=5)
            async with connection:
                channel = await connection.channel()
                exchange = await _events_exchange(channel, prefix + "lading.events")
                queue = await channel.declare_queue(prefix + "reliability.history", durable=False)
                await queue.bind(exchange, routing_key="#")
                return
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)


FINAL_QUERIES: dict[str, str] = {
    "batches": "SELECT id, name FROM batches",
    "jobs": "SELECT j.id, b.name AS batch, j.document_key AS key, j.state, j.attempt, j.max_attempts, j.fence,"
            "       extract(epoch FROM j.deadline_at)::float8 AS deadline, extract(epoch FROM j.created_at)::float8"
            "       AS created, extract(epoch FROM j.finished_at)::float8 AS finished, j.last_error_class AS error"
            "  FROM extraction_jobs j JOIN batches b ON b.id = j.batch_id",
    "attempts": "SELECT job_id, fence, attempt, worker_id, extract(epoch FROM started_at)::float8 AS started,"
                "       extract(epoch FROM finished_at)::float8 AS finished, outcome, error_class FROM job_attempts",
    "results": "SELECT job_id, fence FROM results",
    "stale": "SELECT job_id, fence, worker_id FROM stale_completions",
    "outbox": "SELECT event_id::text, aggregate_type, aggregate_id, type, extract(epoch FROM created_at)::float8"
              "       AS created, extract(epoch FROM published_at)::float8 AS published FROM outbox_events",
    "inbox": "SELECT event_id::text FROM execution_inbox",
    "deliveries": "SELECT delivery_id::text, job_id, state, attempt, ambiguous_attempts FROM deliveries",
    "delivery_attempts": "SELECT delivery_id::text, fence, attempt, outcome, http_status,"
                         "       extract(epoch FROM started_at)::float8 AS started FROM delivery_attempts",
}
ERP_QUERIES: dict[str, str] = {
    "erp_inbox": "SELECT delivery_id, status, reference FROM erp_inbox",
    "ledger": "SELECT delivery_id, lading_job_id, reference, tenant, supplier_identity, invoice_number"
              "  FROM ledger_invoices",
}
"""The batches table names each batch by its Kubernetes namespace/name."""


async def read_final(*, database_url: str, erp_database_url: str) -> dict[str, Any]:
    final: dict[str, Any] = {}
    for url, queries in ((database_url, FINAL_QUERIES), (erp_database_url, ERP_QUERIES)):
        conn = await asyncpg.connect(url, timeout=10)
        try:
            for name, sql in queries.items():
                final[name] = [dict(r) for r in await conn.fetch(sql)]
        finally:
            await conn.close()
    return final
