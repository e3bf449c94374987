"""
The distributed admission limiter: a pool's request, token and concurrency limits, shared by
every worker replica through PostgreSQL.

Before each model call a worker acquires, in one short transaction, one request from the
pool's requests-per-minute budget, a token reservation from its tokens-per-minute budget, and
one in-flight permit from its max concurrency: all three or none (`limiter_try_acquire`). The
pool row is locked first, so two replicas cannot both take the last permit. After the call the
permit is released and the reservation reconciled with the usage the provider reported; a
request that timed out after it was sent keeps its reservation (it may have been billed). A
permit carries an expiry, so a crashed worker's permits free themselves. A 429 cools the whole
pool down (`pools.cooldown_until`): no replica sends until it ends.

    attempt ──acquire──▶ permit ──model call──▶ release(tokens used)
                │ refused: wait until the window frees, the cooldown ends,
                │          or (concurrency) a little while, then ask again

Inside one process only one task asks the database at a time (a FIFO lock per pool); the
others wait behind it. So a worker with 100 concurrent attempts costs the database one query
per grant, not a hundred pollers. When only the concurrency limit refuses, the asker waits for
a release: its own process's releases wake it directly, other replicas' through a NOTIFY on the
`lading_limiter` channel (with a short poll as the fallback if LISTEN is unavailable).

Requests are also paced to at most requestsPerMinute/60 in any second (at least one): hosted
APIs enforce per-minute limits over shorter periods as well, and a minute's budget sent in
the first two seconds would be refused there.

The builtin provider runs in-process and is not rate-limited (it has no upstream to protect);
`for_pool` returns no limiter for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
import time
from typing import Any

import asyncpg

from lading import metrics
from lading.db import queries, registry
from lading.ids import JobId, PoolName

logger = logging.getLogger(__name__)

PROMPT_OVERHEAD_TOKENS = 600
"""Instructions, schema and delimiters around the document: measured at ~450 tokens, rounded up."""
RELEASED_CHANNEL = "lading_limiter"
"""NOTIFY channel of permit releases; the payload is the pool name."""
CHARS_PER_TOKEN = 3
"""A conservative text-to-token ratio for Latin-script invoices (tokenisers give 3.5-4.5)."""


@dataclasses.dataclass(frozen=True)
class Limits:
    requests_per_minute: int
    tokens_per_minute: int
    max_concurrency: int

    @classmethod
    def from_spec(cls, spec: dict[str, Any]) -> Limits:
        """From an InferencePool spec as stored in `pools.spec` (camelCase, defaults applied)."""
        limits = spec.get("limits") or {}
        return cls(
            requests_per_minute=int(limits.get("requestsPerMinute", 600)),
            tokens_per_minute=int(limits.get("tokensPerMinute", 200_000)),
            max_concurrency=int(limits.get("maxConcurrency", 32)),
        )


@dataclasses.dataclass(frozen=True)
class LimiterSettings:
    window_s: float = 61.0
    """The window the per-minute limits are counted over. A second longer than the provider's minute:
    a request is counted here when its permit is granted and there when it arrives, a little later;
    with equal windows the provider could see one request more than the limit in its own 60 s."""
    permit_ttl_s: float = 150.0
    """A permit not released within this time frees itself (its worker crashed). Longer than any
    attempt's timeout plus the lease, so a live, slow call never loses its permit."""
    concurrency_poll_s: float = 0.25
    """When only the concurrency limit refuses and no release is heard of, ask again after about this
    long (jittered). Releases normally wake the asker at once (NOTIFY); this is the fallback."""
    max_wait_step_s: float = 1.0
    """Never sleep longer than this between two asks: a raised limit or an ended cooldown is seen soon."""
    burst_s: float = 1.0
    """Pacing: at most this many seconds' worth of requestsPerMinute/60 are sent in any one second.
    1.0 spreads a minute's budget evenly; 60 turns pacing off (the whole minute at once)."""
    prune_every_s: float = 30.0
    """How often a process deletes permits that no longer count and re-reads the pool's limits."""


@dataclasses.dataclass(frozen=True)
class Permit:
    id: int
    tokens_reserved: int


@dataclasses.dataclass(frozen=True)
class Refusal:
    """Why a permit was refused and how long to wait before asking again."""

    reason: str  # cooldown | pace | requests | tokens | concurrency
    retry_in_s: float


def estimate_tokens(text: str, *, max_output_tokens: int) -> int:
    """Tokens to reserve for one request: prompt (document + overhead) plus the full output budget."""
    return PROMPT_OVERHEAD_TOKENS + len(text) // CHARS_PER_TOKEN + max_output_tokens


