"""
"Eligible job" is defined once, by the database function lading_job_eligible (migration 0024):
the `job_eligible` fragment that the claim, the gauges, the scaler, KEDA and the reports include
is a call of it, and the claim plan's contenders' probe (lading_claim_plan) calls it too.

Each test fails when the two drift apart: a function of the schema that states the condition
again, a fragment that no longer calls the function, a planner that no longer inlines it (the
claim index would be lost), or a claim plan and a fragment reader that disagree about a job.
"""

from __future__ import annotations

import re

import asyncpg
import pytest

from lading import accepting
from lading.db import jobs, queries
from tests.support import factories

RESTATED = re.compile(r"state\s+IN\s+\('READY',\s*'RETRY_SCHEDULED'\)\s+AND\s+NOT\s+(\w+\.)?suspended")
"""The condition's tell, as test_query_loader looks for it in the SQL files."""

INELIGIBLE = {
    "deferred": "available_at = clock_timestamp() + interval '1 hour'",
    "past its deadline": "deadline_at = clock_timestamp() - interval '1 second'",
    "out of attempts": "attempt = max_attempts",
    "suspended": "suspended = true",
    "cancelled": "state = 'CANCELLED', finished_at = clock_timestamp()",
}
"""One way to leave a waiting job ineligible per term of the condition (and a state that is not waiting)."""


class _Undo(Exception):
    """Raised to roll a case back."""


def test_the_fragment_is_a_call_of_the_function() -> None:
    assert re.fullmatch(r"\(lading_job_eligible\(j\.\w+(, j\.\w+)*\)\)", queries.fragment("job_eligible"))
    assert not RESTATED.search(queries.fragment("job_eligible"))


async def test_no_function_of_the_schema_states_the_condition_again(db: asyncpg.Connection) -> None:
    functions = {
        r["proname"]: r["prosrc"]
        for r in await db.fetch(
            "SELECT p.proname, p.prosrc FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
            " WHERE n.nspname = current_schema()"
        )
    }
    assert sorted(name for name, source in functions.items() if RESTATED.search(source)) == ["lading_job_eligible"]
    assert "lading_job_eligible(" in functions["lading_claim_plan"]


async def test_the_planner_inlines_the_definition_and_keeps_the_claim_index(db: asyncpg.Connection) -> None:
    query = f"SELECT count(*) FROM extraction_jobs j WHERE j.pool = $1 AND {queries.fragment('job_eligible')}"
    async with db.transaction():
        await db.execute("SET LOCAL enable_seqscan = off")
        plan = "\n".join(r[0] for r in await db.fetch(f"EXPLAIN (VERBOSE, COSTS OFF) {query}", factories.POOL))
    assert "lading_job_eligible" not in plan, plan  # written out, as if the query said it
    assert re.search(r"(Index (Only )?Scan using|Bitmap Index Scan on) extraction_jobs_(fair_)?claimable", plan), plan


@pytest.mark.parametrize("how", list(INELIGIBLE))
async def test_the_claim_plan_and_the_readers_agree_job_by_job(db: asyncpg.Connection, how: str) -> None:
    await factories.seed(db)
    [job] = (await accepting.accept_batch(db, factories.batch_request(count=1))).job_ids

    async def seen() -> tuple[list[str], set[str]]:
        planned = [r["tenant"] for r in await db.fetch("SELECT tenant FROM lading_claim_plan($1, 10)", factories.POOL)]
        return planned, set(await jobs.oldest_eligible_age_by_pool(db))

    with pytest.raises(_Undo):
        async with db.transaction():  # the plan locks the tenant's row: undone with the case
            assert await seen() == ([factories.TENANT], {factories.POOL})
            raise _Undo
    with pytest.raises(_Undo):
        async with db.transaction():
            await db.execute(f"UPDATE extraction_jobs SET {INELIGIBLE[how]} WHERE id = $1", job)
            assert await seen() == ([], set())
            raise _Undo
