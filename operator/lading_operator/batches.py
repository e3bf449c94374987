"""
ExtractionBatch reconciler: admission through the core, the quota queue, suspend, status from
PostgreSQL, and the finalizer that cancels the batch's jobs on deletion.

One reconcile loop per batch (a kopf daemon, started on create and on operator start alike):

    not admitted ──▶ applying.admit_batch (tenant from the namespace, every rule of its quota, acceptance)
        │  rejected: Pending, Admitted=False with the core's reason; wait in the queue
        ▼
    admitted ─────▶ mirror spec.suspend into the batch and its jobs (`batches.set_suspended`);
                    read the batch's counts;
                    write status when it changed; sleep until woken or the interval passes

A manifest batch (spec.manifestUri) is checked against its quota first, so a refused one downloads
nothing; its manifest is then read holding no database connection and no tenant lock, at most
`max_concurrent_manifests` at once (`Runtime.manifest_downloads`), and accepted like an inline batch of
its size. Slow or stalled manifests therefore never starve the admission of other batches.

A batch naming a DeliveryEndpoint that does not exist is admitted: its results wait, its Delivered
condition is False with reason EndpointNotFound (and `lading_deliveries_waiting_for_endpoint` counts
them), and it is looked at every status interval, so the condition clears soon after the endpoint appears.

Admission is idempotent because acceptance is (keyed by tenant + `namespace/name/uid`): an
operator killed mid-admission and restarted re-runs it and inserts nothing twice.

The quota queue, and why not `kopf.TemporaryError(delay=...)`: a retry delay is blind, so it
either polls (short delay: a busy loop across hundreds of waiting batches) or admits late (long
delay: the batch sits Pending long after room appeared). Instead a batch over quota registers
in an in-memory per-tenant waiting set (`Runtime.waiting`) and sleeps; whatever frees room wakes
exactly the waiting batches of that tenant: a batch of the tenant settling, shrinking its queue or
being deleted, or the TenantQuota changing. The wait also has a long timeout
(`idle_interval_s`) as a safety net, e.g. for room freed by another operator replica or by hand.
Admissions of one tenant run concurrently while the tenant's known queue plus the jobs of the
admissions in progress fit its quota (`runtime.TenantBudget`); when they would not, they are taken
one at a time, after the running ones finished, so two batches woken together never squeeze into the
same room (and the core's own quota check runs in every admission anyway). The waiting set is
memory only: after a restart every batch's loop re-runs admission, so the queue rebuilds itself
from the objects.

Status is computed from PostgreSQL and patched only when it differs from what was last written: a
change of phase or of a condition at once, a change of counts and ages only at most once per
`status_interval_s` per batch. The operator's own status writes do not wake the loop (only a new
generation or a deletion does), so API traffic at steady state is bounded by the number of
batches, not of jobs.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import time
from collections.abc import Mapping
from typing import Any

import asyncpg
import kopf
import pydantic

from lading import accepting, applying, batch_phase, errors, failpoints
from lading.db import batches, deliveries, fairness, jobs, queue, registry, reuse, spend
from lading.documents import fetching, manifest_lines
from lading.ids import BatchId, PoolName, TenantName
from lading.jobs.states import SETTLED, JobState
from lading.models import specs
from lading.settings import DocumentSettings
from lading_operator import budgets, conditions, events, reconciling, runtime, status

logger = logging.getLogger("lading.operator.batches")


@functools.cache
def _documents() -> DocumentSettings:
    """Where manifests may be read from: $LADING_DOCUMENT_ROOTS (a shared volume mounted into the
    operator) and the egress allow-list of $LADING_EGRESS_ALLOW, read once."""
    return fetching.settings_from_env(os.environ)

KIND = "ExtractionBatch"
PLURAL = "extractionbatches"
RECENT_FAILURES = status.RECENT_FAILURES_MAX
QUEUED_STATES = (JobState.READY, JobState.RUNNING, JobState.RETRY_SCHEDULED)
SIGNIFICANT = ("phase", "observedGeneration", "conditions", "total", "recentFailures", "completedAt", "batchId")
"""Status fields whose change is written at once; counts and ages wait for the next status interval."""
CLOCK_FIELDS = frozenset({"oldestEligibleAgeSeconds", "etaSeconds"})
"""Status fields that change with the clock alone (a waiting job ages, an ETA counts down): a change of
these alone is written at most once per CLOCK_REFRESH_S; with any other change they are written too."""
CLOCK_REFRESH_S = 300.0
"""How stale a clock-only field may get: a batch at rest costs one status write per this, not per minute."""
QUEUE_FIELDS = ("queuePosition", "etaSeconds")
"""Status fields computed from the pool's whole queue (`lading.db.queue.position`): read at most once per
status interval, and never a reason to write on their own before it passes."""
STALLING = frozenset({conditions.INVALID_SPEC, conditions.INVALID_MANIFEST, conditions.IDEMPOTENCY_CONFLICT})
"""Reasons a batch is not admitted that only a person can clear (kstatus: Stalled=True); the others clear
by themselves (room in the quota, a pool or quota appearing)."""


def key(namespace: str, name: str) -> runtime.ObjectKey:
    return (KIND, namespace, name)


def parse(body: Mapping[str, Any]) -> specs.ExtractionBatch:
    meta = body.get("metadata", {})
    return specs.ExtractionBatch.model_validate(
        {
            "apiVersion": specs.API_VERSION,
            "kind": KIND,
            "metadata": {
                "name": meta.get("name"),
                "namespace": meta.get("namespace"),
                "uid": meta.get("uid"),
                "generation": meta.get("generation"),
            },
            "spec": dict(body.get("spec") or {}),
        }
    )


def _invalid_message(exc: pydantic.ValidationError) -> str:
    first = exc.errors()[0]
    where = ".".join(str(part) for part in first["loc"])
    return f"spec.{where}: {first['msg']}" if where else str(first["msg"])


@dataclasses.dataclass
class Observation:
    """What the last refresh saw, to notice change (room freed, batch settled)."""

    queued: int = -1
    settled: bool = False


class Reconciler:
    """The reconcile loop of one ExtractionBatch."""

    def __init__(self, rt: runtime.Runtime, body: kopf.Body) -> None:
        self.rt = rt
        self.body = body
        self.namespace = str(body.metadata.namespace)
        self.name = str(body.metadata.name)
        self.key = key(self.namespace, self.name)
        self.tenant: TenantName | None = None
        self.admitted: batches.ObservedBatch | None = None
        self.last_written: dict[str, Any] = dict(body.get("status") or {})
        self.seen = Observation()
        self.failures_at = -1
        self.last_write_at = 0.0
        self._parsed_batch: specs.ExtractionBatch | None = None
        self._parsed_generation: int | None = None
        self.priority_applied: int | None = None
        """The priority class the batch's jobs have (read from the database once, then kept)."""
        self.priority_refused: str | None = None
        """A spec.priority the tenant's quota does not allow: not applied, and said once."""
        self.queue_read_at = -float("inf")

    @property
    def idempotency_key(self) -> str:
        return accepting.idempotency_key(namespace=self.namespace, name=self.name, uid=str(self.body.metadata.uid))

    async def run(self, stopped: Any) -> None:
        try:
            await reconciling.reconcile_forever(
                self.reconcile, rt=self.rt, key=self.key, body=self.body,
                name=f"batch {self.namespace}/{self.name}", stopped=stopped,
            )
        finally:
            self.rt.leave_queue(self.key)
            self.rt.wakeups.pop(self.key, None)
            self.rt.tokens.pop(self.key, None)

    async def reconcile(self) -> float:
        if self.body.metadata.deletion_timestamp:
            return self.rt.settings.idle_interval_s
        if self.admitted is None:
            try:
                batch = self._parsed()
            except pydantic.ValidationError as exc:
                await self.pending(conditions.INVALID_SPEC, _invalid_message(exc))
                return self.rt.settings.idle_interval_s
            waited = await self.admit(batch)
            if waited is not None:
                return waited
        # Once admitted only `suspend` matters (the rest is immutable): no need to parse 1000s of documents again.
        return await self.refresh(suspend=self.body.spec.get("suspend", False) is True)

    def _parsed(self) -> specs.ExtractionBatch:
        """The spec as the core's model, parsed once per generation (parsing a large batch costs milliseconds)."""
        generation = self.body.metadata.get("generation")
        if self._parsed_batch is None or self._parsed_generation != generation:
            self._parsed_batch = parse(self.body)
            self._parsed_generation = generation
        return self._parsed_batch

    # --- Admission.

    async def admit(self, batch: specs.ExtractionBatch) -> float | None:
        """Admit the batch; None when admitted, else how long to wait (in the queue)."""
        async with self.rt.db.acquire() as conn:
            # Already accepted (before a restart), possibly under a tenant that no longer covers the
            # namespace: that acceptance stands, nothing is accepted twice.
            earlier = await batches.tenant_by_key(conn, idempotency_key=self.idempotency_key)
            if earlier is not None:
                existing = await batches.get_observed(conn, tenant=earlier, idempotency_key=self.idempotency_key)
                if existing is not None:
                    self.tenant, self.admitted = earlier, existing
                    self.rt.leave_queue(self.key)
                    return None
            tenant = await registry.tenant_for_namespace(conn, namespace=self.namespace)
        try:
            applied = await self._admit(batch, tenant)
        except applying.AdmissionRejected as exc:
            queue_full = exc.reason == conditions.QUOTA_EXCEEDED
            waiting_on = tenant if queue_full and tenant is not None else runtime.ANY_TENANT
            self.rt.wait_in_queue(self.key, waiting_on)
            where = None
            if queue_full and tenant is not None:
                where = await self._queue_position(tenant, batch_id=None, documents=len(batch.spec.documents or ()))
            await self.pending(exc.reason, str(exc), where=where)
            return self.rt.settings.idle_interval_s
        except errors.IdempotencyConflict as exc:
            await self.pending(conditions.IDEMPOTENCY_CONFLICT, str(exc))
            return self.rt.settings.idle_interval_s
        self.rt.leave_queue(self.key)
        self.tenant = applied.tenant
        async with self.rt.db.acquire() as conn:
            self.admitted = await batches.get_observed(
                conn, tenant=applied.tenant, idempotency_key=self.idempotency_key
            )
        if applied.result.created:
            events.normal(
                self.body,
                reason=conditions.ADMITTED_REASON,
                message=f"{len(applied.result.job_ids)} documents accepted as batch {applied.result.batch_id} "
                f"(tenant {applied.tenant}, pool {applied.pool})",
            )
        return None

    async def _admit(self, batch: specs.ExtractionBatch, tenant: TenantName | None) -> applying.AppliedBatch:
        """Admission through the core. A manifest batch is checked against its quota first (refused: nothing
        is downloaded), then its manifest is read holding no database connection and no tenant lock, with
        one of `manifest_downloads` permits, then it is accepted like an inline batch of that size."""
        if batch.spec.manifest_uri is None:
            return await self._accept(batch, tenant, manifest=None, jobs=len(batch.spec.documents or ()))
        async with applying.read_manifest_for_admission(
            self.rt.db, batch, documents=_documents(), downloads=self.rt.manifest_downloads
        ) as spooled:
            return await self._accept(batch, tenant, manifest=spooled, jobs=spooled.documents)

    async def _accept(
        self,
        batch: specs.ExtractionBatch,
        tenant: TenantName | None,
        *,
        manifest: manifest_lines.Spooled | None,
        jobs: int,
    ) -> applying.AppliedBatch:
        """The core's admission (every rule, then acceptance); concurrent with other admissions of the tenant
        while its budget has room for all of them, serialised otherwise (see runtime.TenantBudget)."""
        if tenant is None:
            async with self.rt.db.acquire() as conn:
                # Raises NoTenantQuota (or admits, if a quota just appeared).
                return await applying.admit_batch(conn, batch, manifest=manifest, documents=_documents())
        budget = self.rt.budgets[tenant]
        while True:
            async with budget.lock:
                async with self.rt.db.acquire() as conn:
                    rules = await registry.tenant_rules(conn, tenant=tenant)
                    # A byte limit (or a vanished quota): one at a time, and the core's check decides.
                    concurrent = rules is not None and rules.max_queued_bytes is None
                    if concurrent and rules is not None and rules.max_queued_jobs is not None:
                        limit = rules.max_queued_jobs
                        fresh = time.monotonic() - budget.counted_at < runtime.BUDGET_SNAPSHOT_MAX_AGE_S
                        known = budget.known_queued
                        if known is None or not fresh or known + budget.reserved + jobs > limit:
                            known = await registry.tenant_queued_jobs(conn, tenant=tenant)
                            budget.known_queued, budget.counted_at = known, time.monotonic()
                        concurrent = known + budget.reserved + jobs <= limit
                    if not concurrent and budget.reserved == 0:
                        applied = await applying.admit_batch(conn, batch, manifest=manifest, documents=_documents())
                        budget.known_queued = None
                        return applied
                if concurrent:
                    budget.reserve(jobs)
            if concurrent:
                break
            await budget.idle.wait()  # admissions running now will change the count: decide after them
        admitted = False
        try:
            async with self.rt.db.acquire() as conn:
                applied = await applying.admit_batch(conn, batch, manifest=manifest, documents=_documents())
            admitted = applied.result.created
            return applied
        finally:
            budget.release(jobs, admitted=admitted)

    async def pending(self, reason: str, message: str, *, where: queue.QueuePosition | None = None) -> None:
        generation = self.body.metadata.get("generation")
        previous = self.last_written.get("conditions")
        stalled = reason in STALLING
        desired = conditions.dump(
            status.ExtractionBatchStatus(
                phase="Pending",
                observed_generation=generation,
                conditions=[
                    conditions.condition(
                        previous, type=conditions.READY, value=False, reason=reason, message=message,
                        generation=generation,
                    ),
                    conditions.condition(
                        previous, type=conditions.STALLED, value=stalled,
                        reason=reason if stalled else conditions.NOT_STALLED, message=message if stalled else "",
                        generation=generation,
                    ),
                    conditions.condition(
                        previous, type=conditions.ADMITTED, value=False, reason=reason, message=message,
                        generation=generation,
                    ),
                    conditions.condition(
                        previous, type=conditions.RECONCILING, value=not stalled,
                        reason=conditions.RECONCILED if stalled else reason, message="" if stalled else message,
                        generation=generation,
                    ),
                ],
            )
        )  # fmt: skip
        if reason == conditions.QUOTA_EXCEEDED:  # waiting in its tenant's queue: it has a place there
            desired.update(self._queue_fields(where))
        queue_only = self._queue_only(desired)
        if conditions.changed(self.last_written, desired) and not queue_only:
            events.warning(self.body, reason=reason, message=message[:1024])
        await self._write(desired, volatile_only=queue_only)

    # --- Queue position and priority.

    def _pool(self) -> PoolName:
        ref = self.body.spec.get("inferencePoolRef") or {}
        return applying.pool_key(str(ref.get("namespace") or self.namespace), str(ref.get("name") or ""))

    async def _queue_position(
        self, tenant: TenantName, *, batch_id: BatchId | None, documents: int = 0
    ) -> queue.QueuePosition | None:
        """Where the batch stands in its pool's queue, read at most once per status interval (None: not
        read now; the last written values stand)."""
        now = time.monotonic()
        if now - self.queue_read_at < self.rt.settings.status_interval_s:
            return None
        self.queue_read_at = now
        async with self.rt.db.acquire() as conn:
            return await queue.position(
                conn, pool=self._pool(), tenant=tenant, batch_id=batch_id, documents=documents
            )

    def _queue_fields(self, where: queue.QueuePosition | None) -> dict[str, Any]:
        if where is None:  # not read this time: keep what was written
            return {field: self.last_written[field] for field in QUEUE_FIELDS if field in self.last_written}
        fields = {"queuePosition": where.position, "etaSeconds": where.eta_s}
        return {field: value for field, value in fields.items() if value is not None}

    def _queue_only(self, desired: dict[str, Any]) -> bool:
        """Whether `desired` differs from what was written in the queue fields alone (or not at all)."""
        patch = conditions.status_patch(self.last_written, desired) or {}
        return all(field in QUEUE_FIELDS for field in patch)

    async def _apply_priority(self, conn: asyncpg.Connection, batch_id: BatchId) -> str | None:
        """Give the batch's unfinished jobs spec.priority when it changed; the message when the tenant's
        quota does not allow it (the jobs keep theirs)."""
        name = str(self.body.spec.get("priority") or "normal")
        wanted = accepting.PRIORITIES.get(name)
        if self.priority_applied is None:
            self.priority_applied = await queue.priority(conn, batch_id=batch_id)
        if wanted is None or wanted == self.priority_applied:
            self.priority_refused = None
            return None
        assert self.tenant is not None
        rules = await registry.tenant_rules(conn, tenant=self.tenant)
        if rules is not None and rules.allowed_priorities is not None and name not in rules.allowed_priorities:
            message = (f"priority {name} is not allowed for tenant {self.tenant} (allowedPriorities: "
                       f"{', '.join(rules.allowed_priorities) or 'none'}); its jobs keep their priority")  # fmt: skip
            if self.priority_refused != name:
                events.warning(self.body, reason=conditions.PRIORITY_NOT_ALLOWED, message=message)
                self.priority_refused = name
            return message
        changed = await queue.set_priority(conn, batch_id=batch_id, priority=wanted)
        self.priority_applied, self.priority_refused = wanted, None
        events.normal(self.body, reason=conditions.PRIORITY_CHANGED,
                      message=f"priority {name}: {changed} unfinished job(s) re-ranked")  # fmt: skip
        return None

    # --- Status.

    async def refresh(self, *, suspend: bool) -> float:
        assert self.admitted is not None and self.tenant is not None
        async with self.rt.db.acquire() as conn:
            if suspend != self.admitted.suspended:
                await batches.set_suspended(conn, batch_id=self.admitted.batch_id, suspended=suspend)
                message = "no new jobs of this batch are claimed" if suspend else "claiming resumed"
                reason = conditions.SUSPENDED if suspend else conditions.RESUMED
                events.normal(self.body, reason=reason, message=message)
            current = await batches.get_observed(conn, tenant=self.tenant, idempotency_key=self.idempotency_key)
            if current is None:
                self.admitted = None
                return self.rt.settings.retry_initial_s
            self.admitted = current
            priority_refused = await self._apply_priority(conn, current.batch_id)
            failed = current.counts[JobState.FAILED_TERMINAL]
            failures = None
            if failed and failed != self.failures_at:
                failures = await jobs.failures_of_batch(conn, batch_id=current.batch_id, limit=RECENT_FAILURES)
            delivered = None
            endpoint_missing = False
            if self.rt.has_deliveries and current.endpoint is not None:
                delivered = await deliveries.count_delivered_of_batch(conn, batch_id=current.batch_id)
                endpoint_missing = not await registry.endpoint_exists(conn, name=current.endpoint)
            budget = await fairness.tenant_budget(conn, tenant=self.tenant)
            cost = await spend.batch_cost(conn, batch_id=current.batch_id)
            reused = await reuse.count_reused_of_batch(conn, batch_id=current.batch_id)
        where = None
        if sum(n for s, n in current.counts.items() if s in SETTLED) < current.total and not suspend:
            where = await self._queue_position(self.tenant, batch_id=current.batch_id)
        desired = self.status_of(
            current, failures=failures, delivered=delivered, suspend=suspend, budget=budget,
            endpoint_missing=endpoint_missing, where=where, priority_refused=priority_refused, cost=cost,
            reused=reused,
        )  # fmt: skip
        await self._write(desired, volatile_only=self._volatile_only(desired))
        if failures is not None:
            if failures and failed > max(self.failures_at, 0):
                latest = failures[0]
                more = failed - max(self.failures_at, 0)
                events.warning(
                    self.body,
                    reason=conditions.DOCUMENTS_FAILED,
                    message=f"{more} more document(s) failed, {failed} in all; latest: {latest.document_key[:256]} "
                    f"({batch_phase.failure_reason(latest.error_class)})",
                )
            self.failures_at = failed
        queued = sum(current.counts[s] for s in QUEUED_STATES)
        settled = sum(n for s, n in current.counts.items() if s in SETTLED) >= current.total
        if queued < self.seen.queued:
            self.rt.room_in(self.tenant)
        if settled and not self.seen.settled and self.seen.queued >= 0:
            phase = str(desired.get("phase"))
            post = events.normal if phase == "Completed" else events.warning
            post(self.body, reason=phase, message=self._summary(current))
        self.seen = Observation(queued=queued, settled=settled)
        good = current.counts[JobState.SUCCEEDED] + current.counts[JobState.REVIEW_REQUIRED]
        delivering = delivered is not None and delivered < good
        if (settled or suspend) and not delivering:
            return self.rt.settings.idle_interval_s
        # Work or deliveries remain (among them deliveries waiting for a DeliveryEndpoint to appear).
        return self.rt.settings.status_interval_s

    def _summary(self, current: batches.ObservedBatch) -> str:
        c = current.counts
        return (
            f"{c[JobState.SUCCEEDED]} succeeded, {c[JobState.REVIEW_REQUIRED]} awaiting review, "
            f"{c[JobState.FAILED_TERMINAL]} failed, {c[JobState.CANCELLED]} cancelled of {current.total}"
        )

    def status_of(
        self,
        current: batches.ObservedBatch,
        *,
        failures: list[jobs.Failure] | None,
        delivered: int | None,
        suspend: bool,
        budget: fairness.TenantBudget | None = None,
        endpoint_missing: bool = False,
        where: queue.QueuePosition | None = None,
        priority_refused: str | None = None,
        cost: spend.Cost | None = None,
        reused: int | None = None,
    ) -> dict[str, Any]:
        c = current.counts
        generation = self.body.metadata.get("generation")
        previous = self.last_written.get("conditions")
        # The one phase rule (lading.batch_phase), shared with the HTTP intake's batch status.
        rule = batch_phase.phase_of(c, total=current.total, suspended=suspend)
        settled, good, phase, failed = rule.settled, rule.good, rule.phase, rule.failed
        progressing_reason, complete_reason = rule.progressing_reason, rule.complete_reason
        completed_at = None
        if settled and current.last_finished_at is not None:
            completed_at = status.rfc3339(current.last_finished_at)
        admitted_message = f"batch {current.batch_id} of tenant {self.tenant}"
        conds = [
            conditions.condition(
                previous, type=conditions.ADMITTED, value=True, reason=conditions.ADMITTED_REASON,
                message=admitted_message,
                generation=generation,
            ),
            conditions.condition(
                previous, type=conditions.PROGRESSING, value=not settled and not suspend, reason=progressing_reason,
                generation=generation,
            ),
            # A failed batch is not Complete: `kubectl wait --for=condition=Complete` waits for success only.
            conditions.condition(
                previous, type=conditions.COMPLETE, value=settled and not failed, reason=complete_reason,
                generation=generation,
            ),
            conditions.condition(
                previous, type=conditions.FAILED_CONDITION, value=failed, reason=complete_reason,
                message=self._summary(current) if failed else "", generation=generation,
            ),
            # Admitted, and this generation's priority and suspend applied before this status is written.
            conditions.condition(
                previous, type=conditions.RECONCILING, value=False, reason=conditions.RECONCILED,
                generation=generation,
            ),
        ]  # fmt: skip
        delivery: status.Condition | None = None
        if endpoint_missing:
            waiting = good - (delivered or 0)
            delivery = conditions.condition(
                previous, type=conditions.DELIVERED, value=False, reason=conditions.ENDPOINT_NOT_FOUND,
                message=f"DeliveryEndpoint {current.endpoint} does not exist; {waiting} result(s) wait for it "
                f"({delivered or 0} of {good} delivered)",
                generation=generation,
            )  # fmt: skip
        elif delivered is not None:
            delivery = conditions.condition(
                previous, type=conditions.DELIVERED, value=delivered >= good and settled,
                reason=conditions.ALL_DELIVERED if delivered >= good and settled else conditions.DELIVERIES_PENDING,
                message=f"{delivered} of {good} results delivered", generation=generation,
            )  # fmt: skip
        if delivery is not None:
            conds.append(delivery)
        # kstatus: Ready once the batch did what it is for (completed, and delivered when it has an endpoint);
        # Stalled when only a person can move it on (it failed; a priority its quota refuses).
        if failed:
            ready_reason, ready_message = conditions.FAILED, self._summary(current)
        elif not settled:
            ready_reason, ready_message = progressing_reason, ""
        elif delivery is not None and delivery.status != "True":
            ready_reason, ready_message = delivery.reason, delivery.message
        else:
            ready_reason = delivery.reason if delivery is not None else conditions.COMPLETED
            ready_message = self._summary(current)
        stalled_reason = conditions.FAILED if failed else (
            conditions.PRIORITY_NOT_ALLOWED if priority_refused is not None else conditions.NOT_STALLED
        )
        conds[:0] = [
            conditions.condition(
                previous, type=conditions.READY, value=ready_reason in (conditions.COMPLETED, conditions.ALL_DELIVERED),
                reason=ready_reason, message=ready_message, generation=generation,
            ),
            conditions.condition(
                previous, type=conditions.STALLED, value=stalled_reason != conditions.NOT_STALLED,
                reason=stalled_reason,
                message=self._summary(current) if failed else (priority_refused or ""), generation=generation,
            ),
        ]  # fmt: skip
        spent = None if budget is None else budgets.state(budget, tenant=str(self.tenant))
        if spent is not None:
            conds.append(
                conditions.condition(
                    previous, type=conditions.BUDGET_EXHAUSTED, value=spent.exhausted and not settled,
                    reason=spent.reason, message=spent.message, generation=generation,
                )
            )  # fmt: skip
        recent: list[status.RecentFailure] | None = None
        if failures is not None:
            recent = [
                status.RecentFailure(
                    document_key=f.document_key[:256],
                    reason=batch_phase.failure_reason(f.error_class),
                    message=f.error[:512],
                    at=status.rfc3339(f.at),
                )
                for f in failures
            ]
        model = status.ExtractionBatchStatus(
            phase=phase,  # type: ignore[arg-type]
            observed_generation=generation,
            batch_id=str(current.batch_id),
            tenant=self.tenant,
            total=current.total,
            ready=c[JobState.READY],
            running=c[JobState.RUNNING],
            retry_scheduled=c[JobState.RETRY_SCHEDULED],
            review_required=c[JobState.REVIEW_REQUIRED],
            succeeded=c[JobState.SUCCEEDED],
            failed=c[JobState.FAILED_TERMINAL],
            cancelled=c[JobState.CANCELLED],
            delivered=delivered,
            reused=reused,
            cost=None if cost is None else budgets.money(cost.amount, cost.currency),
            oldest_eligible_age_seconds=int(current.oldest_eligible_s or 0),
            admitted_at=status.rfc3339(current.admitted_at),
            completed_at=completed_at,
            recent_failures=recent,
            conditions=conds,
        )
        desired = conditions.dump(model)
        if recent is None and "recentFailures" in self.last_written:
            desired["recentFailures"] = self.last_written["recentFailures"]
        if not settled and not suspend:
            desired.update(self._queue_fields(where))
        return desired

    def _volatile_only(self, desired: dict[str, Any]) -> bool:
        """Whether `desired` differs from what was written only in counts and ages (not phase, conditions, ...)."""
        for field in SIGNIFICANT:
            if field == "conditions":
                old = [(c.get("type"), c.get("status"), c.get("reason")) for c in self.last_written.get(field) or ()]
                new = [(c.get("type"), c.get("status"), c.get("reason")) for c in desired.get(field) or ()]
                if old != new:
                    return False
            elif self.last_written.get(field) != desired.get(field):
                return False
        return True

    def _clock_only(self, desired: dict[str, Any]) -> bool:
        """Whether `desired` differs from what was written only in the values of clock-driven fields that
        were and still are there (an ETA appearing or going away is news)."""
        changed = conditions.status_patch(self.last_written, desired) or {}
        return bool(changed) and all(
            field in CLOCK_FIELDS and field in self.last_written and value is not None
            for field, value in changed.items()
        )

    def _clock_refresh_s(self) -> float:
        return max(CLOCK_REFRESH_S, self.rt.settings.status_interval_s)

    async def _write(self, desired: dict[str, Any], *, volatile_only: bool = False) -> None:
        """Write status if it changed; a change of counts and ages only, at most once per status interval,
        and of the clock-driven fields alone (CLOCK_FIELDS) at most once per CLOCK_REFRESH_S."""
        now = time.monotonic()
        if volatile_only and now - self.last_write_at < self.rt.settings.status_interval_s:
            return
        if self._clock_only(desired) and now - self.last_write_at < self._clock_refresh_s():
            return  # only the clock moved: nothing a reader acts on
        written = await conditions.write_status(
            self.rt.api, api_version=specs.API_VERSION, plural=PLURAL, namespace=self.namespace, name=self.name,
            live=self.last_written, desired=desired,
        )  # fmt: skip
        if written:
            self.last_written = dict(desired)
            self.last_write_at = now


