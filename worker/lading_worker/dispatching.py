"""
The delivery dispatcher: claims due deliveries, signs them, POSTs them, records each outcome.

    run_once():
      read endpoints (health, budget)  ──▶ which may be claimed: closed breaker and a secret;
                                            an open breaker past its cool-down is probed by one replica
      claim due deliveries              ──▶ PENDING | RETRY_SCHEDULED -> IN_FLIGHT (lease, fence+1)
      send them concurrently            ──▶ outside any transaction; Standard Webhooks signature
                                            with one `v1,` entry per active secret
      record outcomes in one statement  ──▶ guarded by fence and lease: a stale dispatcher's
                                            outcome is discarded and its attempt marked `stale`
      fold outcomes into endpoint health ─▶ breaker, AuthFailing

How an attempt's outcome is classified:

    2xx                              DELIVERED
    3xx                              FAILED_TERMINAL (redirects are never followed)
    429, 5xx, 408                    retry (Retry-After honoured)              breaker failure
    401, 403                         retry; repeated: endpoint AuthFailing      breaker failure
    other 4xx                        FAILED_TERMINAL
    refused by the egress policy     FAILED_TERMINAL (EgressRefused, before any connection)
    connect failed / timed out       retry: the request never left              breaker failure
    time-out or error after connect  retry, but AMBIGUOUS: the receiver may     breaker failure
                                     have applied it without answering

A retry is scheduled by the one retry policy (`lading.jobs.retry.RetryPolicy`: full jitter,
Retry-After) built from the endpoint's budget (`retryBudget.maxAttempts`, `maxAgeSeconds` from
the first attempt) and the dispatcher's backoff settings (`Budget.policy`). When
the budget is spent, a delivery with any ambiguous attempt in it becomes UNKNOWN_EXTERNAL (a
human reconciles, then `lading deliveries redeliver|resolve`), any other FAILED_TERMINAL.
The model is never called again: a delivery is built from the stored result.

A dispatcher that dies mid-request leaves an IN_FLIGHT row whose lease runs out; `reap_once`
(any replica) moves it on as an ambiguous attempt. The loops, each named and each safe in many
replicas (claims use SKIP LOCKED, every write is a compare-and-set):

    delivery lane N      run_once: claim, send, record; again at once while there was work
    delivery reaper      reap_once every reap_interval_s
    delivery health      refresh_health (gauges, missing secrets) every health_interval_s
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import datetime as dt
import logging
import secrets as pysecrets
import time
import types
from collections.abc import Awaitable, Callable, Collection, Coroutine, Sequence
from typing import Any, Final

import aiohttp
import aiohttp.abc
import asyncpg
import yarl

from lading import failpoints, logs, looping, metrics, storable, tracing
from lading import settings as lading_settings
from lading.db import conflicts, deliveries
from lading.delivery import breaker, building, egress
from lading.delivery import secrets as delivery_secrets
from lading.delivery.states import DeliveryState
from lading.ids import DeliveryId
from lading.jobs import retry
from lading.models import specs
from lading.webhooks import signing

logger = logging.getLogger(__name__)

USER_AGENT: Final = "lading-dispatcher/1"
ERROR_MAX_CHARS: Final = 500
"""Stored errors are cut to this: an answer's text is the receiver's, not ours to keep whole."""
REAP_BATCH: Final = 500
VETTED_CACHE_MAX: Final = 10_000
"""Verdicts kept (one per endpoint URL in practice); cleared when full, so the cache stays bounded."""

DELIVERED, RETRY, REFUSED, AUTH, AMBIGUOUS, EGRESS, INVALID = (
    "delivered", "retry", "refused", "auth", "ambiguous", "egress", "invalid",
)  # fmt: skip


@dataclasses.dataclass(frozen=True)
class AttemptOutcome:
    """What one attempt learned, before the budget decides what it means for the delivery."""

    kind: str
    """delivered, retry (transient), refused (terminal 3xx/4xx), auth (401/403), ambiguous
    (sent, no answer), egress (refused by policy), invalid (no body to send)."""
    status: int | None = None
    error_class: str | None = None
    error: str | None = None
    retry_after_s: float | None = None
    latency_s: float = 0.0

    @property
    def ambiguous(self) -> bool:
        return self.kind == AMBIGUOUS


@dataclasses.dataclass(frozen=True)
class Budget:
    max_attempts: int
    max_age_s: float

    @classmethod
    def of(cls, spec: dict[str, Any]) -> Budget:
        raw = spec.get("retryBudget") or {}
        return cls(
            max_attempts=int(raw.get("maxAttempts") or specs.RETRY_MAX_ATTEMPTS_DEFAULT),
            max_age_s=float(raw.get("maxAgeSeconds") or specs.RETRY_MAX_AGE_S_DEFAULT),
        )

    def policy(self, settings: lading_settings.DeliverySettings) -> retry.RetryPolicy:
        """The retry policy of a delivery inside this budget: the budget's attempts, the
        dispatcher's backoff, and a whole attempt (`total_timeout_s`) fitting before its end."""
        return retry.RetryPolicy(
            max_attempts=self.max_attempts,
            base_s=settings.backoff_base_s,
            cap_s=settings.backoff_cap_s,
            attempt_timeout_s=settings.total_timeout_s,
        )

    def deadline(self, first_attempt_at: dt.datetime) -> dt.datetime:
        """When the budget's age runs out: `max_age_s` after the first attempt."""
        return first_attempt_at + dt.timedelta(seconds=self.max_age_s)


