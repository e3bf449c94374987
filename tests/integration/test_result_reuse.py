"""
Result reuse by content digest (docs/reuse.md), with an in-process worker over real PostgreSQL and
a provider that counts its calls: an accepted result of the tenant is taken instead of calling the
model, across batches; never across tenants, nor for a changed byte, another model, a pool that
judges otherwise (default currency), an opted-out batch or a tenant whose quota says
`resultReuse: none`; a reviewer's approval makes a result reusable. (Duplicates in flight at once,
across worker processes: tests/acceptance/test_reuse_processes.py.)
"""

from __future__ import annotations

import dataclasses

import asyncpg
import pytest
from lading_worker import running

from lading import accepting, reviewing
from lading.db import jobs, registry
from lading.db import reuse as reuse_db
from lading.ids import JobId, PoolName, TenantName, WorkerId
from lading.jobs import transitions
from lading.providers import base
from lading.settings import AttemptSettings, ClaimerSettings, LeaseSettings, ReaperSettings, WorkerProcessSettings
from lading_demo import builtin, generator
from tests.support import factories, providers, waiting

OTHER_POOL = PoolName("lading-system/other-model")
EUR_POOL = PoolName("lading-system/books-eur")
"""The builtin model too, but its invoice-strict-v2 books EUR for a document that shows no currency."""

SAMPLES = generator.generate(40, seed=16)
CLEAN = [s for s in SAMPLES if s.expected_state == "SUCCEEDED"]
TOTALS_OFF = next(s for s in SAMPLES if s.defect == "totals_mismatch")


def _settings(pool: str) -> WorkerProcessSettings:
    return WorkerProcessSettings(
        pool=pool,
        lease=LeaseSettings(ttl_s=10, heartbeat_interval_s=0.05),
        claimer=ClaimerSettings(concurrency=8, batch_size=8, poll_interval_s=0.05),
        reaper=ReaperSettings(interval_s=0.05),
        attempt=AttemptSettings(backoff_base_s=0.01, backoff_cap_s=0.02, timeout_s=5),
        shutdown_grace_s=5.0,
    )


def _provider() -> providers.ScriptedProvider:
    """The builtin extractor, counting its calls (`.calls`)."""
    return providers.ScriptedProvider(lambda document: builtin.extract_text(document.text))


def _request(
        name: str, texts: list[str], *, tenant: str = factories.TENANT, pool: str = factories.POOL, reuse: bool = True
) -> accepting.BatchRequest:
    request = factories.batch_request(name=name, count=0, tenant=tenant, pool=pool)
    return dataclasses.replace(
        request,
        validation_policy="invoice-strict-v2",
        reuse=reuse,
        documents=[accepting.DocumentInput(key=f"doc-{i}", text=text) for i, text in enumerate(texts)],
    )


async def _run(
        db: asyncpg.Connection, dbpool: asyncpg.Pool, request: accepting.BatchRequest, provider: base.Provider
) -> list[asyncpg.Record]:
    """Accept `request`, run a worker of its pool until the batch settles; its jobs in key order."""
    accepted = await accepting.accept_batch(db, request)

    async def settled() -> bool:
        return bool(await db.fetchval(
            "SELECT count(*) = $2 FROM extraction_jobs WHERE batch_id = $1"
            " AND state IN ('SUCCEEDED', 'REVIEW_REQUIRED', 'FAILED_TERMINAL')",
            accepted.batch_id, len(accepted.job_ids),
        ))  # fmt: skip

    worker = running.Worker(dbpool, settings=_settings(request.pool), provider=provider)
    async with waiting.running(worker.run):
        await waiting.until(settled, timeout_s=30)
    return list(await db.fetch(
        "SELECT j.id, j.state, j.reused_from, r.result FROM extraction_jobs j LEFT JOIN results r ON r.job_id = j.id"
        " WHERE j.batch_id = $1 ORDER BY j.document_key",
        accepted.batch_id,
    ))  # fmt: skip