async def finalize(rt: runtime.Runtime, body: kopf.Body) -> int:
    """Cancel every non-terminal job of the batch (results and audit rows stay); returns how many."""
    namespace, name = str(body.metadata.namespace), str(body.metadata.name)
    idempotency_key = accepting.idempotency_key(namespace=namespace, name=name, uid=str(body.metadata.uid))
    async with rt.db.acquire() as conn:
        tenant = await registry.tenant_for_namespace(conn, namespace=namespace)
        current = None
        if tenant is not None:
            current = await batches.get_observed(conn, tenant=tenant, idempotency_key=idempotency_key)
        if current is None:
            # Never admitted under the current tenant; look it up by key in any tenant.
            tenant = await batches.tenant_by_key(conn, idempotency_key=idempotency_key)
            if tenant is not None:
                current = await batches.get_observed(conn, tenant=tenant, idempotency_key=idempotency_key)
        if current is None or tenant is None:
            return 0
        cancelled = await jobs.cancel_batch(conn, batch_id=current.batch_id, reason="ExtractionBatch deleted")
    rt.room_in(tenant)
    return len(cancelled)


async def deleted(rt: runtime.Runtime, body: kopf.Body, *, live: Mapping[str, Any]) -> None:
    """The batch is being deleted: phase Terminating, then its unfinished jobs cancelled (the finalizer)."""
    if live.get("phase") not in (None, "Terminating"):
        path = f"/apis/{specs.API_VERSION}/namespaces/{body.metadata.namespace}/{PLURAL}/{body.metadata.name}/status"
        await rt.api.merge_patch(path, {"status": {"phase": "Terminating"}})
    await failpoints.ahit("operator.batch_deleted.before_cancel")
    cancelled = await finalize(rt, body)
    # Committed; the finalizer is still on the object until this handler returns (a crash here
    # runs the handler again, which finds nothing left to cancel).
    await failpoints.ahit("operator.batch_deleted.after_cancel")
    logger.info("batch %s/%s deleted: %d jobs cancelled", body.metadata.namespace, body.metadata.name, cancelled)
    if cancelled:
        message = f"{cancelled} unfinished jobs cancelled; results are kept"
        events.normal(body, reason=conditions.CANCELLED, message=message)
