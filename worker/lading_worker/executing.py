"""
One attempt: call the provider outside any transaction, validate what it returned,
and turn the outcome into exactly one Finish transition.

    OK + every check passes        -> SUCCEEDED        (result + verdict stored)
    OK + a check fails             -> REVIEW_REQUIRED  (never silently "succeeded")
    TERMINAL                       -> FAILED_TERMINAL
    TRANSIENT / TIMEOUT_AMBIGUOUS  -> RETRY_SCHEDULED, or FAILED_TERMINAL when the retry
                                      policy says attempts or deadline are exhausted
    RATE_LIMITED (429), or         -> the pool cools down; RETRY_SCHEDULED after the cooldown /
    SERVER_OVERLOADED (503 with       Retry-After with the attempt given back (recorded, not
    Retry-After)                      counted against maxAttempts); FAILED_TERMINAL only when the
                                      job's deadline leaves no room
    INVALID_OUTPUT                 -> RETRY_SCHEDULED while retrying can help; else
                                      REVIEW_REQUIRED with the raw output kept: when the
                                      budget is spent, when the same bad output comes back
                                      (temperature 0 reproduces it), or when an answer is
                                      truncated a second time

Every Finish carries what the attempt cost at the pool's `spec.pricing` (`lading.costing`: reported
usage, or the reservation for an answer without usage and a request that timed out after it was
sent); the committer records it on the attempt, the job and the tenant's spend (docs/cost.md).

Every outcome passes `base.checked` first, the boundary for model output: a result PostgreSQL
cannot store (NUL, lone surrogates, integers past 64 bits, non-finite numbers) is INVALID_OUTPUT
(UNSTORABLE_OUTPUT) with its raw output kept escaped, and an implausible token count is not
recorded (logged with the reason). Nothing a model returns can make the commit fail.

A document given by manifest (job.text is None, job.source set by the claimer) is fetched and
verified first (lading.documents.fetching); a fetch failure is the attempt's outcome and the
model is not called: DOCUMENT_NOT_FOUND, DOCUMENT_DIGEST_MISMATCH, DOCUMENT_NOT_UTF8 and
DOCUMENT_REFUSED are TERMINAL, DOCUMENT_UNAVAILABLE (connection, timeout, 5xx) is TRANSIENT.

The executor never touches the database; the committer applies its Finish under the
fence. "Now" is the database time of the claim plus monotonic time since, so retry
decisions never depend on this machine's wall clock.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import functools
import hashlib
import logging
import random
import time
from collections.abc import Awaitable, Callable

import asyncpg
import prometheus_client

from lading import costing, errors, failpoints, limiting, looping, metrics, storable, urls
from lading.db import jobs
from lading.documents import fetching
from lading.ids import Fence, JobId
from lading.jobs import retry, transitions
from lading.providers import base
from lading.settings import AttemptSettings
from lading.validation import policies
from lading_worker import deadlines

logger = logging.getLogger(__name__)

POOL_PAUSE_DEFAULT_S = 60.0
"""How long a pool pauses when its endpoint refuses everyone and says nothing about when to come back."""

RATE_LIMIT_COOLDOWN_DEFAULT_S = 5.0
"""How long a pool cools down after a 429 that did not say when to come back."""

TRUNCATED = "OUTPUT_TRUNCATED"
"""The error class providers give an answer cut off by the output budget (finish_reason length)."""


@dataclasses.dataclass(eq=False)  # identity hash: `_latency_metric` caches per executor
class Executor:
    provider: base.Provider
    settings: AttemptSettings
    rand: Callable[[], float] = random.random
    fetcher: fetching.Fetcher | None = None
    """Reads documents given by manifest; None: such documents fail as unavailable (retried)."""
    limiter: limiting.PoolLimiter | None = None
    """The pool's shared request/token/concurrency limits; None for pools without an upstream (builtin)."""
    default_currency: str | None = None
    """ISO code `invoice-strict-v2` books for a document that shows no currency; None: such a
    document goes to review (`lading.validation.validate`, docs/validation.md)."""
    pricing: costing.Pricing | None = None
    """The pool's spec.pricing: every attempt's cost is recorded with its outcome; None: unpriced."""
    note_reservation: Callable[[JobId, Fence, int, int], Awaitable[object]] | None = None
    """Records a priced attempt's reservation before its request is sent (`lading.db.spend.
    note_reservation`): should the attempt never finish, the reaper charges it (docs/cost.md)."""
    _releasing: set[asyncio.Task[None]] = dataclasses.field(default_factory=set, init=False, repr=False)
    _deadlines: deadlines.Deadlines = dataclasses.field(default_factory=deadlines.Deadlines, init=False, repr=False)
    """The model calls' timeouts, one timer per granule of deadlines (`asyncio.timeout` would set
    one per call: a measurable part of an attempt's CPU when calls return at once)."""

    async def run(
            self,
            job: jobs.ClaimedJob,
            *,
            claimed_mono: float,
            on_model_done: Callable[[], None] | None = None,
    ) -> transitions.Finish:
        """Call the model, then judge its outcome. `on_model_done` runs as soon as the call
        returns, before validation: the claimer uses it to reuse the concurrency slot."""
        job, unreadable = await self.document(job)
        billed = costing.NOTHING
        if unreadable is not None:
            outcome, elapsed = base.checked(unreadable), 0.0
        else:
            outcome, elapsed, billed = await self.call(job)
        if on_model_done is not None:
            on_model_done()
            # Yield once, so that when many calls return together the claimer refills their
            # slots before this burst of validations runs, not after it.
            await asyncio.sleep(0)
        await failpoints.ahit("worker.after_model_before_commit")
        now = job.claimed_at + dt.timedelta(seconds=time.monotonic() - claimed_mono)
        finish = self.decide(job, outcome, now=now, latency_ms=int(elapsed * 1000), billed=billed)
        if self.pricing is not None and finish.usage.cost is not None:
            costing.count_spent(tenant=job.tenant, pool=job.pool, pricing=self.pricing, amount=finish.usage.cost)
        return finish

    async def document(self, job: jobs.ClaimedJob) -> tuple[jobs.ClaimedJob, base.Outcome | None]:
        """The job with its document's text, fetched and verified when it was given by manifest;
        or the classified outcome of a fetch that failed."""
        if job.text is not None:
            return job, None
        if job.source is None:
            return job, base.Outcome.failed(
                base.OutcomeClass.TERMINAL,
                error_class=fetching.DocumentNotFound.error_class,
                error="the job's document has neither text nor a URI",
            )
        if self.fetcher is None:
            return job, base.Outcome.failed(
                base.OutcomeClass.TRANSIENT,
                error_class=fetching.DocumentUnavailable.error_class,
                error="this worker cannot fetch documents given by URI",
            )
        source = job.source
        started = time.monotonic()
        failed: base.Outcome | None = None
        try:
            text = await self.fetcher.text(
                uri=source.uri, sha256=source.sha256, size=source.bytes, namespace=source.namespace
            )
        except fetching.FetchError as exc:
            outcome = base.OutcomeClass.TERMINAL if exc.terminal else base.OutcomeClass.TRANSIENT
            failed = base.Outcome.failed(outcome, error_class=exc.error_class, error=str(exc)[:500])
        except Exception as exc:  # a fetch bug must not kill the worker; the retry policy bounds it
            failed = base.Outcome.failed(
                base.OutcomeClass.TRANSIENT,
                error_class=fetching.DocumentUnavailable.error_class,
                error=urls.scrub(f"{type(exc).__name__}: {exc}")[:500],  # may quote the URL
            )
        metrics.DOCUMENT_FETCH_SECONDS.labels(job.pool).observe(time.monotonic() - started)
        metrics.DOCUMENT_FETCHES.labels(job.pool, "ok" if failed is None else failed.error_class).inc()
        if failed is not None:
            return job, failed
        return dataclasses.replace(job, text=text), None

    async def call(self, job: jobs.ClaimedJob) -> tuple[base.Outcome, float, costing.Billed]:
        """The model call under the attempt timeout; every failure becomes a classified Outcome.
        Also returns the seconds it took and the tokens it is billed for (`lading.costing.billed`)."""
        document = base.Document(
            job_id=job.id,
            key=job.document_key,
            text=job.text or "",
            tenant=job.tenant,
            previous_error_class=job.previous_error_class,
        )
        permit: limiting.Permit | None = None
        reservation = limiting.Reservation(prompt_tokens=0, output_tokens=0)
        if self.limiter is not None:
            try:
                # The provider's estimate of its request, corrected by what it was seen to count.
                reservation = await self.limiter.estimate(self._reservation(job, document), schema=job.schema)
                permit = await self.limiter.acquire(job_id=job.id, fence=job.fence, tokens=reservation.total)
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
                # Nothing was sent: safe to retry, like a connection error before the request.
                return base.Outcome.failed(
                    base.OutcomeClass.TRANSIENT, error_class="LIMITER_UNAVAILABLE", error=str(exc)[:500]
                ), 0.0, costing.NOTHING
        if self.note_reservation is not None and self.pricing is not None:
            if self.limiter is None:  # no upstream to protect (builtin), yet its reservation is priced
                reservation = self._reservation(job, document)
            try:
                await self.note_reservation(job.id, job.fence, reservation.prompt_tokens, reservation.output_tokens)
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
                # Nothing was sent: give the permit back unused and retry, like a limiter outage.
                if permit is not None and self.limiter is not None:
                    self._releasing.add(task := asyncio.create_task(self.limiter.release(permit, tokens_used=0)))
                    task.add_done_callback(self._releasing.discard)
                return base.Outcome.failed(
                    base.OutcomeClass.TRANSIENT, error_class="LIMITER_UNAVAILABLE", error=str(exc)[:500]
                ), 0.0, costing.NOTHING
        started = time.monotonic()
        try:
            async with self._deadlines.within(self.settings.timeout_s):
                outcome = await self.provider.extract(document, schema=job.schema, policy=job.validation_policy)
        except TimeoutError:
            outcome = base.Outcome.failed(
                base.OutcomeClass.TIMEOUT_AMBIGUOUS,
                error_class="AttemptTimeout",
                error=f"no answer within {self.settings.timeout_s:g} s; the request may have been billed",
            )
        except asyncio.CancelledError:
            if permit is not None and self.limiter is not None:
                # Cancelled mid-call (lease lost, shutdown): free the slot now, keep the tokens.
                self._releasing.add(task := asyncio.create_task(self.limiter.release(permit, tokens_used=None)))
                task.add_done_callback(self._releasing.discard)
            raise
        except Exception as exc:  # a provider bug must not kill the worker; the retry policy bounds it
            outcome = base.Outcome.failed(
                base.OutcomeClass.TRANSIENT, error_class="ProviderError", error=f"{type(exc).__name__}: {exc}"[:500]
            )
        outcome = base.checked(outcome)  # what PostgreSQL cannot store stops here, before it is counted
        if outcome.usage_refused is not None:
            logger.warning("Token usage reported by the provider not recorded: %s", outcome.usage_refused)
        elapsed = time.monotonic() - started
        self._latency_metric(job.pool).observe(elapsed)
        if outcome.first_byte_s is not None:
            metrics.PROVIDER_FIRST_BYTE.labels(job.pool).observe(outcome.first_byte_s)
        if outcome.tokens_in:
            metrics.TOKENS.labels(job.pool, "in").inc(outcome.tokens_in)
        if outcome.tokens_out:
            metrics.TOKENS.labels(job.pool, "out").inc(outcome.tokens_out)
        if permit is not None and self.limiter is not None:
            self.limiter.learn(reservation, schema=job.schema, tokens_in=outcome.tokens_in)
            outcome = await self._settle(self.limiter, permit, reservation, outcome)
        billed = costing.billed(
            answered=outcome.outcome in (base.OutcomeClass.OK, base.OutcomeClass.INVALID_OUTPUT),
            sent_and_lost=outcome.outcome is base.OutcomeClass.TIMEOUT_AMBIGUOUS,
            tokens_in=outcome.tokens_in, tokens_out=outcome.tokens_out,
            reserved_in=reservation.prompt_tokens, reserved_out=reservation.output_tokens,
        )  # fmt: skip
        return outcome, elapsed, billed

    def _reservation(self, job: jobs.ClaimedJob, document: base.Document) -> limiting.Reservation:
        """What the request will count against the pool's tokens per minute, estimated from the real
        request when the provider can say (prompt + the output budget it will ask for)."""
        if isinstance(self.provider, limiting.Estimating):
            return self.provider.reservation(document, schema=job.schema, policy=job.validation_policy)
        output = getattr(self.provider, "max_output_tokens", 1024)
        total = limiting.estimate_tokens(job.text or "", max_output_tokens=output)
        return limiting.Reservation(prompt_tokens=total - output, output_tokens=output)

    async def _settle(
            self,
            limiter: limiting.PoolLimiter,
            permit: limiting.Permit,
            reservation: limiting.Reservation,
            outcome: base.Outcome,
    ) -> base.Outcome:
        """Release the permit with the tokens the provider counts (the pool's tokenAccounting), let
        its rate-limit headers tighten the shared view, and on congestion (429, 503 with
        Retry-After) cool the whole pool down. The outcome comes back with `retry_after_s` set to
        the pool's cooldown, so the job is not tried again before the pool may be called."""
        tokens_used = limiter.counted_tokens(
            permit, reservation, tokens_in=outcome.tokens_in, tokens_out=outcome.tokens_out,
            sent_and_lost=outcome.outcome is base.OutcomeClass.TIMEOUT_AMBIGUOUS,
        )  # fmt: skip
        try:
            await limiter.release(permit, tokens_used=tokens_used)
            if outcome.rate_limit is not None:
                await limiter.observe(outcome.rate_limit)
            if outcome.error_class in base.CONGESTED:
                asked_s = RATE_LIMIT_COOLDOWN_DEFAULT_S if outcome.retry_after_s is None else outcome.retry_after_s
                left_s = await limiter.cool_down(asked_s)
                return dataclasses.replace(outcome, retry_after_s=max(left_s, outcome.retry_after_s or 0.0))
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
            # The outcome must still be committed, so the release goes on in the background: left to
            # expire, the permits of every attempt that finished during a database outage would hold
            # the pool's whole concurrency for permit_ttl_s after the database came back.
            self._releasing.add(task := asyncio.create_task(_release_until_done(limiter, permit, tokens_used)))
            task.add_done_callback(self._releasing.discard)
        return outcome

    @functools.cache  # noqa: B019 - one executor per worker, a handful of pools: bounded
    def _latency_metric(self, pool: str) -> prometheus_client.Histogram:
        return metrics.PROVIDER_LATENCY.labels(pool)

    def decide(
            self,
            job: jobs.ClaimedJob,
            outcome: base.Outcome,
            *,
            now: dt.datetime,
            latency_ms: int,
            billed: costing.Billed = costing.NOTHING,
    ) -> transitions.Finish:
        usage = transitions.Usage(tokens_in=outcome.tokens_in, tokens_out=outcome.tokens_out, latency_ms=latency_ms)
        if self.pricing is not None:
            cost = self.pricing.cost(tokens_in=billed.tokens_in, tokens_out=billed.tokens_out)
            usage = dataclasses.replace(usage, cost=cost, currency=self.pricing.currency)
        if outcome.outcome is base.OutcomeClass.OK and outcome.result is not None:
            try:
                verdict = policies.validate(
                    outcome.result,
                    source_text=job.text or "",
                    policy=job.validation_policy,
                    default_currency=self.default_currency,
                )
            except errors.UnknownPolicy as exc:
                return transitions.fail(
                    job.id, job.fence, outcome="terminal", error_class="UNKNOWN_POLICY", error=str(exc), usage=usage
                )
            if verdict.passed:
                return transitions.succeed(
                    job.id, job.fence, result=outcome.result, validation=verdict.to_json(), usage=usage
                )
            return transitions.needs_review(
                job.id, job.fence, result=outcome.result, validation=verdict.to_json(), usage=usage
            )
        error_class = outcome.error_class or "UNKNOWN"
        error = outcome.error or ""
        if outcome.outcome is base.OutcomeClass.TERMINAL:
            return transitions.fail(
                job.id, job.fence, outcome="terminal", error_class=error_class, error=error, usage=usage
            )
        if outcome.pauses_pool:
            return self._pool_unavailable(job, outcome, now=now, usage=usage)
        if outcome.error_class in base.CONGESTED:
            return self._congested(job, outcome, now=now, usage=usage)
        output_sha256 = None
        if outcome.outcome is base.OutcomeClass.INVALID_OUTPUT:
            # Over the escaped text, as stored: a lone surrogate cannot be encoded as it is.
            output_sha256 = hashlib.sha256(storable.escaped(outcome.raw_output or "").encode()).hexdigest()
            repeated = self._repeated_failure(job, error_class=error_class, output_sha256=output_sha256)
            if repeated is not None:
                return self._invalid_output_review(job, outcome, reason=repeated, digest=output_sha256, usage=usage)
        decision = retry.decide(
            attempt=job.attempt,
            now=now,
            deadline_at=job.deadline_at,
            settings=dataclasses.replace(self.settings, max_attempts=job.max_attempts),
            retry_after_s=outcome.retry_after_s,
            # An invalid answer is the model's, not a sign of a struggling provider: due at once
            # (behind the jobs already waiting, by the claim's order), no backoff.
            back_off=outcome.outcome is not base.OutcomeClass.INVALID_OUTPUT,
            rand=self.rand,
        )
        if decision.retry and decision.at is not None:
            return transitions.retry(
                job.id,
                job.fence,
                outcome=outcome.outcome.value,
                error_class=error_class,
                error=error,
                retry_in_s=max(0.0, (decision.at - now).total_seconds()),
                output_sha256=output_sha256,
                usage=usage,
            )
        if outcome.outcome is base.OutcomeClass.INVALID_OUTPUT:
            return self._invalid_output_review(
                job, outcome, reason=decision.reason, digest=output_sha256, usage=usage
            )
        return transitions.fail(
            job.id,
            job.fence,
            outcome=outcome.outcome.value,
            error_class=decision.reason,
            error=f"{error_class}: {error}",
            usage=usage,
        )

    def _pool_unavailable(
            self, job: jobs.ClaimedJob, outcome: base.Outcome, *, now: dt.datetime, usage: transitions.Usage
    ) -> transitions.Finish:
        """The endpoint refuses everyone (key, quota): pause the pool and give the attempt back,
        so that jobs wait for the platform team instead of burning their budgets."""
        pause_s = outcome.retry_after_s if outcome.retry_after_s is not None else POOL_PAUSE_DEFAULT_S
        return self._given_back(
            job, outcome, wait_s=pause_s, error_class=outcome.error_class or "POOL_UNAVAILABLE",
            attempt=job.attempt, pause_pool_s=pause_s, now=now, usage=usage,
        )

    def _congested(
            self, job: jobs.ClaimedJob, outcome: base.Outcome, *, now: dt.datetime, usage: transitions.Usage
    ) -> transitions.Finish:
        """429, or 503 with Retry-After: the pool is congested, the job did nothing wrong. The attempt
        is recorded and given back (not counted against maxAttempts) and the job tried again once
        the pool's cooldown / Retry-After has passed; only the job's deadline bounds how often."""
        return self._given_back(
            job, outcome,
            wait_s=outcome.retry_after_s if outcome.retry_after_s is not None else RATE_LIMIT_COOLDOWN_DEFAULT_S,
            error_class=outcome.error_class or base.RATE_LIMITED,
            attempt=min(job.attempt, job.max_attempts), pause_pool_s=None, now=now, usage=usage,
        )

    def _given_back(
            self,
            job: jobs.ClaimedJob,
            outcome: base.Outcome,
            *,
            wait_s: float,
            error_class: str,
            attempt: int,
            pause_pool_s: float | None,
            now: dt.datetime,
            usage: transitions.Usage,
    ) -> transitions.Finish:
        """The pool, not the job, failed: retry after `wait_s` with this attempt given back (one more
        than maxAttempts allowed to the retry policy, which still keeps the job inside its deadline);
        a job whose deadline leaves no room fails with the policy's reason."""
        decision = retry.decide(
            attempt=attempt,
            now=now,
            deadline_at=job.deadline_at,
            settings=dataclasses.replace(self.settings, max_attempts=job.max_attempts + 1),  # this one is given back
            retry_after_s=wait_s,
            rand=self.rand,
        )
        if decision.retry and decision.at is not None:
            return transitions.retry(
                job.id,
                job.fence,
                outcome=outcome.outcome.value,
                error_class=error_class,
                error=outcome.error or "",
                retry_in_s=max(0.0, (decision.at - now).total_seconds()),
                pause_pool_s=pause_pool_s,
                give_back=True,
                usage=usage,
            )
        return transitions.fail(
            job.id,
            job.fence,
            outcome=outcome.outcome.value,
            error_class=decision.reason,
            error=f"{error_class}: {outcome.error or ''}",
            usage=usage,
        )

    @staticmethod
    def _repeated_failure(job: jobs.ClaimedJob, *, error_class: str, output_sha256: str) -> str | None:
        """Why retrying this invalid output is pointless, or None. At temperature 0 a retry
        reproduces a deterministic failure: the same bad output twice is not tried a third
        time, and a truncated answer gets one retry (with a larger budget), not more."""
        if job.previous_output_sha256 == output_sha256:
            return "REPEATED_INVALID_OUTPUT"
        if error_class == TRUNCATED and job.previous_error_class == TRUNCATED:
            return "OUTPUT_TRUNCATED_AGAIN"
        return None

    @staticmethod
    def _invalid_output_review(
            job: jobs.ClaimedJob,
            outcome: base.Outcome,
            *,
            reason: str,
            digest: str | None,
            usage: transitions.Usage,
    ) -> transitions.Finish:
        """Invalid output that retries will not fix goes to a reviewer with the raw output kept,
        never to SUCCEEDED and never silently dropped."""
        check = {
            "check": "invalid_output",
            "field": None,
            "message": f"{outcome.error_class}: {outcome.error or ''}"[:500],
        }
        return transitions.needs_review(
            job.id,
            job.fence,
            result={"raw_output": outcome.raw_output or ""},
            validation={"policy": job.validation_policy, "passed": False, "failed_checks": [check]},
            error_class=reason,
            outcome=base.OutcomeClass.INVALID_OUTPUT.value,
            error=f"{outcome.error_class}: {outcome.error or ''}"[:500],
            output_sha256=digest,
            usage=usage,
        )


RELEASE_RETRY_BASE_S = 0.2
RELEASE_RETRY_CAP_S = 5.0


async def _release_until_done(limiter: limiting.PoolLimiter, permit: limiting.Permit, tokens_used: int | None) -> None:
    """Release `permit` once the database answers again (jittered backoff), until the permit would
    have expired by itself anyway; a release that keeps failing after that changes nothing."""
    give_up_at = time.monotonic() + limiter.settings.permit_ttl_s
    failures = 0
    while time.monotonic() < give_up_at:
        failures += 1
        await asyncio.sleep(looping.full_jitter(failures, base_s=RELEASE_RETRY_BASE_S, cap_s=RELEASE_RETRY_CAP_S))
        try:
            await limiter.release(permit, tokens_used=tokens_used)
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
            continue
        return