async def _seed(db: asyncpg.Connection) -> None:
    await factories.seed(db)
    await factories.seed(db, tenant="globex")
    await registry.upsert_tenant(
        db, name=TenantName("initech"), namespaces=["initech"], weight=1, max_queued_jobs=None, max_in_flight=None,
        spec={"resultReuse": "none"},
    )  # fmt: skip
    await registry.upsert_pool(
        db, name=OTHER_POOL, provider="openai-compatible", model="another-model",
        spec={"endpoint": {"url": "http://127.0.0.1:9/v1"}},
    )  # fmt: skip
    await registry.upsert_pool(db, name=EUR_POOL, provider="builtin", model=None, spec={"defaultCurrency": "EUR"})


async def test_an_accepted_result_is_taken_across_batches_of_the_tenant_without_a_model_call(
        db: asyncpg.Connection, dbpool: asyncpg.Pool
) -> None:
    await _seed(db)
    x, y = CLEAN[0].text, CLEAN[1].text
    provider = _provider()
    first = await _run(db, dbpool, _request("first", [x, y]), provider)
    assert [j["state"] for j in first] == ["SUCCEEDED", "SUCCEEDED"]
    assert len(provider.calls) == 2

    # x again, y changed by one byte, a new document: only x is taken.
    second = await _run(db, dbpool, _request("second", [x, y + " ", CLEAN[2].text]), provider)
    assert len(provider.calls) == 4
    assert [j["state"] for j in second] == ["SUCCEEDED"] * 3
    assert [j["reused_from"] for j in second] == [first[0]["id"], None, None]
    assert second[0]["result"] == first[0]["result"]
    attempt = await db.fetchrow("SELECT outcome, tokens_in, tokens_out FROM job_attempts WHERE job_id = $1",
                                second[0]["id"])
    assert dict(attempt) == {"outcome": "reused", "tokens_in": 0, "tokens_out": 0}
    shown = await jobs.get_job(db, job_id=JobId(second[0]["id"]))  # what `lading jobs show` prints
    assert shown is not None and shown.reused_from == first[0]["id"]
    # Its own success: its own completion event and (with an endpoint) its own delivery.
    assert await db.fetchval(
        "SELECT count(*) FROM outbox_events WHERE aggregate_id = $1 AND type = 'extraction.completed.v1'",
        second[0]["id"],
    ) == 1


async def test_no_result_is_taken_across_tenants_models_opted_out_batches_or_a_quota_that_says_none(
        db: asyncpg.Connection, dbpool: asyncpg.Pool
) -> None:
    await _seed(db)
    x = CLEAN[0].text
    provider = _provider()
    await _run(db, dbpool, _request("first", [x]), provider)
    assert len(provider.calls) == 1

    elsewhere = await _run(db, dbpool, _request("globex-1", [x], tenant="globex"), provider)
    opted_out = await _run(db, dbpool, _request("again", [x], reuse=False), provider)
    other_model = await _run(db, dbpool, _request("other", [x], pool=OTHER_POOL), provider)
    other_judging = await _run(db, dbpool, _request("eur", [x], pool=EUR_POOL), provider)
    assert len(provider.calls) == 5
    assert [j["reused_from"] for j in elsewhere + opted_out + other_model + other_judging] == [None] * 4

    for name in ("initech-1", "initech-2"):
        jobs = await _run(db, dbpool, _request(name, [x], tenant="initech"), provider)
        assert jobs[0]["reused_from"] is None
    assert len(provider.calls) == 7


async def test_a_result_approved_in_review_is_taken_and_one_still_in_review_is_not(
        db: asyncpg.Connection, dbpool: asyncpg.Pool
) -> None:
    await _seed(db)
    provider = _provider()
    reviewed = await _run(db, dbpool, _request("first", [TOTALS_OFF.text]), provider)
    assert reviewed[0]["state"] == "REVIEW_REQUIRED"

    waiting_for_review = await _run(db, dbpool, _request("second", [TOTALS_OFF.text]), provider)
    assert len(provider.calls) == 2
    assert waiting_for_review[0]["reused_from"] is None

    await reviewing.approve(db, job_id=JobId(reviewed[0]["id"]), reviewer="ana", reason="totals checked by hand")
    taken = await _run(db, dbpool, _request("third", [TOTALS_OFF.text]), provider)
    assert len(provider.calls) == 2
    assert taken[0]["state"] == "SUCCEEDED"
    assert taken[0]["reused_from"] == reviewed[0]["id"]
    assert taken[0]["result"] == reviewed[0]["result"]


