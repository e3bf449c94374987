"""
The distributed admission limiter: a pool's request, token and concurrency limits, shared by
every worker replica through PostgreSQL.

Before each model call a worker acquires, in one short transaction, one request from the
pool's requests-per-minute budget, a token reservation from its tokens-per-minute budget, and
one in-flight permit from its max concurrency: all three or none (`limiter_try_acquire`). The
pool row is locked first, so two replicas cannot both take the last permit. A permit carries an
expiry, so a crashed worker's permits free themselves. A 429 (or a 503 with Retry-After) cools
the whole pool down (`pools.cooldown_until`): no replica sends until it ends.

    attempt ──acquire──▶ permit ──model call──▶ release(tokens to count)
                │ refused: wait until the window frees, the cooldown ends,
                │          or (concurrency) a release, then ask again

Tokens are counted the way the provider counts them (`limits.tokenAccounting`):

    reserved   (default; hosted APIs) a request counts prompt + max_tokens when it arrives, for
               the whole minute, whatever the answer used. The reservation is never reconciled
               down; it grows when the provider reports a longer prompt than was estimated.
    used       (vLLM-style servers) a request counts the tokens it really used: the reservation
               is reconciled to the reported usage after the call.

Either way a request that timed out after it was sent keeps its reservation (it may have been
consumed). The reservation is estimated from the real request: the prompt's instructions,
schema and delimiters (measured once per schema) plus the document, plus the request's own
output budget (doubled on a retry after a truncated answer). Where the provider sends
`x-ratelimit-remaining-*` / `x-ratelimit-reset-*` headers, they tighten the local view when they
show less room than it does (`observe`).

Inside one process only one task asks the database at a time (a FIFO lock per pool), and it asks
for everyone queued behind it at once: one query grants as many of the waiting attempts as fit,
in arrival order. So a worker with 100 concurrent attempts costs the database one query per
batch of grants, not a hundred pollers. When only the concurrency limit refuses, the asker waits
for a release: its own process's releases wake it directly, other replicas' through a NOTIFY on
the `lading_limiter` channel (with a short poll as the fallback if LISTEN is unavailable). The
per-minute counts come from a per-second rollup (`limiter_seconds`), so a grant reads a bounded
number of rows whatever the pool's rate.

Requests are also paced to at most requestsPerMinute/60 in any second (at least one): hosted
APIs enforce per-minute limits over shorter periods as well, and a minute's budget sent in
the first two seconds would be refused there.

The builtin provider runs in-process and is not rate-limited (it has no upstream to protect);
`for_pool` returns no limiter for it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import enum
import logging
import math
import os
import random
import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import asyncpg

from lading import metrics
from lading.db import limiter, registry
from lading.ids import JobId, PoolName
from lading.providers import base

logger = logging.getLogger(__name__)

RELEASED_CHANNEL = "lading_limiter"
"""NOTIFY channel of permit releases; the payload is the pool name."""
CHARS_PER_TOKEN = 3
"""A conservative text-to-token ratio for Latin-script invoices and JSON (tokenisers give 3.5-4.5
for prose, fewer for JSON): a reservation errs on the large side."""
PROMPT_OVERHEAD_TOKENS = 600
"""For a provider that cannot estimate its own request: instructions, schema and delimiters."""
MAX_BATCH = 64
"""The most waiting attempts one query asks permits for."""
MINUTE_ENV = "LADING_LIMITER_MINUTE_S"
"""A scaled minute for tests against a stub with a scaled window (`LimiterSettings.from_environment`)."""


class TokenAccounting(enum.StrEnum):
    """How the provider counts a request against tokens-per-minute (`limits.tokenAccounting`)."""

    RESERVED = "reserved"  #: prompt + max_tokens when it arrives, for the whole window (hosted APIs)
    USED = "used"          #: the tokens it really used (servers that count actual usage)


@dataclasses.dataclass(frozen=True)
class Limits:
    requests_per_minute: int
    tokens_per_minute: int
    max_concurrency: int
    token_accounting: TokenAccounting = TokenAccounting.RESERVED

    @classmethod
    def from_spec(cls, spec: dict[str, Any]) -> Limits:
        """From an InferencePool spec as stored in `pools.spec` (camelCase, defaults applied)."""
        limits = spec.get("limits") or {}
        return cls(
            requests_per_minute=int(limits.get("requestsPerMinute", 600)),
            tokens_per_minute=int(limits.get("tokensPerMinute", 200_000)),
            max_concurrency=int(limits.get("maxConcurrency", 32)),
            token_accounting=TokenAccounting(limits.get("tokenAccounting", TokenAccounting.RESERVED.value)),
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
    max_batch: int = MAX_BATCH
    """The most waiting attempts of one process granted by one query."""
    minute_s: float = 60.0
    """The provider's minute: pacing spreads requestsPerMinute over it. Only a model stub whose
    window is scaled down (tests) has another; `from_environment` reads it."""

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> LimiterSettings:
        """The defaults, or, with `LADING_LIMITER_MINUTE_S` set, a scaled minute: the per-minute limits
        count over that many seconds (plus the same one-second margin) and pacing spreads them over it.
        For tests against a stub that scales its window the same way; never needed in production."""
        value = (os.environ if environ is None else environ).get(MINUTE_ENV)
        if not value:
            return cls()
        try:
            minute_s = float(value)
        except ValueError:
            raise ValueError(f"${MINUTE_ENV} must be a number of seconds, got {value!r}") from None
        if not 1.0 <= minute_s <= 60.0:
            raise ValueError(f"${MINUTE_ENV} must be between 1 and 60 seconds, got {value!r}")
        return cls(minute_s=minute_s, window_s=minute_s + 1.0)


@dataclasses.dataclass(frozen=True)
class Reservation:
    """What one request counts against tokens-per-minute before it is sent."""

    prompt_tokens: int
    """The estimated prompt: instructions, schema, delimiters and the document."""
    output_tokens: int
    """The request's output budget (`max_tokens`), as the provider will count it."""

    @property
    def total(self) -> int:
        return self.prompt_tokens + self.output_tokens