class PoolLimiter:
    """The limiter of one pool in one process."""

    def __init__(
            self,
            db: asyncpg.Pool,
            *,
            pool: PoolName,
            limits: Limits,
            settings: LimiterSettings | None = None,
    ) -> None:
        self.db = db
        self.pool = pool
        self.limits = limits
        self.settings = settings or LimiterSettings()
        self._asking = asyncio.Lock()  # FIFO: waiters are served in arrival order
        self._last_prune = time.monotonic()  # limits were just given; the first refresh is due later
        self._released = asyncio.Event()  # set by a release in this process or heard from another
        self._listener: asyncpg.pool.PoolConnectionProxy | None = None
        self._listening = False

    @property
    def per_second(self) -> int:
        """Requests allowed in any one second: `burst_s` seconds' worth of the per-minute rate."""
        return max(1, int(self.limits.requests_per_minute * self.settings.burst_s / 60))

    async def close(self) -> None:
        """Stop listening for other replicas' releases and give the connection back."""
        if self._listener is not None:
            listener, self._listener = self._listener, None
            try:
                await listener.remove_listener(RELEASED_CHANNEL, self._heard)
            finally:
                await self.db.release(listener)

    async def _listen(self) -> None:
        if self._listening:
            return
        self._listening = True  # one try: polling still works without it
        try:
            self._listener = await self.db.acquire()
            await self._listener.add_listener(RELEASED_CHANNEL, self._heard)
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            logger.warning("Cannot LISTEN for limiter releases, polling only: %s", exc)

    def _heard(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        if payload == self.pool:
            self._released.set()

    async def acquire(self, *, job_id: JobId, fence: int, tokens: int) -> Permit:
        """Wait until the pool admits one more request of `tokens` tokens; return its permit."""
        # A single document larger than a whole minute's budget could never be admitted; it is
        # let through alone (the window otherwise empty) instead of waiting forever.
        tokens = min(tokens, self.limits.tokens_per_minute)
        started = time.monotonic()
        await self._listen()
        async with self._asking:
            while True:
                self._released.clear()
                answer = await self.try_acquire(job_id=job_id, fence=fence, tokens=tokens)
                if isinstance(answer, Permit):
                    waited = time.monotonic() - started
                    metrics.LIMITER_WAIT.labels(self.pool).observe(waited)
                    return answer
                metrics.LIMITER_REFUSALS.labels(self.pool, answer.reason).inc()
                if answer.reason == "concurrency":
                    # A release (here or in another replica) is what can change the answer.
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._released.wait(), answer.retry_in_s)
                else:
                    await asyncio.sleep(answer.retry_in_s)

    async def try_acquire(self, *, job_id: JobId, fence: int, tokens: int) -> Permit | Refusal:
        """Ask once: a permit, or why not and when to ask again."""
        limits = self.limits
        async with self.db.acquire() as conn:
            try:
                row = await conn.fetchrow(
                    queries.sql("limiter_try_acquire"),
                    self.pool, job_id, fence, tokens,
                    limits.requests_per_minute, limits.tokens_per_minute, limits.max_concurrency,
                    self.settings.permit_ttl_s, self.settings.window_s, self.per_second,
                )  # fmt: skip
            except asyncpg.NoDataFoundError as exc:
                raise LookupError(str(exc)) from None
        assert row is not None
        if row["cooling"]:
            return Refusal("cooldown", min(row["cooldown_left_s"], self.settings.max_wait_step_s))
        await self._maybe_prune()
        if row["permit_id"] is not None:
            return Permit(id=row["permit_id"], tokens_reserved=tokens)
        window_frees_in = max(0.001, row["window_frees_in_s"] or 0.0)
        if row["requests"] + 1 > limits.requests_per_minute:
            return Refusal("requests", min(window_frees_in, self.settings.max_wait_step_s))
        if row["tokens"] + tokens > limits.tokens_per_minute:
            return Refusal("tokens", min(window_frees_in, self.settings.max_wait_step_s))
        if row["last_second"] + 1 > self.per_second:
            return Refusal("pace", max(0.001, row["second_frees_in_s"] or 0.0))
        poll = self.settings.concurrency_poll_s
        return Refusal("concurrency", poll * (0.5 + random.random()))

    async def release(self, permit: Permit, *, tokens_used: int | None) -> None:
        """Free the in-flight permit; `tokens_used=None` keeps the whole reservation in the window."""
        async with self.db.acquire() as conn:
            await conn.execute(queries.sql("limiter_release"), permit.id, tokens_used)
        self._released.set()

    async def cool_down(self, seconds: float) -> None:
        """The provider said 429: no replica sends to this pool for `seconds`."""
        async with self.db.acquire() as conn:
            await conn.execute(queries.sql("limiter_cooldown"), self.pool, seconds)
        metrics.LIMITER_COOLDOWNS.labels(self.pool).inc()
        metrics.LIMITER_COOLDOWN_SECONDS.labels(self.pool).inc(seconds)
        logger.warning("Pool %s cooling down for %.1f s after a 429", self.pool, seconds)

    async def _maybe_prune(self) -> None:
        now = time.monotonic()
        if now - self._last_prune < self.settings.prune_every_s:
            return
        self._last_prune = now
        async with self.db.acquire() as conn:
            await conn.execute(queries.sql("limiter_prune"), self.pool)
            await self.refresh_limits(conn)

    async def refresh_limits(self, conn: asyncpg.Connection) -> None:
        """Take up the pool's current limits (the operator mirrors spec changes into `pools.spec`), so a
        raised or lowered limit reaches running workers within `prune_every_s`, without a restart."""
        pool = await registry.get_pool(conn, name=self.pool)
        if pool is not None:
            limits = Limits.from_spec(pool.spec)
            if limits != self.limits:
                logger.info("Pool %s limits now %s", self.pool, limits)
                self.limits = limits


async def usage(conn: asyncpg.Connection, *, pool: PoolName) -> tuple[int, int, int]:
    """(requests, tokens, in flight) of the pool over the last minute."""
    row = await conn.fetchrow(queries.sql("limiter_usage"), pool)
    assert row is not None
    return int(row["requests"]), int(row["tokens"]), int(row["in_flight"])
