"""
Every (from, to) pair of job states, tried against the SQL that performs each move.

Each operation declares the source states it acts on. It is set up favourably for
everything except the state (fresh lease for a finish, expired lease for a reap, passed
deadline for an expiry), so only its state guard can stop it: it must move a job exactly
from its declared sources. Together, the operations must perform exactly the pairs in
`states.LEGAL`: no illegal move exists, and no legal one is missing.
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable

import asyncpg
import pytest

from lading import accepting
from lading.db import jobs, reuse
from lading.ids import Fence, JobId, PoolName, WorkerId
from lading.jobs import states, transitions
from lading.jobs.states import JobState
from tests.support import factories

Setup = dict[str, bool]
Operation = Callable[[asyncpg.Connection, JobId, Fence], Awaitable[None]]


async def _claim(conn: asyncpg.Connection, job_id: JobId, fence: Fence) -> None:
    await jobs.claim_batch(conn, pool=PoolName(factories.POOL), worker_id=WorkerId("w2"), limit=1, lease_ttl_s=30)


def _finish(to: JobState) -> Operation:
    async def run(conn: asyncpg.Connection, job_id: JobId, fence: Fence) -> None:
        finish = transitions.Finish(job_id, fence, to, "ok", result={"x": 1}, validation={"passed": True})
        await jobs.finish_many(conn, [finish], worker_id=WorkerId("w1"))

    return run


async def _finish_reused(conn: asyncpg.Connection, job_id: JobId, fence: Fence) -> None:
    finish = transitions.reused(job_id, fence, source=JobId(0), result={"x": 1}, validation={"passed": True})
    await reuse.finish_reused_many(conn, [finish], worker_id=WorkerId("w1"))


def _reap(to: JobState) -> Operation:
    async def run(conn: asyncpg.Connection, job_id: JobId, fence: Fence) -> None:
        async with conn.transaction():
            await jobs.lock_expired_leases(conn, limit=10)
            await jobs.reap_many(conn, [jobs.Reap(job_id, fence, to, 0.0, "LeaseExpired")])

    return run


async def _release(conn: asyncpg.Connection, job_id: JobId, fence: Fence) -> None:
    await jobs.release_many(conn, [(job_id, fence)], worker_id=WorkerId("w1"))


async def _expire(conn: asyncpg.Connection, job_id: JobId, fence: Fence) -> None:
    await jobs.expire_waiting(conn, limit=10)


def _review(approve: bool) -> Operation:
    async def run(conn: asyncpg.Connection, job_id: JobId, fence: Fence) -> None:
        await jobs.review_decide(conn, job_id=job_id, approve=approve, note="test")

    return run


async def _cancel(conn: asyncpg.Connection, job_id: JobId, fence: Fence) -> None:
    await jobs.cancel(conn, job_id=job_id, reason="test")


RUNNING = frozenset({JobState.RUNNING})
REVIEW = frozenset({JobState.REVIEW_REQUIRED})
NON_TERMINAL = frozenset(JobState) - states.TERMINAL

# operation name -> (source states it acts on, target state, operation, setup)
OPERATIONS: dict[str, tuple[frozenset[JobState], JobState, Operation, Setup]] = {
    "claim": (states.CLAIMABLE, JobState.RUNNING, _claim, {}),
    "finish-succeeded": (RUNNING, JobState.SUCCEEDED, _finish(JobState.SUCCEEDED), {}),
    "finish-review": (RUNNING, JobState.REVIEW_REQUIRED, _finish(JobState.REVIEW_REQUIRED), {}),
    "finish-retry": (RUNNING, JobState.RETRY_SCHEDULED, _finish(JobState.RETRY_SCHEDULED), {}),
    "finish-failed": (RUNNING, JobState.FAILED_TERMINAL, _finish(JobState.FAILED_TERMINAL), {}),
    "finish-reused": (RUNNING, JobState.SUCCEEDED, _finish_reused, {}),
    "reap-retry": (RUNNING, JobState.RETRY_SCHEDULED, _reap(JobState.RETRY_SCHEDULED), {"lease_expired": True}),
    "reap-failed": (RUNNING, JobState.FAILED_TERMINAL, _reap(JobState.FAILED_TERMINAL), {"lease_expired": True}),
    "release": (RUNNING, JobState.RETRY_SCHEDULED, _release, {}),
    "expire": (states.CLAIMABLE, JobState.FAILED_TERMINAL, _expire, {"deadline_passed": True}),
    "approve": (REVIEW, JobState.SUCCEEDED, _review(True), {}),
    "reject": (REVIEW, JobState.FAILED_TERMINAL, _review(False), {}),
    "cancel": (NON_TERMINAL, JobState.CANCELLED, _cancel, {}),
}


async def _job_in_state(conn: asyncpg.Connection, state: JobState, setup: Setup) -> tuple[JobId, Fence]:
    await factories.seed(conn)
    result = await accepting.accept_batch(conn, factories.batch_request(count=1))
    job_id = result.job_ids[0]
    await conn.execute(
        """UPDATE extraction_jobs
              SET state = $2::text, attempt = 1, fence = 1,
                  lease_until = CASE WHEN $2::text = 'RUNNING'
                                     THEN clock_timestamp() + make_interval(secs => $3) END,
                  worker_id = CASE WHEN $2::text = 'RUNNING' THEN 'w1' END,
                  finished_at = CASE WHEN $2::text IN ('SUCCEEDED', 'FAILED_TERMINAL', 'CANCELLED')
                                     THEN clock_timestamp() END,
                  available_at = clock_timestamp() - interval '1 second',
                  deadline_at = clock_timestamp() + make_interval(secs => $4)
            WHERE id = $1""",
        job_id,
        state.value,
        -60.0 if setup.get("lease_expired") else 60.0,
        -1.0 if setup.get("deadline_passed") else 3600.0,
    )
    await conn.execute(
        "INSERT INTO job_attempts (job_id, fence, attempt, worker_id, started_at) VALUES ($1, 1, 1, 'w1', now())",
        job_id,
    )
    return job_id, Fence(1)


@pytest.mark.parametrize(
    ("operation", "source"),
    list(itertools.product(OPERATIONS, JobState)),
    ids=lambda v: v if isinstance(v, str) else v.value,
)
async def test_an_operation_moves_a_job_exactly_from_its_declared_sources(
        db: asyncpg.Connection, operation: str, source: JobState
) -> None:
    sources, target, run, setup = OPERATIONS[operation]
    job_id, fence = await _job_in_state(db, source, setup)
    await run(db, job_id, fence)
    after = await db.fetchval("SELECT state FROM extraction_jobs WHERE id = $1", job_id)
    if source in sources:
        assert after == target.value, f"{operation} did not move {source.value} -> {target.value}"
    else:
        assert after == source.value, f"{operation} made an illegal move {source.value} -> {after}"


def test_the_operations_together_perform_exactly_the_legal_transitions() -> None:
    performed = {(s, target) for sources, target, _, _ in OPERATIONS.values() for s in sources}
    assert performed == states.LEGAL


def test_terminal_states_have_no_way_out() -> None:
    for source, _ in states.LEGAL:
        assert source not in states.TERMINAL


def test_sources_of_lists_exactly_the_legal_sources() -> None:
    for target in JobState:
        expected = sorted(s.value for s in JobState if states.is_legal(s, target))
        assert states.sources_of(target) == expected
