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
output budget (doubled on a retry after a truncated answer). The prompt estimate (characters at
3 per token, on the large side) is then corrected by what the provider reports it counted
(`PromptEstimator`: per pool and schema, the highest ratio of reported to estimated prompt tokens
among the last 256 answers, plus 1 %; kept in `limiter_estimates` so that every replica, and a
restarted one, starts from it). Where the provider sends `x-ratelimit-remaining-*` /
`x-ratelimit-reset-*` headers, they tighten the local view when they show less room than it
does (`observe`).

Inside one process only one task asks the database at a time (`_serve`, one per pool), and it
asks for everyone queued at once: one query grants as many of the waiting attempts as fit,
in arrival order. So a worker with 100 concurrent attempts costs the database one query per
batch of grants, not a hundred pollers. When only the concurrency limit refuses, the asker waits
for a release and does not ask again before one is heard of:

- a process that releases a permit while attempts of its own wait hands the slot to the next of
  them in the same call (`limiter_release_grant`): one round trip, no wake-up elsewhere. At most
  `handoff_streak` releases in a row do so, so that a replica whose attempts wait is not starved
  by one that keeps its slots busy;
- otherwise the release grants the slot, in the same transaction, to the attempt of another
  replica that has waited longest, and NOTIFYs that replica the permit: its attempt goes on without
  asking. An ask refused for concurrency records the attempts not granted in `limiter_waiters`
  with the asker's LISTEN backend pid (migration 0033); a replica whose LISTEN connection is gone
  is passed over. An ask never grants a second permit to an attempt granted one that way before
  its replica heard the NOTIFY (`Grant.meanwhile`);
- a release that grants nothing NOTIFYs the `lading_limiter` channel with the pool's name, which
  wakes every replica's asker (with a short poll as the fallback if LISTEN is unavailable).

The per-minute counts come from a per-second rollup (`limiter_seconds`), so a grant reads a
bounded number of rows whatever the pool's rate.

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
from collections.abc import AsyncIterator, Mapping, Sequence
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
ESTIMATE_SAMPLES = 256
"""The answers a `PromptEstimator` keeps: its factor is the highest ratio among them."""
ESTIMATE_MARGIN = 0.01
"""Added to the highest ratio seen: a prompt is reserved at 1 % more than the most the provider
counted, per estimated token, over the last `ESTIMATE_SAMPLES` answers."""
ESTIMATE_MIN_SAMPLES = 8
"""Until a process has seen this many answers of a schema, its factor is never below the one
recorded for the pool (or, with none recorded, below the conservative default, 1.0)."""
ESTIMATE_BOUNDS = (0.5, 8.0)
"""The factor's bounds: a provider reporting nonsense can neither halve reservations more than
once (6 characters per token) nor make them more than 8 times the estimate."""
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
    handoff_streak: int = 8
    """The most releases in a row of one process that hand their slot straight to its own waiting
    attempts; the next one grants it to the attempt of another replica that has waited longest (or,
    with none recorded, frees it for every replica: NOTIFY, and all ask for it). 0: never hand over
    to an attempt of this process."""
    relisten_s: float = 5.0
    """After a failed try to LISTEN, try again after this long. A LISTEN connection that is lost is
    replaced at the asker's next round; until then the asker polls, and no other replica's release
    can grant a slot to an attempt of this one."""
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
    estimated_prompt_tokens: int | None = None
    """The prompt as estimated locally, before the learned correction (`PoolLimiter.estimate`);
    None: `prompt_tokens` is that estimate."""

    @property
    def total(self) -> int:
        return self.prompt_tokens + self.output_tokens


