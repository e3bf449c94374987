"""
The committer against real PostgreSQL when an attempt carries a value the database cannot store:
the group is split, every good attempt commits, each bad one ends FAILED_TERMINAL (UNSTORABLE)
alone, and nothing is retried for ever.

The bad Finishes here are built directly: they stand for values that got past the boundary
(lading.providers.base.checked), which is what the committer's defence is for.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence

import asyncpg
import pytest
from lading_worker import committing

from lading import accepting, storable
from lading.db import jobs
from lading.ids import JobId, WorkerId
from lading.jobs import transitions
from lading.settings import ClaimerSettings
from tests.support import factories

WORKER = WorkerId("worker-unstorable")
RESULT = {"invoice_number": "INV-1", "total": "11.90"}
VALIDATION = {"policy": "invoice-strict-v1", "passed": True, "failed_checks": []}


async def _claim(db: asyncpg.Connection, *, count: int, tenant: str = factories.TENANT) -> list[jobs.ClaimedJob]:
    await accepting.accept_batch(db, factories.batch_request(name=f"b-{tenant}", count=count, tenant=tenant))
    claimed = await jobs.claim_batch(db, pool=factories.POOL, worker_id=WORKER, limit=count, lease_ttl_s=60)
    assert len(claimed) == count
    return claimed


def _good(job: jobs.ClaimedJob) -> transitions.Finish:
    return transitions.succeed(
        job.id, job.fence, result=RESULT, validation=VALIDATION, usage=transitions.Usage(tokens_in=800, tokens_out=200)
    )


def _committer(dbpool: asyncpg.Pool, *, batch_size: int = 100) -> committing.Committer:
    return committing.Committer(
        dbpool, worker_id=WORKER, pool=factories.POOL, settings=ClaimerSettings(commit_batch_size=batch_size)
    )


@pytest.fixture
def statements(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The size of every `finish_many` statement the committer runs (the real function is called)."""
    sizes: list[int] = []
    real = jobs.finish_many

    async def counting(
            conn: asyncpg.Connection, finishes: Sequence[transitions.Finish], *, worker_id: WorkerId
    ) -> set[JobId]:
        sizes.append(len(finishes))
        return await real(conn, finishes, worker_id=worker_id)

    monkeypatch.setattr(jobs, "finish_many", counting)
    return sizes


async def _submit_all(committer: committing.Committer, finishes: Sequence[transitions.Finish]) -> list[bool]:
    tasks = [asyncio.create_task(committer.submit(f)) for f in finishes]
    await asyncio.sleep(0)  # every submit is queued before the committer runs
    result = await committer.run_once()
    assert result.applied + result.stale + result.lost == len(finishes)
    return list(await asyncio.gather(*tasks))