@runtime_checkable
class Estimating(Protocol):
    """A provider that knows what its request for a document will count."""

    def reservation(self, document: base.Document, *, schema: str, policy: str) -> Reservation: ...


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
    """Tokens to reserve for one request of a provider that cannot estimate its own: the document,
    a fixed overhead, and the full output budget."""
    return PROMPT_OVERHEAD_TOKENS + tokens_of(len(text)) + max_output_tokens


def tokens_of(chars: int) -> int:
    """A conservative token count for `chars` characters of prompt."""
    return math.ceil(chars / CHARS_PER_TOKEN)


@dataclasses.dataclass(eq=False)
class _Waiter:
    job_id: JobId
    fence: int
    tokens: int
    granted: asyncio.Future[Permit]


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
        self.settings = settings or LimiterSettings.from_environment()
        self._asking = asyncio.Lock()  # FIFO: waiters are served in arrival order
        self._queue: collections.deque[_Waiter] = collections.deque()  # waiting attempts, in arrival order
        self._last_prune = time.monotonic()  # limits were just given; the first refresh is due later
        self._released = asyncio.Event()  # set by a release in this process or heard from another
        self._listener: asyncpg.pool.PoolConnectionProxy | None = None
        self._listening = False
        self._settling: set[asyncio.Task[None]] = set()

    @property
    def per_second(self) -> int:
        """Requests allowed in any one second: `burst_s` seconds' worth of the per-minute rate."""
        return max(1, int(self.limits.requests_per_minute * self.settings.burst_s / self.settings.minute_s))

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
        """Wait until the pool admits one more request of `tokens` tokens; return its permit.

        The task holding the asking lock asks for everyone queued (up to `max_batch`, in arrival
        order); a waiter granted by someone else's query finds its permit when its turn comes."""
        # A single document larger than a whole minute's budget could never be admitted; it is
        # let through alone (the window otherwise empty) instead of waiting forever.
        tokens = min(tokens, self.limits.tokens_per_minute)
        started = time.monotonic()
        await self._listen()
        waiter = _Waiter(job_id, fence, tokens, asyncio.get_running_loop().create_future())
        self._queue.append(waiter)
        try:
            async with self._asking:
                while not waiter.granted.done():
                    await self._serve_queue()
        except BaseException:
            self._abandon(waiter)
            raise
        metrics.LIMITER_WAIT.labels(self.pool).observe(time.monotonic() - started)
        return waiter.granted.result()

    def _abandon(self, waiter: _Waiter) -> None:
        """A waiter gave up (cancelled, or the database failed): out of the queue, and a permit granted
        to it in the meantime goes back."""
        with contextlib.suppress(ValueError):
            self._queue.remove(waiter)
        if waiter.granted.done() and not waiter.granted.cancelled() and waiter.granted.exception() is None:
            permit = waiter.granted.result()
            self._settling.add(task := asyncio.create_task(self.release(permit, tokens_used=None)))
            task.add_done_callback(self._settling.discard)
        else:
            waiter.granted.cancel()

    async def _serve_queue(self) -> None:
        """One ask for the head of the queue; grants resolve their waiters, a refusal waits."""
        self._released.clear()
        batch = [w for w in list(self._queue)[: self.settings.max_batch] if not w.granted.done()]
        if not batch:
            return
        permits, refusal = await self.try_acquire_many([(w.job_id, w.fence, w.tokens) for w in batch])
        for waiter, permit in zip(batch, permits, strict=False):
            self._queue.remove(waiter)
            waiter.granted.set_result(permit)
        if refusal is None:
            return
        metrics.LIMITER_REFUSALS.labels(self.pool, refusal.reason).inc()
        if permits:
            return  # the next in line asks again at once: the refusal was computed for it, though
        if refusal.reason == "concurrency":
            # A release (here or in another replica) is what can change the answer.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._released.wait(), refusal.retry_in_s)
        else:
            await asyncio.sleep(refusal.retry_in_s)

    async def try_acquire(self, *, job_id: JobId, fence: int, tokens: int) -> Permit | Refusal:
        """Ask once for one permit: the permit, or why not and when to ask again."""
        permits, refusal = await self.try_acquire_many([(job_id, fence, tokens)])
        if permits:
            return permits[0]
        assert refusal is not None
        return refusal

    async def try_acquire_many(
            self, asked: Sequence[tuple[JobId, int, int]]
    ) -> tuple[list[Permit], Refusal | None]:
        """Ask once for permits of (job, fence, tokens), in order: those granted (a prefix), and why
        the next one was not (None when all were granted)."""
        limits = self.limits
        tokens = [min(t, limits.tokens_per_minute) for _, _, t in asked]
        async with self.db.acquire() as conn:
            try:
                grant = await limiter.try_acquire_many(
                    conn,
                    pool=self.pool,
                    asked=[(j, f, t) for (j, f, _), t in zip(asked, tokens, strict=True)],
                    requests_per_minute=limits.requests_per_minute,
                    tokens_per_minute=limits.tokens_per_minute,
                    max_concurrency=limits.max_concurrency,
                    permit_ttl_s=self.settings.permit_ttl_s,
                    window_s=self.settings.window_s,
                    per_second=self.per_second,
                )
            except asyncpg.NoDataFoundError as exc:
                raise LookupError(str(exc)) from None
        if grant.cooling:
            return [], Refusal("cooldown", min(grant.cooldown_left_s, self.settings.max_wait_step_s))
        await self._maybe_prune()
        permits = [Permit(id=i, tokens_reserved=t) for i, t in zip(grant.permit_ids, tokens, strict=False)]
        if len(permits) == len(asked):
            return permits, None
        next_tokens = tokens[len(permits)]
        window_frees_in = max(0.001, grant.window_frees_in_s or 0.0)
        if grant.requests + 1 > limits.requests_per_minute:
            return permits, Refusal("requests", min(window_frees_in, self.settings.max_wait_step_s))
        if grant.tokens + next_tokens > limits.tokens_per_minute:
            return permits, Refusal("tokens", min(window_frees_in, self.settings.max_wait_step_s))
        if grant.last_second + 1 > self.per_second:
            return permits, Refusal("pace", max(0.001, grant.second_frees_in_s or 0.0))
        poll = self.settings.concurrency_poll_s
        return permits, Refusal("concurrency", poll * (0.5 + random.random()))

    def counted_tokens(
            self,
            permit: Permit,
            reservation: Reservation,
            *,
            tokens_in: int | None,
            tokens_out: int | None,
            sent_and_lost: bool,
    ) -> int | None:
        """The tokens a finished call counts in the window, as the provider counts them; None keeps
        the reservation. `sent_and_lost`: the request went out and no answer came (it may have been
        consumed, so the reservation stands)."""
        if sent_and_lost or tokens_in is None:
            return None
        if self.limits.token_accounting is TokenAccounting.RESERVED:
            # The provider counted the prompt it saw plus the whole output budget: never less than
            # reserved, more when the prompt was longer than estimated.
            counted = tokens_in + reservation.output_tokens
            return counted if counted > permit.tokens_reserved else None
        if tokens_out is None:
            return None
        return tokens_in + tokens_out

    async def release(self, permit: Permit, *, tokens_used: int | None) -> None:
        """Free the in-flight permit; `tokens_used` replaces the reservation in the window (None keeps it)."""
        async with self.db.acquire() as conn:
            await limiter.release(conn, permit_id=permit.id, tokens_used=tokens_used)
        self._released.set()

    async def cool_down(self, seconds: float) -> float:
        """The provider said 429 (or 503, overloaded): no replica sends to this pool for `seconds`.
        Returns how long the pool now cools down (a longer cooldown already set is kept)."""
        async with self.db.acquire() as conn:
            left = await limiter.cool_down(conn, pool=self.pool, seconds=seconds)
        metrics.LIMITER_COOLDOWNS.labels(self.pool).inc()
        metrics.LIMITER_COOLDOWN_SECONDS.labels(self.pool).inc(seconds)
        logger.warning("Pool %s cooling down for %.1f s after the provider refused for congestion", self.pool, seconds)
        return left if left is not None else seconds

    async def observe(self, view: base.RateLimitView) -> tuple[int, int]:
        """Tighten the local view to what the provider's rate-limit headers say is left, where that is
        less. Returns the (requests, tokens) added to the window."""
        if view.remaining_requests is None and view.remaining_tokens is None:
            return 0, 0
        limits = self.limits
        async with self.db.acquire() as conn:
            added = await limiter.observe(
                conn,
                pool=self.pool,
                remaining_requests=view.remaining_requests,
                requests_reset_s=view.requests_reset_s,
                remaining_tokens=view.remaining_tokens,
                tokens_reset_s=view.tokens_reset_s,
                requests_per_minute=limits.requests_per_minute,
                tokens_per_minute=limits.tokens_per_minute,
                window_s=self.settings.window_s,
            )
        if added != (0, 0):
            logger.debug("Pool %s: the provider has less room than counted here; added %s", self.pool, added)
        return added

    async def _maybe_prune(self) -> None:
        now = time.monotonic()
        if now - self._last_prune < self.settings.prune_every_s:
            return
        self._last_prune = now
        async with self.db.acquire() as conn:
            await limiter.prune_permits(conn, pool=self.pool)
            await limiter.prune_seconds(conn, pool=self.pool)
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


async def usage(conn: asyncpg.Connection, *, pool: PoolName, window_s: float = 60.0) -> tuple[int, int, int]:
    """(requests, tokens, in flight) of the pool over the last `window_s` seconds, as the limiter counts them."""
    return await limiter.usage(conn, pool=pool, window_s=window_s)