class PromptEstimator:
    """What a pool's provider counts for a prompt of one schema, learned from its answers: the factor
    by which the local estimate (characters at `CHARS_PER_TOKEN`) is multiplied.

    The factor is the highest ratio of reported to estimated prompt tokens among the last
    `ESTIMATE_SAMPLES` answers, plus `ESTIMATE_MARGIN`, within `ESTIMATE_BOUNDS`: a reservation
    converges to what the provider counts and stays above it for every request like the recent
    ones. A request the provider counts more than that for is counted in full once its answer is
    in (`PoolLimiter.counted_tokens`). Until `ESTIMATE_MIN_SAMPLES` answers are in, the factor is
    never below `floor` (the one recorded for the pool, or 1.0)."""

    def __init__(self, *, floor: float = 1.0, samples: int = ESTIMATE_SAMPLES) -> None:
        self.floor = floor
        self._ratios: collections.deque[float] = collections.deque(maxlen=samples)
        self.learned = 0
        """Answers learned from since the start."""

    def observe(self, *, estimated: int, reported: int) -> None:
        """One answer: the provider reported `reported` prompt tokens where `estimated` were estimated."""
        if estimated > 0 and reported > 0:
            self._ratios.append(reported / estimated)
            self.learned += 1

    @property
    def factor(self) -> float:
        low, high = ESTIMATE_BOUNDS
        factor = max(self._ratios) * (1 + ESTIMATE_MARGIN) if self._ratios else self.floor
        if len(self._ratios) < ESTIMATE_MIN_SAMPLES:
            factor = max(factor, self.floor)
        return min(high, max(low, factor))

    def tokens(self, estimated: int) -> int:
        """The prompt tokens to reserve for a prompt estimated at `estimated`."""
        return math.ceil(estimated * self.factor)


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
    asking: bool = False
    """A query that may grant it is in flight (the asker's or a release's): no other asks for it."""
    since: float = dataclasses.field(default_factory=time.monotonic)
    recorded: bool = False
    """Recorded as waiting in the database (`limiter_waiters`): another replica's release may grant it."""


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
        self._server: asyncio.Task[None] | None = None  # asks for the queue's waiters while any wait
        self._queue: collections.deque[_Waiter] = collections.deque()  # waiting attempts, in arrival order
        self._last_prune = time.monotonic()  # limits were just given; the first refresh is due later
        self._seq = 0  # counts the releases heard of (here without a hand-over, or in another replica)
        self._wake = asyncio.Event()  # set with every such release, and when a release here granted permits
        self._full_seq: int | None = None  # `_seq` when the last answer refused for concurrency alone
        self._handoffs = 0  # releases in a row that handed their slot to a waiter here
        self._asker_idle = False  # the asker waits only because every waiter is asked for by a release
        self._listener: asyncpg.pool.PoolConnectionProxy | None = None
        self._listener_pid: int | None = None  # its backend pid: how other replicas address a grant to this one
        self._held: set[int] = set()  # permits handed to attempts here and not released yet
        self._connecting = False  # a try to LISTEN is in flight
        self._listen_again_at = 0.0  # monotonic time before which no new try is made (after a failure)
        self._settling: set[asyncio.Task[None]] = set()
        self._returning: set[asyncio.Task[None]] = set()  # connections being given back to the pool (`_connection`)
        self._estimators: dict[str, PromptEstimator] = {}
        self._recorded: dict[str, tuple[float, int]] = {}  # schema -> (factor, learned) last written
        self._estimates_loaded = False
        self._loading = asyncio.Lock()

    @property
    def per_second(self) -> int:
        """Requests allowed in any one second: `burst_s` seconds' worth of the per-minute rate."""
        return max(1, int(self.limits.requests_per_minute * self.settings.burst_s / self.settings.minute_s))

    async def close(self) -> None:
        """Record what was learned of the provider's counting, stop listening for other replicas'
        releases and give the connection back. Attempts still waiting for a permit are cancelled."""
        if self._server is not None:
            self._server.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._server
        for waiter in self._queue:  # nobody asks for them any more
            waiter.granted.cancel()
        await asyncio.gather(*self._returning, return_exceptions=True)  # the pool may be closed next
        with contextlib.suppress(OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
            await self._record_estimates()
        self._listen_again_at = math.inf  # closed: never LISTEN again
        if self._listener is not None:
            listener, self._listener = self._listener, None
            pid, self._listener_pid = self._listener_pid, None
            listener.remove_termination_listener(self._listener_terminated)
            try:
                with contextlib.suppress(OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
                    if pid is not None:  # no release may grant a slot to an attempt of this replica any more
                        await limiter.forget_waiters(listener, pool=self.pool, listener=pid)
                    await listener.remove_listener(RELEASED_CHANNEL, self._heard)
            finally:
                await self.db.release(listener)

    async def _listen(self) -> None:
        """LISTEN for releases, and for grants addressed to this replica, on a connection of its own;
        again when that connection was lost (`relisten_s` after a failed try). Without it the asker
        polls, and other replicas' releases pass this replica's attempts over."""
        if self._listener is not None:
            if self._listener_alive():
                return
            self._lose_listener()  # noticed here before its termination callback ran
        if self._connecting or time.monotonic() < self._listen_again_at:
            return
        self._connecting = True
        listener: asyncpg.pool.PoolConnectionProxy | None = None
        try:
            listener = await self.db.acquire()
            await listener.add_listener(RELEASED_CHANNEL, self._heard)
            listener.add_termination_listener(self._listener_terminated)
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            # Warned once until a try succeeds: a server that never allows LISTEN is retried quietly.
            log = logger.debug if self._listen_again_at else logger.warning
            log("Cannot LISTEN for pool %s's limiter releases, polling only for now: %s", self.pool, exc)
            self._listen_again_at = time.monotonic() + self.settings.relisten_s
            if listener is not None:
                with contextlib.suppress(OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
                    await self.db.release(listener)
            return
        except BaseException:  # cancelled (the attempt that asked gave up): the connection goes back
            if listener is not None:
                await self.db.release(listener)
            raise
        finally:
            self._connecting = False
        self._listener, self._listener_pid = listener, listener.get_server_pid()
        self._listen_again_at = 0.0
        for waiter in self._queue:
            waiter.recorded = False  # any recorded before were recorded under a pid no release grants to

    def _listener_terminated(self, _conn: object) -> None:
        """The LISTEN connection is gone (the server ended it, the network broke). Nothing is heard on
        it any more: stop giving its pid to other replicas, and wake the asker, which listens again
        on a new connection before it next asks."""
        logger.warning("Lost the LISTEN connection for pool %s's limiter releases; listening again", self.pool)
        self._lose_listener()
        self._released()

    def _listener_alive(self) -> bool:
        try:
            return self._listener is not None and not self._listener.is_closed()
        except asyncpg.InterfaceError:  # the pool took the closed connection back already
            return False

    def _lose_listener(self) -> None:
        listener, self._listener, self._listener_pid = self._listener, None, None
        if listener is None:
            return
        with contextlib.suppress(asyncpg.InterfaceError):  # the pool took the closed connection back already
            listener.remove_termination_listener(self._listener_terminated)
        self._settling.add(task := asyncio.create_task(self._release_lost(listener)))
        task.add_done_callback(self._settling.discard)

    async def _release_lost(self, listener: asyncpg.pool.PoolConnectionProxy) -> None:
        with contextlib.suppress(OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
            await self.db.release(listener)

    def _heard(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        if payload == self.pool:
            self._released()
            return
        # A release in another replica granted its slot to an attempt of this one (migration 0033):
        # pool, listener pid, permit, job, fence, tokens.
        fields = payload.split("\t")
        if len(fields) != 6 or fields[0] != self.pool or fields[1] != str(self._listener_pid):
            return
        permit = Permit(id=int(fields[2]), tokens_reserved=int(fields[5]))
        if permit.id in self._held:
            return  # an ask here learned of it first (`Grant.meanwhile`)
        job_id, fence = int(fields[3]), int(fields[4])
        for waiter in self._queue:
            if waiter.job_id == job_id and waiter.fence == fence and not waiter.granted.done():
                self._hand(waiter, permit)
                return
        self._give_back(permit)  # it gave up meanwhile

    def _released(self) -> None:
        """A permit was released and its slot left free: the next ask may be granted."""
        self._seq += 1
        self._wake.set()

    # -- the prompt estimate ------------------------------------------------------------------

    async def estimate(self, reservation: Reservation, *, schema: str) -> Reservation:
        """`reservation` with its prompt corrected by what the provider was seen to count for prompts
        of `schema` (`PromptEstimator`); the local estimate is kept as `estimated_prompt_tokens`."""
        if not self._estimates_loaded:
            # The first attempt: LISTEN at the same time, which its acquire would otherwise wait for next.
            await asyncio.gather(self._load_estimates(), self._listen())
        estimated = reservation.prompt_tokens
        return dataclasses.replace(
            reservation, prompt_tokens=self._estimator(schema).tokens(estimated), estimated_prompt_tokens=estimated
        )

    def learn(self, reservation: Reservation, *, schema: str, tokens_in: int | None) -> None:
        """An answer reported `tokens_in` prompt tokens for a request reserved as `reservation`."""
        if tokens_in is None:
            return
        estimated = reservation.estimated_prompt_tokens
        if estimated is None:
            estimated = reservation.prompt_tokens
        estimator = self._estimator(schema)
        estimator.observe(estimated=estimated, reported=tokens_in)
        if estimator.learned == ESTIMATE_MIN_SAMPLES:
            # Recorded as soon as it means something (then every prune_every_s and at close), so that
            # a worker that is killed early still leaves it for the next.
            self._settling.add(task := asyncio.create_task(self._record_estimates_quietly()))
            task.add_done_callback(self._settling.discard)

    def prompt_factor(self, schema: str) -> float:
        """The factor the prompt estimate of `schema` is multiplied by now."""
        return self._estimator(schema).factor

    def _estimator(self, schema: str) -> PromptEstimator:
        estimator = self._estimators.get(schema)
        if estimator is None:
            estimator = self._estimators[schema] = PromptEstimator()
        return estimator

    async def _load_estimates(self) -> None:
        """Once: start from what the pool's workers recorded (a failure leaves the defaults)."""
        async with self._loading:
            if self._estimates_loaded:
                return
            try:
                async with self.db.acquire() as conn:
                    recorded = await limiter.estimates(conn, pool=self.pool)
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
                logger.warning("Cannot read pool %s's prompt estimates, starting from the default: %s", self.pool, exc)
                recorded = {}
            low, high = ESTIMATE_BOUNDS
            for schema, (factor, _samples) in recorded.items():
                self._estimator(schema).floor = min(high, max(low, factor))
            self._estimates_loaded = True

    async def _record_estimates_quietly(self) -> None:
        try:
            await self._record_estimates()
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            logger.warning("Cannot record pool %s's prompt estimates (recorded later): %s", self.pool, exc)

    async def _record_estimates(self) -> None:
        """Write the factors learned from at least `ESTIMATE_MIN_SAMPLES` answers that changed since."""
        changed = [
            (schema, estimator.factor, estimator.learned)
            for schema, estimator in self._estimators.items()
            if estimator.learned >= ESTIMATE_MIN_SAMPLES
            and self._recorded.get(schema, (None, 0)) != (estimator.factor, estimator.learned)
        ]
        if not changed:
            return
        async with self.db.acquire() as conn:
            for schema, factor, learned in changed:
                await limiter.record_estimate(
                    conn, pool=self.pool, schema=schema, factor=factor, samples=min(learned, ESTIMATE_SAMPLES)
                )
                self._recorded[schema] = (factor, learned)

    # -- permits ------------------------------------------------------------------------------

    async def acquire(self, *, job_id: JobId, fence: int, tokens: int) -> Permit:
        """Wait until the pool admits one more request of `tokens` tokens; return its permit.

        One task per process and pool (`_serve`) asks for everyone queued (up to `max_batch`, in
        arrival order); a release here may grant waiters too. Each waiter only waits for its permit."""
        # A single document larger than a whole minute's budget could never be admitted; it is
        # let through alone (the window otherwise empty) instead of waiting forever.
        tokens = min(tokens, self.limits.tokens_per_minute)
        started = time.monotonic()
        await self._listen()
        waiter = _Waiter(job_id, fence, tokens, asyncio.get_running_loop().create_future())
        self._queue.append(waiter)
        if self._server is None or self._server.done():
            self._server = asyncio.create_task(self._serve())
        try:
            permit = await waiter.granted
        except BaseException:
            self._abandon(waiter)
            raise
        metrics.LIMITER_WAIT.labels(self.pool).observe(time.monotonic() - started)
        return permit

    async def _serve(self) -> None:
        """Ask for the waiting attempts, round after round, while any wait. A failed ask (the database
        is unreachable) fails the waiter at the head of the queue; the others wait on."""
        while any(not w.granted.done() for w in self._queue):
            try:
                await self._serve_queue()
            except Exception as exc:  # handed to the waiter whose ask failed
                head = next((w for w in self._queue if not w.granted.done()), None)
                if head is not None:
                    self._queue.remove(head)
                    head.granted.set_exception(exc)

    def _abandon(self, waiter: _Waiter) -> None:
        """A waiter gave up (cancelled, or the database failed): out of the queue, and a permit granted
        to it in the meantime goes back (one granted later, by a query in flight now, too: `_resolve`)."""
        with contextlib.suppress(ValueError):
            self._queue.remove(waiter)
        if waiter.granted.done() and not waiter.granted.cancelled() and waiter.granted.exception() is None:
            self._give_back(waiter.granted.result())
        else:
            waiter.granted.cancel()

    def _give_back(self, permit: Permit) -> None:
        self._settling.add(task := asyncio.create_task(self.release(permit, tokens_used=None)))
        task.add_done_callback(self._settling.discard)

    def _batch(self, limit: int | None = None) -> list[_Waiter]:
        """The first `limit` (default `max_batch`) waiters no query in flight asks for, in arrival order."""
        limit = self.settings.max_batch if limit is None else limit
        batch: list[_Waiter] = []
        for waiter in self._queue:
            if not waiter.asking and not waiter.granted.done():
                batch.append(waiter)
                if len(batch) == limit:
                    break
        return batch

    @contextlib.asynccontextmanager
    async def _connection(self) -> AsyncIterator[asyncpg.pool.PoolConnectionProxy]:
        """A connection of the pool for one grant or release, given back in the background. asyncpg
        resets a connection before the pool takes it back, one more round trip: awaited here, it
        would stand between a grant and the attempt it goes to."""
        conn = await self.db.acquire()
        try:
            yield conn
        except BaseException:
            await self.db.release(conn)
            raise
        self._returning.add(task := asyncio.create_task(self.db.release(conn)))
        task.add_done_callback(self._returning.discard)

    def _hand(self, waiter: _Waiter, permit: Permit) -> None:
        with contextlib.suppress(ValueError):
            self._queue.remove(waiter)
        self._held.add(permit.id)
        waiter.granted.set_result(permit)

    def _note(self, refusal: Refusal | None, *, seq: int) -> None:
        """Remember whether the pool was full when asked (at release count `seq`)."""
        if refusal is not None and refusal.reason == "concurrency":
            if self._seq == seq:
                self._full_seq = seq
        else:
            self._full_seq = None

    async def _serve_queue(self) -> None:
        """One round for the head of the queue: ask for it and everyone behind it, or, while the pool
        is known to be full, wait for a release."""
        if self._full_seq is not None and self._full_seq == self._seq:
            # Full at the last answer and no release heard of since: asking again now would be refused.
            # Wait for a release (elsewhere: NOTIFY; here: it may hand this waiter its permit), with a
            # jittered poll as the fallback.
            self._wake.clear()
            poll = self.settings.concurrency_poll_s * (0.5 + random.random())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), poll)
            if self._full_seq == self._seq:
                self._full_seq = None  # nothing heard of (or a grant here): ask at the next round anyway
            return
        batch = self._batch()
        if not batch:
            # Every waiter in front is asked for by a release here: its answer wakes this one.
            self._wake.clear()
            self._asker_idle = True
            try:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self.settings.concurrency_poll_s)
            finally:
                self._asker_idle = False
            return
        await self._listen()  # again, when the LISTEN connection was lost: before the ask records the waiters
        seq = self._seq
        for waiter in batch:
            waiter.asking = True
        try:
            grant = await self._ask(batch)
        finally:
            for waiter in batch:
                waiter.asking = False
        permits, refusal = self._granted(batch, grant)
        self._note(refusal, seq=seq)
        await self._maybe_prune()  # after the permits went out: a prune's queries do not delay them
        if refusal is None:
            return
        metrics.LIMITER_REFUSALS.labels(self.pool, refusal.reason).inc()
        if permits or refusal.reason == "concurrency":
            return  # the next in line asks again at once, or (full) waits for a release
        await asyncio.sleep(refusal.retry_in_s)

    async def _ask(self, batch: Sequence[_Waiter]) -> limiter.Grant:
        """Ask once for the permits of `batch`. Refused for concurrency, the attempts not granted are
        recorded as waiting (once each), so that a release in another replica can grant one of them its
        slot directly; one granted so meanwhile is not granted a second permit (`Grant.meanwhile`)."""
        asked = self._asked([(w.job_id, w.fence, w.tokens) for w in batch])
        listener = self._listener_pid
        now = time.monotonic()
        async with self._connection() as conn:
            try:
                if listener is None:  # not listening: a grant from elsewhere could not be heard
                    grant = await limiter.try_acquire_many(conn, pool=self.pool, asked=asked, **self._limits_args())
                    recorded = 0
                else:
                    grant, recorded = await limiter.acquire_recording(
                        conn, pool=self.pool, asked=asked, listener=listener,
                        record=[not w.recorded for w in batch], waited_s=[now - w.since for w in batch],
                        **self._limits_args(),
                    )  # fmt: skip
            except asyncpg.NoDataFoundError as exc:
                raise LookupError(str(exc)) from None
        if recorded:
            for waiter in self._others(batch, grant)[len(grant.permit_ids):]:
                waiter.recorded = True
        return grant

    @staticmethod
    def _others(batch: Sequence[_Waiter], grant: limiter.Grant) -> list[_Waiter]:
        """The waiters of `batch` not granted a permit meanwhile: `grant.permit_ids` went to a prefix of them."""
        if not grant.meanwhile:
            return list(batch)
        meanwhile = {position - 1 for position, _ in grant.meanwhile}
        return [w for i, w in enumerate(batch) if i not in meanwhile]

    def _granted(self, batch: Sequence[_Waiter], grant: limiter.Grant) -> tuple[list[Permit], Refusal | None]:
        """Hand the permits of `grant` to the waiters of `batch` it was asked for: first those another
        replica's release granted one meanwhile (unless its NOTIFY did already), then the new ones (a
        prefix of the others). A permit whose waiter gave up meanwhile goes back. Returns the new
        permits and why the next was refused (None: all were granted)."""
        for position, permit_id in grant.meanwhile:
            waiter = batch[position - 1]
            if not waiter.granted.done():  # else the NOTIFY handed it, or (the waiter gone) gives it back
                self._hand(waiter, Permit(id=permit_id, tokens_reserved=self._capped(waiter.tokens)))
        others = self._others(batch, grant)
        permits, refusal = self._answer(grant, [self._capped(w.tokens) for w in others])
        for waiter, permit in zip(others, permits, strict=False):
            if waiter.granted.done():
                with contextlib.suppress(ValueError):
                    self._queue.remove(waiter)
                self._give_back(permit)
            else:
                self._hand(waiter, permit)
        return permits, refusal

    async def try_acquire(self, *, job_id: JobId, fence: int, tokens: int) -> Permit | Refusal:
        """Ask once for one permit: the permit, or why not and when to ask again."""
        permits, refusal = await self.try_acquire_many([(job_id, fence, tokens)])
        if permits:
            return permits[0]
        assert refusal is not None
        return refusal

    def _limits_args(self) -> dict[str, Any]:
        limits = self.limits
        return {
            "requests_per_minute": limits.requests_per_minute,
            "tokens_per_minute": limits.tokens_per_minute,
            "max_concurrency": limits.max_concurrency,
            "permit_ttl_s": self.settings.permit_ttl_s,
            "window_s": self.settings.window_s,
            "per_second": self.per_second,
        }

    def _asked(self, asked: Sequence[tuple[JobId, int, int]]) -> list[tuple[JobId, int, int]]:
        return [(j, f, self._capped(t)) for j, f, t in asked]

    def _capped(self, tokens: int) -> int:
        return min(tokens, self.limits.tokens_per_minute)

    async def try_acquire_many(
            self, asked: Sequence[tuple[JobId, int, int]]
    ) -> tuple[list[Permit], Refusal | None]:
        """Ask once for permits of (job, fence, tokens), in order: those granted (a prefix), and why
        the next one was not (None when all were granted)."""
        asked = self._asked(asked)
        async with self.db.acquire() as conn:
            try:
                grant = await limiter.try_acquire_many(conn, pool=self.pool, asked=asked, **self._limits_args())
            except asyncpg.NoDataFoundError as exc:
                raise LookupError(str(exc)) from None
        await self._maybe_prune()
        return self._answer(grant, [t for _, _, t in asked])

    def _answer(self, grant: limiter.Grant, tokens: Sequence[int]) -> tuple[list[Permit], Refusal | None]:
        """The permits of a grant for `tokens`, and why the next one was refused (None: all granted)."""
        limits = self.limits
        if grant.cooling:
            return [], Refusal("cooldown", min(grant.cooldown_left_s, self.settings.max_wait_step_s))
        permits = [Permit(id=i, tokens_reserved=t) for i, t in zip(grant.permit_ids, tokens, strict=False)]
        if len(permits) == len(tokens):
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
        """Free the in-flight permit; `tokens_used` replaces the reservation in the window (None keeps it).

        With attempts of this process waiting, the same call asks for the next of them
        (`handoff_streak` times in a row at most): the slot goes to it without a wake-up in any
        replica. Otherwise the same call grants the slot to the attempt of another replica that has
        waited longest, and NOTIFYs that replica alone. When nothing was granted, every replica's
        asker is woken (NOTIFY)."""
        handing_over = self._handoffs < self.settings.handoff_streak
        # One waiter: the release frees one slot. Releases that finish together (calls granted
        # together end together) then each hand their slot to a waiter of their own.
        batch = self._batch(1) if handing_over else []
        seq = self._seq
        asked = self._asked([(w.job_id, w.fence, w.tokens) for w in batch])
        for waiter in batch:
            waiter.asking = True
        self._held.discard(permit.id)
        handed_to: int | None = None
        now = time.monotonic()
        try:
            async with self._connection() as conn:
                try:
                    grant, handed_to = await limiter.release_and_grant(
                        conn, permit_id=permit.id, tokens_used=tokens_used, pool=self.pool, asked=asked,
                        listener=self._listener_pid, waited_s=self._waited_if_recorded(batch, now),
                        **self._limits_args(),
                    )  # fmt: skip
                except asyncpg.NoDataFoundError:  # the pool is gone: release alone
                    await limiter.release(conn, permit_id=permit.id, tokens_used=tokens_used)
                    grant = None
        finally:
            for waiter in batch:
                waiter.asking = False
        permits, refusal = ([], None) if grant is None else self._granted(batch, grant)
        if permits:
            self._handoffs += 1
            assert grant is not None
            full = refusal is not None or grant.in_flight >= self.limits.max_concurrency
            self._note(refusal or (Refusal("concurrency", 0.0) if full else None), seq=seq)
            if self._asker_idle:
                self._wake.set()  # waiting only for the answers of releases like this one
            return
        self._handoffs = 0
        if handed_to is not None:
            return  # the slot went straight to another replica's attempt
        if handing_over or self._listener is None:
            self._released()
        # else: after a streak of hand-overs the asker here is woken by the NOTIFY, like every
        # other replica's, so that one of theirs may take the slot.

    @staticmethod
    def _waited_if_recorded(batch: Sequence[_Waiter], now: float) -> list[float] | None:
        """How long the waiters of `batch` waited, when one of them is recorded as waiting: only such
        an attempt can have been granted a permit by another replica's release. None spares the
        release that check (migration 0040)."""
        if not any(w.recorded for w in batch):
            return None
        return [now - w.since for w in batch]

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
        await self._record_estimates()
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
