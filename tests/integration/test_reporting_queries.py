"""
The reporting queries behind `lading jobs list|show` and `lading status`, against real rows.

The jobs get their states the way production gives them: acceptance, claims, finishes and
cancellations through the core's own functions. Only time is faked, by moving a row's
timestamp back (the database clock decides ages, so the row moves, not the clock).
"""

from __future__ import annotations

import dataclasses

import asyncpg
import pytest

from lading import accepting, ids
from lading.db import backlogs, batches, job_documents, jobs, outbox, registry, results
from lading.jobs import states, transitions
from tests.support import factories

S = states.JobState
ACME = ids.TenantName(factories.TENANT)
GLOBEX = ids.TenantName("globex")
POOL = ids.PoolName(factories.POOL)
OTHER = ids.PoolName("lading-system/other")
WORKER = ids.WorkerId("w1")
FAILED_CHECK = {"check": "line_amount", "field": "lines[0].amount", "message": "quantity * unit price != amount"}


@dataclasses.dataclass(frozen=True)
class Mix:
    """acme/b1 (10 jobs, every state) and globex/g1 (5 jobs, all READY, another pool)."""

    b1: tuple[ids.JobId, ...]
    g1: tuple[ids.JobId, ...]
    by_state: dict[states.JobState, list[ids.JobId]]


async def _mix(db: asyncpg.Connection) -> Mix:
    await factories.seed(db)
    await factories.seed(db, tenant=GLOBEX, pool=OTHER)
    b1 = await accepting.accept_batch(db, factories.batch_request(name="b1", count=10))
    g1 = await accepting.accept_batch(db, factories.batch_request(name="g1", count=5, tenant=GLOBEX, pool=OTHER))
    claimed = await jobs.claim_batch(db, pool=POOL, worker_id=WORKER, limit=6, lease_ttl_s=600)
    ok1, ok2, review, retry, fail, running = claimed
    finishes = [
        transitions.succeed(ok1.id, ok1.fence, result={"total": "1.00"}, validation={"passed": True}),
        transitions.succeed(ok2.id, ok2.fence, result={"total": "2.00"}, validation={"passed": True}),
        transitions.needs_review(
            review.id, review.fence, result={"total": "3.00"},
            validation={"policy": "invoice-strict-v1", "passed": False, "failed_checks": [FAILED_CHECK]},
        ),
        transitions.retry(
            retry.id, retry.fence, outcome="transient", error_class="PROVIDER_UNAVAILABLE", error="503",
            retry_in_s=3600,
        ),
        transitions.fail(fail.id, fail.fence, outcome="terminal", error_class="DOCUMENT_UNREADABLE", error="no text"),
    ]  # fmt: skip
    assert len(await jobs.finish_many(db, finishes, worker_id=WORKER)) == 5
    cancelled = b1.job_ids[6]
    assert await jobs.cancel(db, job_id=cancelled, reason="not needed")
    by_state = {
        S.SUCCEEDED: [ok1.id, ok2.id],
        S.REVIEW_REQUIRED: [review.id],
        S.RETRY_SCHEDULED: [retry.id],
        S.FAILED_TERMINAL: [fail.id],
        S.RUNNING: [running.id],
        S.CANCELLED: [cancelled],
        S.READY: [*b1.job_ids[7:], *g1.job_ids],
    }
    return Mix(b1=b1.job_ids, g1=g1.job_ids, by_state=by_state)


async def _ids(db: asyncpg.Connection, where: jobs.JobFilter) -> list[ids.JobId]:
    page = await jobs.list_jobs(db, where=where, limit=jobs.LIST_LIMIT_MAX)
    assert page.next_after is None
    return [job.id for job in page.jobs]


async def test_listing_without_filters_shows_every_job_in_id_order_with_its_state(db: asyncpg.Connection) -> None:
    mix = await _mix(db)
    page = await jobs.list_jobs(db, limit=100)
    assert [j.id for j in page.jobs] == sorted(mix.b1 + mix.g1)
    assert page.next_after is None
    got = {j.id: j.state for j in page.jobs}
    assert got == {job_id: state for state, job_ids in mix.by_state.items() for job_id in job_ids}
    [failed] = [j for j in page.jobs if j.state is S.FAILED_TERMINAL]
    assert (failed.attempt, failed.max_attempts, failed.last_error_class) == (1, 5, "DOCUMENT_UNREADABLE")
    assert (failed.tenant, failed.batch_namespace, failed.batch_name) == (ACME, "acme", "b1")
    assert failed.document_key.startswith("doc-") and 0 <= failed.updated_age_s < 60