async def test_bad_attempts_end_unstorable_alone_and_every_good_one_in_their_group_commits(
        db: asyncpg.Connection, dbpool: asyncpg.Pool, statements: list[int]
) -> None:
    await factories.seed(db)
    claimed = await _claim(db, count=16)
    finishes = [_good(job) for job in claimed]
    bad = {
        claimed[3].id: ("result", transitions.succeed(
            claimed[3].id, claimed[3].fence, result={"supplier": {"name": "Acme\x00 GmbH"}}, validation=VALIDATION,
        )),
        claimed[9].id: ("error", transitions.fail(
            claimed[9].id, claimed[9].fence, outcome="terminal", error_class="X", error="bad \ud800 text",
        )),
        claimed[14].id: ("tokens_out", transitions.succeed(
            claimed[14].id, claimed[14].fence, result=RESULT, validation=VALIDATION,
            usage=transitions.Usage(tokens_in=1, tokens_out=2**63),
        )),
    }  # fmt: skip
    for index, job in enumerate(claimed):
        if job.id in bad:
            finishes[index] = bad[job.id][1]

    verdicts = await _submit_all(_committer(dbpool), finishes)

    assert verdicts == [True] * 16  # every attempt was committed: as given, or as its UNSTORABLE failure
    rows = {
        r["id"]: r for r in await db.fetch("SELECT id, state, last_error_class, last_error FROM extraction_jobs")
    }
    for job in claimed:
        row = rows[job.id]
        if job.id not in bad:
            assert (row["state"], row["last_error_class"]) == ("SUCCEEDED", None)
            continue
        field = bad[job.id][0]
        assert (row["state"], row["last_error_class"]) == ("FAILED_TERMINAL", storable.UNSTORABLE)
        assert f": {field}" in row["last_error"], row["last_error"]
        assert "Acme" not in row["last_error"] and "bad" not in row["last_error"]  # the field, never the value
    attempts = await db.fetch("SELECT job_id, outcome, error_class, tokens_out FROM job_attempts ORDER BY job_id")
    assert {r["job_id"] for r in attempts if r["error_class"] == storable.UNSTORABLE} == set(bad)
    assert all(r["outcome"] == "terminal" for r in attempts if r["job_id"] in bad)
    assert next(r for r in attempts if r["job_id"] == claimed[14].id)["tokens_out"] is None
    assert await db.fetchval("SELECT count(*) FROM results") == 13
    assert await db.fetchval("SELECT count(*) FROM stale_completions") == 0
    # Bounded: one statement for the group, at most 2·log₂(n) per bad attempt, one for the replacements.
    assert len(statements) <= 1 + len(bad) * 2 * math.ceil(math.log2(16)) + 1, statements
    assert statements[0] == 16 and statements[-1] == len(bad)


async def test_a_group_with_nothing_wrong_costs_one_statement(
        db: asyncpg.Connection, dbpool: asyncpg.Pool, statements: list[int]
) -> None:
    await factories.seed(db)
    claimed = await _claim(db, count=8)
    assert await _submit_all(_committer(dbpool), [_good(job) for job in claimed]) == [True] * 8
    assert statements == [8]


async def test_an_attempt_whose_failure_cannot_be_stored_either_is_answered_once_and_never_retried(
        db: asyncpg.Connection, dbpool: asyncpg.Pool, caplog: pytest.LogCaptureFixture
) -> None:
    # A tenant whose usage today is at the very end of bigint: any token it spends overflows the
    # sum, so neither its attempt nor that attempt's UNSTORABLE failure (which keeps the usage)
    # can be stored. The other tenant's attempts in the same group are not affected.
    await factories.seed(db)
    await factories.seed(db, tenant="full")
    ours = await _claim(db, count=3)
    full = await _claim(db, count=1, tenant="full")
    await db.execute(
        "INSERT INTO tenant_usage (tenant, day, tokens)"
        " VALUES ('full', (clock_timestamp() AT TIME ZONE 'UTC')::date, $1)",
        storable.BIGINT_MAX - 10,
    )
    committer = _committer(dbpool)
    stop = asyncio.Event()
    verdicts = await asyncio.gather(
        *(committer.submit(_good(job)) for job in [*ours, *full]),
        _stop_when_idle(committer, stop),
    )
    assert list(verdicts[:4]) == [True, True, True, False]
    states = {r["id"]: r["state"] for r in await db.fetch("SELECT id, state FROM extraction_jobs")}
    assert [states[job.id] for job in ours] == ["SUCCEEDED"] * 3
    assert states[full[0].id] == "RUNNING"  # not committed: its lease runs out and the reaper decides
    lost = [r for r in caplog.records if "could not be stored, nor its failure" in r.getMessage()]
    assert len(lost) == 1
    assert "Commit of" not in caplog.text  # never the retry path of an unavailable database


async def _stop_when_idle(committer: committing.Committer, stop: asyncio.Event) -> None:
    """Run the committer's own loop until it has nothing pending, then stop it."""
    task = asyncio.create_task(committer.run_forever(stop))
    await asyncio.sleep(0)
    stop.set()  # run_forever returns once nothing is pending: only if nothing is retried
    await asyncio.wait_for(task, 10)