@dataclasses.dataclass(frozen=True)
class DispatchResult:
    claimed: int = 0
    delivered: int = 0
    retried: int = 0
    failed: int = 0
    unknown: int = 0
    stale: int = 0


@dataclasses.dataclass(frozen=True)
class DeliveryConfig:
    """What a process needs to run a dispatcher besides its database pool (worker, `lading run`)."""

    secrets: delivery_secrets.SecretSource
    policy: egress.EgressPolicy = dataclasses.field(default_factory=egress.EgressPolicy)
    settings: lading_settings.DeliverySettings = dataclasses.field(default_factory=lading_settings.DeliverySettings)

    def dispatcher(self, db: asyncpg.Pool, *, owner: str | None = None) -> Dispatcher:
        return Dispatcher(db, secrets=self.secrets, policy=self.policy, settings=self.settings, owner=owner)


def _cut(text: str) -> str:
    """A stored error: storable (NUL and lone surrogates escaped) and at most ERROR_MAX_CHARS long."""
    text = storable.escaped(text)
    return text if len(text) <= ERROR_MAX_CHARS else text[:ERROR_MAX_CHARS] + "…"


def unstorable(finish: deliveries.Finish, refusal: BaseException, *, ambiguous_before: bool) -> deliveries.Finish:
    """The terminal finish of a delivery whose attempt outcome PostgreSQL refused to store (pure).

    The state stays as true as what is known: DELIVERED when the receiver said 2xx; UNKNOWN_EXTERNAL
    when this or an earlier attempt may have been applied; FAILED_TERMINAL otherwise. Error class
    UNSTORABLE, and an error that names the refusal and what the outcome was; the refused values
    themselves are left out, so this finish is storable."""
    if finish.to is DeliveryState.DELIVERED:
        to, outcome = DeliveryState.DELIVERED, "delivered"
    elif finish.ambiguous or ambiguous_before or finish.to is DeliveryState.UNKNOWN_EXTERNAL:
        to, outcome = DeliveryState.UNKNOWN_EXTERNAL, "unknown"
    else:
        to, outcome = DeliveryState.FAILED_TERMINAL, "failed"
    status = "" if finish.http_status is None else f", HTTP {finish.http_status}"
    return deliveries.Finish(
        delivery_id=finish.delivery_id, fence=finish.fence, to=to, outcome=outcome,
        error_class=storable.UNSTORABLE,
        error=_cut(f"the attempt's outcome ({finish.outcome}{status}, {finish.error_class or 'no error'}) could not "
                   f"be stored: {type(refusal).__name__}: {refusal}"),
        ambiguous=finish.ambiguous,
    )


def classify_status(status: int, *, retry_after: str | None, location: str | None, now: dt.datetime) -> AttemptOutcome:
    """The outcome of an attempt that got an HTTP answer (pure; `latency_s` is added by the caller)."""
    if 200 <= status < 300:
        return AttemptOutcome(DELIVERED, status=status)
    if 300 <= status < 400:
        where = ""
        if location:
            try:
                where = f" to {yarl.URL(location).host or 'a relative location'}"
            except ValueError:
                where = ""
        return AttemptOutcome(
            REFUSED, status=status, error_class="RedirectNotFollowed",
            error=f"HTTP {status}: redirect{where} not followed; register the final URL",
        )
    if status in (401, 403):
        return AttemptOutcome(
            AUTH, status=status, error_class="AuthRefused",
            error=f"HTTP {status}: the receiver refused our signature; check the endpoint's signing secret",
        )
    if status == 429 or status == 408 or 500 <= status < 600:
        return AttemptOutcome(
            RETRY, status=status, error_class="HttpRetryable", error=f"HTTP {status}",
            retry_after_s=retry.parse_retry_after(retry_after, now=now),
        )
    return AttemptOutcome(REFUSED, status=status, error_class="HttpRefused", error=f"HTTP {status}: refused")