@pytest.mark.parametrize("deleted", [False, True])
async def test_a_result_deleted_by_retention_is_not_taken(
        db: asyncpg.Connection, dbpool: asyncpg.Pool, deleted: bool
) -> None:
    await _seed(db)
    provider = _provider()
    first = await _run(db, dbpool, _request("first", [CLEAN[0].text]), provider)
    if deleted:
        await db.execute("UPDATE results SET result = NULL WHERE job_id = $1", first[0]["id"])
    again = await _run(db, dbpool, _request("again", [CLEAN[0].text]), provider)
    assert (again[0]["reused_from"] is None) is deleted
    assert len(provider.calls) == (2 if deleted else 1)


async def test_a_duplicate_waits_for_the_running_one_only_while_its_deadline_leaves_room(
        db: asyncpg.Connection
) -> None:
    await _seed(db)
    accepted = await accepting.accept_batch(db, _request("copies", [CLEAN[0].text] * 3))
    claimed = await jobs.claim_batch(
        db, pool=PoolName(factories.POOL), worker_id=WorkerId("w1"), limit=3, lease_ttl_s=30,
        reuse_key_of=("m", "p", ""),
    )
    first, second, hurried = sorted(accepted.job_ids)
    await db.execute("UPDATE extraction_jobs SET deadline_at = clock_timestamp() + interval '10 s' WHERE id = $1",
                     hurried)
    decisions = await reuse_db.resolve(
        db, [(j.id, j.fence) for j in claimed], worker_id=WorkerId("w1"), model="m", prompt_version="p",
        judging="", wait_margin_s=60,
    )  # fmt: skip
    assert decisions[first] == reuse_db.LEAD
    assert (decisions[second].kind, decisions[second].other_job) == (reuse_db.Kind.WAIT, first)
    assert decisions[hurried] == reuse_db.LEAD  # no time to wait: it calls the model itself
    marked = await db.fetch("SELECT id FROM extraction_jobs WHERE reuse_key IS NOT NULL ORDER BY id")
    assert [r["id"] for r in marked] == [first, hurried]  # nobody waits for a waiting job


async def test_a_job_claimed_without_its_mark_is_marked_and_given_back_before_it_may_lead(
        db: asyncpg.Connection
) -> None:
    """A worker of a release before migration 0029 claims without marking: its job may not lead on a
    mark written in the same step as the decision (no lock orders the two any more), so it is marked
    and given back, and decided when claimed again, its mark then committed."""
    await _seed(db)
    accepted = await accepting.accept_batch(db, _request("copies", [CLEAN[0].text] * 2))
    first, second = sorted(accepted.job_ids)

    async def claim_and_resolve() -> tuple[list[jobs.ClaimedJob], dict[JobId, reuse_db.Decision]]:
        claimed = await jobs.claim_batch(
            db, pool=PoolName(factories.POOL), worker_id=WorkerId("old"), limit=2, lease_ttl_s=30
        )  # fmt: skip
        return claimed, await reuse_db.resolve(
            db, [(j.id, j.fence) for j in claimed], worker_id=WorkerId("old"), model="m", prompt_version="p",
            judging="", wait_margin_s=60,
        )  # fmt: skip

    claimed, decisions = await claim_and_resolve()
    assert {j: d.kind for j, d in decisions.items()} == {first: reuse_db.Kind.WAIT, second: reuse_db.Kind.WAIT}
    assert decisions[first].other_job == first and decisions[second].other_job == second
    keys = await db.fetch("SELECT reuse_key FROM extraction_jobs WHERE id = ANY($1::bigint[])", [first, second])
    assert len({r["reuse_key"] for r in keys}) == 1 and keys[0]["reuse_key"] is not None
    given_back = [transitions.deferred(j.id, j.fence, leader=j.id, retry_in_s=0.0) for j in claimed]
    assert await jobs.finish_many(db, given_back, worker_id=WorkerId("old")) == {first, second}

    _, decisions = await claim_and_resolve()  # the same worker: still no mark in its claim
    assert decisions[first] == reuse_db.LEAD
    assert (decisions[second].kind, decisions[second].other_job) == (reuse_db.Kind.WAIT, first)