async def test_filters_keep_only_matching_jobs_and_combine(db: asyncpg.Connection) -> None:
    mix = await _mix(db)
    assert await _ids(db, jobs.JobFilter(tenant=GLOBEX)) == list(mix.g1)
    assert await _ids(db, jobs.JobFilter(pool=OTHER)) == list(mix.g1)
    assert await _ids(db, jobs.JobFilter(batch=("acme", "b1"))) == list(mix.b1)
    assert await _ids(db, jobs.JobFilter(batch=("acme", "g1"))) == []  # g1 lives in namespace globex
    assert await _ids(db, jobs.JobFilter(states=frozenset({S.READY}))) == sorted(mix.by_state[S.READY])
    several = frozenset({S.SUCCEEDED, S.REVIEW_REQUIRED, S.CANCELLED})
    assert await _ids(db, jobs.JobFilter(states=several)) == sorted(
        mix.by_state[S.SUCCEEDED] + mix.by_state[S.REVIEW_REQUIRED] + mix.by_state[S.CANCELLED]
    )
    combined = jobs.JobFilter(tenant=ACME, states=frozenset({S.READY}), pool=POOL, batch=("acme", "b1"))
    assert await _ids(db, combined) == list(mix.b1[7:])
    assert await _ids(db, jobs.JobFilter(tenant=GLOBEX, states=frozenset({S.RUNNING}))) == []


async def test_pages_have_no_duplicates_and_no_gaps_even_when_jobs_change_state_in_between(
        db: asyncpg.Connection,
) -> None:
    mix = await _mix(db)
    seen: list[ids.JobId] = []
    after: ids.JobId | None = None
    pages = 0
    while True:
        page = await jobs.list_jobs(db, after=after, limit=4)
        assert len(page.jobs) <= 4
        seen.extend(j.id for j in page.jobs)
        pages += 1
        if pages == 2:  # the world moves on between pages: claims, finishes, cancellations
            await jobs.claim_batch(db, pool=OTHER, worker_id=WORKER, limit=5, lease_ttl_s=600)
            await jobs.cancel(db, job_id=mix.b1[9], reason="mid-paging")
        if page.next_after is None:
            break
        assert page.next_after == page.jobs[-1].id
        after = page.next_after
    assert seen == sorted(mix.b1 + mix.g1)
    assert pages == 4  # 15 jobs: 4 + 4 + 4 + 3


async def test_paging_a_filtered_list_ends_exactly_at_its_last_match(db: asyncpg.Connection) -> None:
    mix = await _mix(db)
    ready = frozenset({S.READY})
    first = await jobs.list_jobs(db, where=jobs.JobFilter(states=ready), limit=4)
    second = await jobs.list_jobs(db, where=jobs.JobFilter(states=ready), after=first.next_after, limit=4)
    assert [j.id for j in first.jobs + second.jobs] == sorted(mix.by_state[S.READY])
    assert second.next_after is None
    exact = await jobs.list_jobs(db, where=jobs.JobFilter(states=ready), limit=8)
    assert len(exact.jobs) == 8 and exact.next_after is None  # a full last page is still the last


@pytest.mark.parametrize("limit", [0, jobs.LIST_LIMIT_MAX + 1])
async def test_a_page_size_out_of_bounds_is_refused(db: asyncpg.Connection, limit: int) -> None:
    with pytest.raises(ValueError, match="limit must be between 1 and 1000"):
        await jobs.list_jobs(db, limit=limit)