def decide(
        claimed: deliveries.ClaimedDelivery,
        outcome: AttemptOutcome,
        *,
        budget: Budget,
        settings: lading_settings.DeliverySettings,
        now: dt.datetime,
        rand: Any = None,
) -> deliveries.Finish:
    """What the attempt's outcome means for the delivery, inside its retry budget (pure)."""
    latency_ms = round(outcome.latency_s * 1000)
    common: dict[str, Any] = dict(
        delivery_id=claimed.id, fence=claimed.fence, http_status=outcome.status, error_class=outcome.error_class,
        error=None if outcome.error is None else _cut(outcome.error), latency_ms=latency_ms,
        ambiguous=outcome.ambiguous,
    )
    if outcome.kind == DELIVERED:
        return deliveries.Finish(to=DeliveryState.DELIVERED, outcome="delivered", **common)
    if outcome.kind in (REFUSED, EGRESS, INVALID):
        return deliveries.Finish(to=DeliveryState.FAILED_TERMINAL, outcome="failed", **common)
    decision = budget.policy(settings).decide(
        attempt=claimed.budget_attempts,
        now=now,
        deadline_at=budget.deadline(claimed.first_attempt_at),
        retry_after_s=outcome.retry_after_s,
        **({} if rand is None else {"rand": rand}),
    )
    if decision.retry:
        assert decision.at is not None
        return deliveries.Finish(
            to=DeliveryState.RETRY_SCHEDULED, outcome="retry",
            retry_in_s=max(0.0, (decision.at - now).total_seconds()), **common,
        )
    spent = f"retry budget spent ({decision.reason}); last attempt: {outcome.error or outcome.kind}"
    common["error"] = _cut(spent)
    if outcome.ambiguous or claimed.ambiguous_attempts > 0:
        return deliveries.Finish(to=DeliveryState.UNKNOWN_EXTERNAL, outcome="unknown", **common)
    return deliveries.Finish(to=DeliveryState.FAILED_TERMINAL, outcome="failed", **common)


class _Progress:
    """Per-request trace context: whether a connection to the receiver was made (so bytes may have left)."""

    __slots__ = ("connected",)

    def __init__(self) -> None:
        self.connected = False


async def _on_connected(_: aiohttp.ClientSession, ctx: types.SimpleNamespace, __: Any) -> None:
    progress = ctx.trace_request_ctx
    if isinstance(progress, _Progress):
        progress.connected = True


def _trace_config() -> aiohttp.TraceConfig:
    config = aiohttp.TraceConfig()
    config.on_connection_create_end.append(_on_connected)
    config.on_connection_reuseconn.append(_on_connected)
    return config