async def test_a_job_shows_all_its_attempts_its_result_and_its_events(db: asyncpg.Connection) -> None:
    await factories.seed(db)
    [job_id] = (await accepting.accept_batch(db, factories.batch_request(count=1, text_prefix="SECRET"))).job_ids
    [first] = await jobs.claim_batch(db, pool=POOL, worker_id=WORKER, limit=1, lease_ttl_s=600)
    again = transitions.retry(
        job_id, first.fence, outcome="transient", error_class="PROVIDER_UNAVAILABLE", error="503 from the model",
        retry_in_s=0, usage=transitions.Usage(tokens_in=100, tokens_out=0, latency_ms=30),
    )  # fmt: skip
    await jobs.finish_many(db, [again], worker_id=WORKER)
    [second] = await jobs.claim_batch(db, pool=POOL, worker_id=ids.WorkerId("w2"), limit=1, lease_ttl_s=600)
    done = transitions.succeed(
        job_id, second.fence, result={"total": "9.99"}, validation={"policy": "invoice-strict-v1", "passed": True,
        "failed_checks": []}, usage=transitions.Usage(tokens_in=120, tokens_out=40, latency_ms=250),
    )  # fmt: skip
    await jobs.finish_many(db, [done], worker_id=ids.WorkerId("w2"))

    job = await jobs.get_job(db, job_id=job_id)
    assert job is not None
    assert (job.state, job.attempt, job.max_attempts, job.fence, job.pool) == (S.SUCCEEDED, 2, 5, 2, POOL)
    assert (job.batch_namespace, job.batch_name, job.lease_until, job.worker_id) == ("acme", "b1", None, None)
    assert job.finished_at is not None and job.finished_at <= job.as_of
    assert "SECRET" not in repr(job)

    attempts = await jobs.list_attempts(db, job_id=job_id)
    assert [(a.fence, a.attempt, a.worker_id, a.outcome) for a in attempts] == [
        (1, 1, "w1", "transient"),
        (2, 2, "w2", "ok"),
    ]
    assert (attempts[0].error_class, attempts[0].error) == ("PROVIDER_UNAVAILABLE", "503 from the model")
    assert (attempts[1].tokens_in, attempts[1].tokens_out, attempts[1].latency_ms) == (120, 40, 250)

    result = await results.result_of(db, job_id=job_id)
    assert result is not None
    assert (result.fence, result.passed, result.failed_checks, result.result) == (2, True, (), {"total": "9.99"})
    assert result.validation_policy == "invoice-strict-v1"

    [event] = await outbox.events_of(db, job_id=job_id)
    assert (event.type, event.published_at) == ("extraction.completed.v1", None)
    assert await job_documents.document_of(db, job_id=job_id) == "SECRET 0"


async def test_a_result_waiting_for_review_shows_its_failed_checks(db: asyncpg.Connection) -> None:
    mix = await _mix(db)
    [review] = mix.by_state[S.REVIEW_REQUIRED]
    result = await results.result_of(db, job_id=review)
    assert result is not None and result.passed is False
    assert [(c.check, c.field, c.message) for c in result.failed_checks] == [tuple(FAILED_CHECK.values())]
    assert [e.type for e in await outbox.events_of(db, job_id=review)] == ["extraction.review_required.v1"]
    [ready] = mix.by_state[S.READY][:1]
    assert await results.result_of(db, job_id=ready) is None
    assert await outbox.events_of(db, job_id=ready) == []
    assert await jobs.list_attempts(db, job_id=ready) == []


async def test_an_unknown_job_is_none(db: asyncpg.Connection) -> None:
    await _mix(db)
    assert await jobs.get_job(db, job_id=ids.JobId(10_000)) is None


async def test_pool_status_counts_the_due_backlog_and_the_running_jobs(db: asyncpg.Connection) -> None:
    mix = await _mix(db)
    await registry.upsert_pool(db, name=OTHER, provider="builtin", model="lading-builtin", spec={}, paused=True)
    statuses = {p.name: p for p in await registry.pool_status(db)}
    assert list(statuses) == sorted([POOL, OTHER])
    builtin, other = statuses[POOL], statuses[OTHER]
    # acme/b1: 2 READY are due; the RETRY_SCHEDULED one is due in an hour, so not yet backlog.
    assert (builtin.backlog, builtin.running, builtin.paused) == (3, 1, False)
    assert (other.backlog, other.running, other.paused) == (5, 0, True)

    [retry] = mix.by_state[S.RETRY_SCHEDULED]
    await db.execute("UPDATE extraction_jobs SET available_at = now() - interval '10 minutes' WHERE id = $1", retry)
    builtin = {p.name: p for p in await registry.pool_status(db)}[POOL]
    assert builtin.backlog == 4
    assert builtin.oldest_age_s is not None and 600 <= builtin.oldest_age_s < 660
    assert builtin.oldest_available_at == await db.fetchval(
        "SELECT available_at FROM extraction_jobs WHERE id = $1", retry
    )


async def test_an_empty_pool_has_no_oldest_job(db: asyncpg.Connection) -> None:
    await factories.seed(db)
    [pool] = await registry.pool_status(db)
    assert (pool.backlog, pool.running, pool.oldest_available_at, pool.oldest_age_s) == (0, 0, None, None)


async def test_only_batches_with_unsettled_jobs_are_in_progress(db: asyncpg.Connection) -> None:
    mix = await _mix(db)
    in_progress = await batches.batches_in_progress(db)
    assert [(b.namespace, b.name) for b in in_progress] == [("acme", "b1"), ("globex", "g1")]
    b1 = in_progress[0]
    assert (b1.tenant, b1.pool, b1.total, b1.suspended) == (ACME, POOL, 10, False)
    assert b1.counts == {state: len(job_ids) for state, job_ids in mix.by_state.items() if state is not S.READY} | {
        S.READY: 3
    }
    # globex/g1 settles (cancelled); acme/b1 keeps one RUNNING job, so only it stays.
    await jobs.cancel_batch(db, batch_id=await db.fetchval("SELECT id FROM batches WHERE name = 'g1'"), reason="x")
    assert [b.name for b in await batches.batches_in_progress(db)] == ["b1"]
    # Waiting for review counts as settled: no machine will move the job again.
    for job_id in mix.by_state[S.READY] + mix.by_state[S.RETRY_SCHEDULED] + mix.by_state[S.RUNNING]:
        await jobs.cancel(db, job_id=job_id, reason="x")
    assert await batches.batches_in_progress(db) == []


async def test_the_review_queue_reports_its_size_and_its_oldest_item(db: asyncpg.Connection) -> None:
    assert await jobs.review_queue(db) == backlogs.Backlog(size=0, oldest_at=None, oldest_age_s=None)
    mix = await _mix(db)
    [review] = mix.by_state[S.REVIEW_REQUIRED]
    await db.execute("UPDATE extraction_jobs SET updated_at = now() - interval '2 hours' WHERE id = $1", review)
    queue = await jobs.review_queue(db)
    assert queue.size == 1
    assert queue.oldest_age_s is not None and 7200 <= queue.oldest_age_s < 7260


async def test_the_outbox_backlog_counts_unpublished_events_and_ages_the_oldest(db: asyncpg.Connection) -> None:
    await _mix(db)
    # 2 batch.accepted.v1, then 2 completed, 1 review, 1 failed, 1 cancelled.
    assert (await outbox.outbox_backlog(db)).size == 7
    await db.execute(
        "UPDATE outbox_events SET created_at = now() - interval '5 minutes'"
        " WHERE id = (SELECT min(id) FROM outbox_events)"
    )
    backlog = await outbox.outbox_backlog(db)
    assert backlog.oldest_age_s is not None and 300 <= backlog.oldest_age_s < 360
    await db.execute("UPDATE outbox_events SET published_at = now() WHERE id <= 3")
    backlog = await outbox.outbox_backlog(db)
    assert backlog.size == 4 and backlog.oldest_age_s is not None and backlog.oldest_age_s < 60
    await db.execute("UPDATE outbox_events SET published_at = now()")
    assert await outbox.outbox_backlog(db) == backlogs.Backlog(size=0, oldest_at=None, oldest_age_s=None)


async def test_stale_completions_are_counted_within_the_window(db: asyncpg.Connection) -> None:
    mix = await _mix(db)
    [running] = mix.by_state[S.RUNNING]
    late = transitions.fail(running, ids.Fence(0), outcome="terminal", error_class="X", error="superseded fence")
    assert await jobs.finish_many(db, [late], worker_id=WORKER) == set()
    await db.execute(
        "INSERT INTO stale_completions (job_id, fence, worker_id, at) VALUES ($1, 0, 'w0', now() - interval '2 hours')",
        running,
    )
    assert await jobs.stale_completions(db) == 1
    assert await jobs.stale_completions(db, window_s=3 * 3600) == 2