class Dispatcher:
    """Claims, signs, sends and records deliveries; one per process is plenty (`concurrency` in flight)."""

    def __init__(
            self,
            db: asyncpg.Pool,
            *,
            secrets: delivery_secrets.SecretSource,
            policy: egress.EgressPolicy,
            settings: lading_settings.DeliverySettings | None = None,
            owner: str | None = None,
            resolver: aiohttp.abc.AbstractResolver | None = None,
    ) -> None:
        self.db = db
        self.secrets = secrets
        self.policy = policy
        self.settings = settings or lading_settings.DeliverySettings()
        self.owner = owner or f"dispatcher-{pysecrets.token_hex(4)}"
        self._resolver = resolver
        self._session: aiohttp.ClientSession | None = None
        self._missing_secret_logged: set[str] = set()
        self._vetted: dict[tuple[str, tuple[egress.IPNetwork, ...]], yarl.URL | egress.EgressRefused] = {}
        """vet_url's verdict per (URL, allowance): pure, so computed once per endpoint URL. Names are
        still resolved and vetted on every attempt, by the resolver."""

    # Lifecycle -------------------------------------------------------------------------------

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            s = self.settings
            connector = aiohttp.TCPConnector(
                resolver=egress.VettingResolver(self._resolver),
                use_dns_cache=False,  # every attempt resolves and vets afresh
                limit=max(s.concurrency, 1) + 8,
                enable_cleanup_closed=False,
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                timeout=aiohttp.ClientTimeout(
                    total=None, sock_connect=s.connect_timeout_s, sock_read=s.read_timeout_s
                ),
                trace_configs=[_trace_config()],
                auto_decompress=False,
                cookie_jar=aiohttp.DummyCookieJar(),
                headers={"User-Agent": USER_AGENT},
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> Dispatcher:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    # One round -------------------------------------------------------------------------------

    async def run_once(self, *, limit: int | None = None) -> DispatchResult:
        """Claim what is due (up to `limit`, default `concurrency`), send it all, record the outcomes."""
        s = self.settings
        async with self.db.acquire() as conn:
            endpoints = await deliveries.endpoints_for_dispatch(conn)
            by_name = {e.name: e for e in endpoints}
            keys: dict[str, tuple[signing.SigningKey, ...]] = {}
            normal: list[str] = []
            probes: list[str] = []
            for endpoint in endpoints:
                metrics.DELIVERY_BREAKER_STATE.labels(endpoint.name).set(
                    breaker.GAUGE_VALUE[breaker.BreakerState(endpoint.breaker_state)]
                )
                metrics.DELIVERY_AUTH_FAILING.labels(endpoint.name).set(1 if endpoint.auth_failing else 0)
                endpoint_keys = self._keys(endpoint.name)
                if not endpoint_keys:
                    continue
                keys[endpoint.name] = endpoint_keys
                admission = breaker.admission(endpoint)
                if admission is breaker.Admission.CLAIM:
                    normal.append(endpoint.name)
                elif admission is breaker.Admission.PROBE and await deliveries.admit_probe(
                        conn, endpoint=endpoint.name, probe_ttl_s=s.total_timeout_s + 5.0
                ):  # admitted only with a delivery due; the slot frees itself after one attempt's time
                    probes.append(endpoint.name)
            claimed = await deliveries.claim(
                conn, endpoints=normal, owner=self.owner, limit=limit or s.concurrency, lease_ttl_s=s.lease_ttl_s
            )
            for name in probes:
                claimed += await deliveries.claim(
                    conn, endpoints=[name], owner=self.owner, limit=1, lease_ttl_s=s.lease_ttl_s, probe=True
                )
        if not claimed:
            return DispatchResult()
        results = await asyncio.gather(
            *(self._attempt(by_name[c.endpoint], c, keys[c.endpoint]) for c in claimed), return_exceptions=True
        )
        outcomes = [
            self._unexpected(c, r) if isinstance(r, BaseException) else r
            for c, r in zip(claimed, results, strict=True)
        ]
        await failpoints.ahit("delivery.after_send_before_record")
        return await self._record(claimed, outcomes, by_name)

    def _unexpected(self, claimed: deliveries.ClaimedDelivery, exc: BaseException) -> AttemptOutcome:
        """A bug or an unforeseen error in one attempt: logged, and recorded as an attempt that may have
        been sent (so the delivery is retried, and ends UNKNOWN_EXTERNAL rather than lost or doubled)."""
        if not isinstance(exc, Exception):
            raise exc  # cancellation, KeyboardInterrupt: not an attempt's outcome
        logger.error("Delivery %s: unexpected %s", claimed.id, type(exc).__name__, exc_info=exc)
        return AttemptOutcome(AMBIGUOUS, error_class="DispatcherError", error=f"unexpected {type(exc).__name__}")

    def _keys(self, endpoint: str) -> tuple[signing.SigningKey, ...]:
        try:
            keys = self.secrets.keys_for(endpoint)
        except (signing.SecretFormatError, OSError) as exc:
            logger.error("Signing secret of endpoint %s is unusable: %s", endpoint, type(exc).__name__)
            keys = ()
        if not keys and endpoint not in self._missing_secret_logged:
            self._missing_secret_logged.add(endpoint)
            logger.warning("Endpoint %s has no signing secret here; its deliveries wait", endpoint)
        elif keys:
            self._missing_secret_logged.discard(endpoint)
        return keys

    async def _attempt(
            self,
            endpoint: deliveries.EndpointHealth,
            claimed: deliveries.ClaimedDelivery,
            keys: tuple[signing.SigningKey, ...],
    ) -> AttemptOutcome:
        with (
            logs.bound(delivery_id=str(claimed.id), job_id=claimed.job_id, batch_id=claimed.batch_id,
                       tenant=claimed.tenant),
            tracing.span("lading.delivery", batch_id=claimed.batch_id, attributes={
                "delivery_id": str(claimed.id), "job_id": claimed.job_id, "endpoint": endpoint.name,
                "attempt": claimed.attempt,
            }),
        ):
            return await self._attempt_traced(endpoint, claimed, keys)

    async def _attempt_traced(
            self,
            endpoint: deliveries.EndpointHealth,
            claimed: deliveries.ClaimedDelivery,
            keys: tuple[signing.SigningKey, ...],
    ) -> AttemptOutcome:
        try:
            body = building.body(claimed)
        except building.BodyUnavailable as exc:
            return AttemptOutcome(INVALID, error_class="BodyUnavailable", error=str(exc))
        if len(body) > self.settings.max_body_bytes:
            return AttemptOutcome(
                INVALID, error_class="BodyTooLarge",
                error=f"the body is {len(body)} bytes; at most {self.settings.max_body_bytes} are sent",
            )
        allowed = self.policy.allowance(endpoint.name)
        vetted = self._vetted.get((endpoint.url, allowed))
        if vetted is None:
            try:
                vetted = egress.vet_url(endpoint.url, allowed=allowed)
            except egress.EgressRefused as exc:
                vetted = exc
            if len(self._vetted) >= VETTED_CACHE_MAX:
                self._vetted.clear()
            self._vetted[(endpoint.url, allowed)] = vetted
        if isinstance(vetted, egress.EgressRefused):
            metrics.DELIVERY_EGRESS_REFUSED.labels(endpoint.name).inc()
            return AttemptOutcome(EGRESS, error_class="EgressRefused", error=str(vetted))
        url = vetted
        return await self.post(url, endpoint=endpoint.name, delivery_id=str(claimed.id), body=body, keys=keys,
                               allowed=allowed)

    async def post(
            self,
            url: yarl.URL,
            *,
            endpoint: str,
            delivery_id: str,
            body: bytes,
            keys: Sequence[signing.SigningKey],
            allowed: tuple[egress.IPNetwork, ...],
    ) -> AttemptOutcome:
        """One signed POST (timestamp of this attempt), classified. Never raises for network trouble."""
        s = self.settings
        headers = signing.sign(keys, delivery_id, int(time.time()), body)
        headers["Content-Type"] = "application/json"
        progress = _Progress()
        token = egress.allowing(allowed)
        started = time.monotonic()
        try:
            async with asyncio.timeout(s.total_timeout_s):
                async with self._client().post(
                        url, data=body, headers=headers, allow_redirects=False, trace_request_ctx=progress,
                ) as response:
                    truncated = await _read_bounded(response, s.max_response_bytes)
                    outcome = classify_status(
                        response.status,
                        retry_after=response.headers.get("Retry-After"),
                        location=response.headers.get("Location"),
                        now=dt.datetime.now(dt.UTC),
                    )
                    if truncated:
                        response.close()  # do not drain an oversized answer; the connection goes
                        outcome = dataclasses.replace(
                            outcome,
                            error_class=outcome.error_class or "ResponseTooLarge",
                            error=(outcome.error + "; " if outcome.error else "")
                            + f"answer longer than {s.max_response_bytes} bytes; read stopped there",
                        )
        except egress.EgressRefused as exc:
            metrics.DELIVERY_EGRESS_REFUSED.labels(endpoint).inc()
            return AttemptOutcome(EGRESS, error_class="EgressRefused", error=str(exc))
        except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
            refused = egress.find_refusal(exc)
            if refused is not None:
                metrics.DELIVERY_EGRESS_REFUSED.labels(endpoint).inc()
                return AttemptOutcome(EGRESS, error_class="EgressRefused", error=str(refused))
            return AttemptOutcome(
                RETRY, error_class="ConnectFailed", error=f"could not connect: {type(exc).__name__}",
                latency_s=time.monotonic() - started,
            )
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            kind = AMBIGUOUS if progress.connected else RETRY
            what = "timed out" if isinstance(exc, TimeoutError) else f"failed ({type(exc).__name__})"
            if kind == AMBIGUOUS:
                return AttemptOutcome(
                    AMBIGUOUS, error_class="OutcomeUnknown",
                    error=f"request sent, then {what} before an answer: the receiver may have applied it",
                    latency_s=time.monotonic() - started,
                )
            return AttemptOutcome(
                RETRY, error_class="ConnectFailed", error=f"{what} before connecting",
                latency_s=time.monotonic() - started,
            )
        finally:
            egress.reset(token)
        latency = time.monotonic() - started
        metrics.DELIVERY_LATENCY.labels(endpoint).observe(latency)
        return dataclasses.replace(outcome, latency_s=latency)

    async def _record(
            self,
            claimed: Sequence[deliveries.ClaimedDelivery],
            outcomes: Sequence[AttemptOutcome],
            endpoints: dict[str, deliveries.EndpointHealth],
    ) -> DispatchResult:
        s = self.settings
        finishes: list[deliveries.Finish] = []
        health: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
        last_auth: dict[str, int] = {}
        for c, outcome in zip(claimed, outcomes, strict=True):
            now = c.claimed_at + dt.timedelta(seconds=outcome.latency_s)
            finishes.append(
                decide(c, outcome, budget=Budget.of(endpoints[c.endpoint].spec), settings=s, now=now)
            )
            counter = health[c.endpoint]
            if outcome.kind == DELIVERED:
                counter["up"] += 1
                counter["successes"] += 1
            elif outcome.kind == REFUSED:
                counter["up"] += 1
            elif outcome.kind == AUTH:
                counter["failures"] += 1
                counter["auth"] += 1
                if outcome.status is not None:
                    last_auth[c.endpoint] = outcome.status
            elif outcome.kind in (RETRY, AMBIGUOUS):
                counter["failures"] += 1
        folded = {
            name: deliveries.Outcomes(
                up=counter["up"], failures=counter["failures"], auth_refusals=counter["auth"],
                successes=counter["successes"], last_auth_status=last_auth.get(name),
            )
            for name, counter in health.items()
        }
        applied = await self._write(finishes, folded, earlier_ambiguous={c.id for c in claimed if c.ambiguous_attempts})
        counts: collections.Counter[str] = collections.Counter()
        wall_now = dt.datetime.now(dt.UTC)
        for c in claimed:
            finish = applied.get(c.id)
            if finish is None:
                counts["stale"] += 1
                metrics.DELIVERY_STALE.inc()
                metrics.DELIVERY_ATTEMPTS.labels(c.endpoint, "stale").inc()
                logger.warning("Outcome of delivery %s discarded: lease or fence lost", c.id)
                continue
            metrics.DELIVERY_ATTEMPTS.labels(c.endpoint, finish.outcome).inc()
            counts[finish.to.value] += 1
            if finish.to is not DeliveryState.RETRY_SCHEDULED:
                metrics.DELIVERIES_FINISHED.labels(c.endpoint, finish.to.value).inc()
            if finish.to is DeliveryState.DELIVERED:
                metrics.DELIVERY_END_TO_END.labels(c.endpoint).observe(
                    max(0.0, (wall_now - c.created_at).total_seconds())
                )
            elif finish.to is DeliveryState.UNKNOWN_EXTERNAL:
                logger.error("Delivery %s to %s: outcome unknown, budget spent; reconcile it", c.id, c.endpoint)
        return DispatchResult(
            claimed=len(claimed),
            delivered=counts[DeliveryState.DELIVERED.value],
            retried=counts[DeliveryState.RETRY_SCHEDULED.value],
            failed=counts[DeliveryState.FAILED_TERMINAL.value],
            unknown=counts[DeliveryState.UNKNOWN_EXTERNAL.value],
            stale=counts["stale"],
        )

    async def _write(
            self,
            finishes: Sequence[deliveries.Finish],
            health: dict[str, deliveries.Outcomes],
            *,
            earlier_ambiguous: Collection[DeliveryId] = (),
    ) -> dict[DeliveryId, deliveries.Finish]:
        """Record a round: the outcomes under their fences and the endpoints' health, in one
        transaction; returns the finish applied to each delivery that moved (the others were stale).

        Rows are locked in the canonical order (deliveries by id, in the statement; then endpoints
        by name), and a deadlock or serialization failure reruns the whole transaction: the round's
        outcomes stay in memory until it commits. A data error (a value PostgreSQL cannot store)
        isolates the offending outcomes: every other one is recorded, and each refused one ends its
        delivery terminally with error class UNSTORABLE (`unstorable`), so it is neither re-sent
        for ever nor lost without a word. `earlier_ambiguous`: deliveries with an ambiguous attempt
        before this one (an unstorable outcome of theirs ends UNKNOWN_EXTERNAL)."""
        ordered = sorted(finishes, key=lambda f: f.delivery_id)
        by_id = {f.delivery_id: f for f in ordered}

        async def whole_round() -> dict[DeliveryId, str]:
            async with self.db.acquire() as conn, conn.transaction():
                moved = await deliveries.finish_many(conn, ordered, owner=self.owner)
                await self._fold_health(conn, health)
                return moved

        try:
            moved = await conflicts.retrying(whole_round, what="Recording a delivery round")
        except asyncpg.PostgresError as exc:
            if not storable.is_data_error(exc):
                raise
            logger.warning("Recording %d delivery outcomes was refused (%s); isolating the unstorable ones",
                           len(ordered), type(exc).__name__)  # fmt: skip
        else:
            return {d: by_id[d] for d in moved}
        isolated = await storable.isolate(ordered, self._finish_group)
        written = {d: by_id[d] for part in isolated.results for d in part}
        for finish, refusal in isolated.refused:
            replacement = unstorable(finish, refusal, ambiguous_before=finish.delivery_id in earlier_ambiguous)
            logger.error("Delivery %s: its outcome (%s) cannot be stored (%s); it ends %s as %s",
                         finish.delivery_id, finish.outcome, type(refusal).__name__, replacement.to.value,
                         storable.UNSTORABLE)  # fmt: skip
            if await self._finish_group([replacement]):
                written[finish.delivery_id] = replacement

        async def health_only() -> None:
            async with self.db.acquire() as conn, conn.transaction():
                await self._fold_health(conn, health)

        try:
            await conflicts.retrying(health_only, what="Recording endpoint health")
        except asyncpg.PostgresError as exc:
            if not storable.is_data_error(exc):
                raise
            logger.error("Endpoint health of this round could not be stored (%s); skipped", type(exc).__name__)
        return written

    async def _finish_group(self, group: Sequence[deliveries.Finish]) -> dict[DeliveryId, str]:
        """One group of outcomes in its own transaction (a unit `storable.isolate` can split)."""

        async def once() -> dict[DeliveryId, str]:
            async with self.db.acquire() as conn, conn.transaction():
                return await deliveries.finish_many(conn, group, owner=self.owner)

        return await conflicts.retrying(once, what="Recording delivery outcomes")

    async def _fold_health(self, conn: asyncpg.Connection, health: dict[str, deliveries.Outcomes]) -> None:
        """Fold the round into each endpoint's breaker and AuthFailing, endpoints in name order (the
        canonical lock order: two rounds over endpoints X and Y never lock them crosswise)."""
        s = self.settings
        for name in sorted(health):
            await deliveries.record_outcomes(
                conn,
                endpoint=name,
                outcomes=health[name],
                breaker_threshold=s.breaker_threshold,
                cooldown_s=s.breaker_cooldown_s,
                cooldown_cap_s=s.breaker_cooldown_cap_s,
                auth_threshold=s.auth_failing_threshold,
            )

    # Upkeep ----------------------------------------------------------------------------------

    async def reap_once(self) -> int:
        """Move on in-flight deliveries whose dispatcher vanished (lease over): an ambiguous attempt."""
        s = self.settings

        async def reap() -> tuple[list[deliveries.ExpiredLease], dict[DeliveryId, str]]:
            async with self.db.acquire() as conn, conn.transaction():
                expired = await deliveries.lock_expired_leases(conn, limit=REAP_BATCH)
                reaps: list[deliveries.Reap] = []
                for lease in expired:
                    budget = Budget.of(lease.endpoint_spec)
                    decision = budget.policy(s).decide(
                        attempt=max(lease.budget_attempts, 1),
                        now=lease.now,
                        deadline_at=budget.deadline(lease.first_attempt_at),
                    )
                    if decision.retry and decision.at is not None:
                        reaps.append(deliveries.Reap(lease.id, lease.fence, DeliveryState.RETRY_SCHEDULED,
                                                     (decision.at - lease.now).total_seconds()))
                    else:
                        reaps.append(deliveries.Reap(lease.id, lease.fence, DeliveryState.UNKNOWN_EXTERNAL, None))
                return expired, await deliveries.reap_many(conn, reaps)

        expired, moved = await conflicts.retrying(reap, what="Reaping expired delivery leases")
        for lease in expired:
            state = moved.get(lease.id)
            if state is not None:
                metrics.DELIVERY_ATTEMPTS.labels(lease.endpoint, "lease-expired").inc()
                if state == DeliveryState.UNKNOWN_EXTERNAL.value:
                    metrics.DELIVERIES_FINISHED.labels(lease.endpoint, state).inc()
        if moved:
            logger.warning("Reaped %d deliveries whose dispatcher stopped mid-attempt", len(moved))
        return len(moved)

    async def refresh_health(self) -> None:
        """Per-endpoint gauges from the database: UNKNOWN_EXTERNAL backlog, deliveries waiting for a secret."""
        async with self.db.acquire() as conn:
            counts = await deliveries.count_by_state(conn)
            due = await deliveries.due_count_by_endpoint(conn)
            registered = {e.name for e in await deliveries.endpoints_for_dispatch(conn)}
        for name in registered:
            metrics.DELIVERIES_UNKNOWN_EXTERNAL.labels(name).set(counts.get((name, DeliveryState.UNKNOWN_EXTERNAL), 0))
            waiting = 0 if self._keys(name) else due.get(name, 0)
            metrics.DELIVERIES_WAITING_FOR_SECRET.labels(name).set(waiting)
            if waiting:
                logger.warning("%d deliveries to %s wait for a signing secret", waiting, name)

    def loops(self, stop: asyncio.Event) -> list[tuple[str, Coroutine[Any, Any, None]]]:
        """The dispatcher's named loops, for a process's task list: `lanes` claim/send/record lanes,
        the delivery reaper and the health refresh. Each runs until `stop`; the caller closes the
        dispatcher (its HTTP session) once they have all ended."""
        s = self.settings
        lanes = max(1, s.lanes)
        named: list[tuple[str, Coroutine[Any, Any, None]]] = [
            (f"delivery lane {i}", self._lane(stop, limit=max(1, s.concurrency // lanes))) for i in range(lanes)
        ]
        named.append(("delivery reaper", self._every(stop, self.reap_once, name="Delivery reaper",
                                                     interval_s=s.reap_interval_s)))
        named.append(("delivery health", self._every(stop, self.refresh_health, name="Delivery health refresh",
                                                     interval_s=s.health_interval_s)))
        return named

    async def run_forever(self, stop: asyncio.Event) -> None:
        """Run every loop of `loops` until `stop`. A loop that fails stops the others and the error
        propagates; the HTTP session is closed on the way out."""
        try:
            await looping.supervise(looping.spawn(self.loops(stop)), stop=stop)
        finally:
            await self.close()

    def _backoff(self) -> looping.Backoff:
        """A loop's wait after the database failed: poll_interval_s, as the lanes always waited."""
        s = self.settings
        return looping.Backoff(base_s=s.poll_interval_s, cap_s=s.poll_interval_s, jitter="none")

    async def _lane(self, stop: asyncio.Event, *, limit: int) -> None:
        s = self.settings

        async def round_() -> DispatchResult:
            result = await self.run_once(limit=limit)
            if result.failed or result.unknown or result.stale:
                logger.info("Delivery round: %s", result)
            return result

        await looping.run_forever(
            round_, stop, name="Delivery dispatcher", transient=_DATABASE_ERRORS, backoff=self._backoff(),
            pause_s=lambda result: 0.0 if result.claimed else s.poll_interval_s, logger=logger,
        )

    async def _every(
            self, stop: asyncio.Event, step: Callable[[], Awaitable[object]], *, name: str, interval_s: float
    ) -> None:
        await looping.run_forever(
            step, stop, name=name, transient=_DATABASE_ERRORS, backoff=self._backoff(),
            pause_s=lambda _: interval_s, logger=logger,
        )


_DATABASE_ERRORS: Final[tuple[type[Exception], ...]] = (OSError, asyncpg.PostgresError, asyncpg.InterfaceError)
"""What a lost database raises: the loop waits and tries again."""


async def _read_bounded(response: aiohttp.ClientResponse, limit: int) -> bool:
    """Read at most `limit` bytes of the answer; True when there was more (the rest is not read)."""
    remaining = limit
    while remaining >= 0:
        chunk = await response.content.read(min(remaining + 1, 65536))
        if not chunk:
            return False
        remaining -= len(chunk)
    return True
