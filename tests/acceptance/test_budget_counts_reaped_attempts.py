"""
A real worker process SIGKILLed in the middle of a model call on a priced pool: its request may have
been billed, so the attempt the reaper closes is charged its reservation (the prompt estimate and the
output budget the worker noted before sending, at the pool's prices), once, into the job, the batch,
the tenant's spend and so its budget (docs/cost.md).
"""

from __future__ import annotations

import asyncio
import dataclasses
import decimal
import pathlib
import signal

import asyncpg
import pytest

from lading import accepting
from lading.db import fairness, registry, spend
from lading.ids import PoolName, TenantName
from lading_demo import generator
from tests.support import factories, processes, waiting

pytestmark = pytest.mark.slow

POOL = PoolName(factories.POOL)
PRICES = {"currency": "EUR", "inputPerMillionTokens": "0.15", "outputPerMillionTokens": "0.60"}
FAST = ["--lease-ttl", "2", "--heartbeat-interval", "0.4", "--reaper-interval", "0.2", "--poll-interval", "0.1",
        "--backoff-base", "0.05", "--concurrency", "1"]  # fmt: skip


async def test_an_attempt_cut_off_by_a_killed_worker_is_charged_its_reservation_once(
        db: asyncpg.Connection, database_url: str, tmp_path: pathlib.Path
) -> None:
    await factories.seed(db)
    await registry.upsert_tenant(
        db, name=TenantName(factories.TENANT), namespaces=[factories.TENANT], weight=1, max_queued_jobs=None,
        max_in_flight=None, spec={"budget": {"currency": "EUR", "monthly": "100"}},
    )  # fmt: skip
    # A slow model: the worker is killed while the call is in flight.
    await registry.upsert_pool(
        db, name=POOL, provider="builtin", model="lading-builtin",
        spec={"builtin": {"latencyMs": 1500}, "pricing": PRICES},
    )  # fmt: skip
    sample = next(s for s in generator.generate(10, seed=7) if s.expected_state == "SUCCEEDED")
    request = dataclasses.replace(
        factories.batch_request(count=0), documents=[accepting.DocumentInput(key=sample.key, text=sample.text)]
    )
    accepted = await accepting.accept_batch(db, request)
    doomed = await processes.start_worker(database_url, POOL, args=FAST, log=tmp_path / "doomed.log")
    try:

        async def noted() -> bool:
            return bool(await db.fetchval(
                "SELECT count(*) FROM job_attempts WHERE finished_at IS NULL AND reserved_tokens_in IS NOT NULL"
            ))  # fmt: skip

        await waiting.until(noted, timeout_s=30)
        doomed.send_signal(signal.SIGKILL)
        assert await asyncio.wait_for(doomed.wait(), 30) == -signal.SIGKILL
    finally:
        await processes.stop(doomed)
    cut_off = await db.fetchrow("SELECT job_id, fence, reserved_tokens_in, reserved_tokens_out FROM job_attempts")
    assert cut_off["reserved_tokens_in"] > 0 and cut_off["reserved_tokens_out"] > 0

    survivor = await processes.start_worker(database_url, POOL, args=FAST, log=tmp_path / "survivor.log")
    try:

        async def settled() -> bool:
            return bool(await db.fetchval("SELECT state FROM extraction_jobs") == "SUCCEEDED")

        await waiting.until(settled, timeout_s=60)
    finally:
        await processes.stop(survivor)

    attempts = await db.fetch("SELECT fence, outcome, cost, cost_currency FROM job_attempts ORDER BY fence")
    assert [a["outcome"] for a in attempts] == ["lease-expired", "ok"]
    reservation = (cut_off["reserved_tokens_in"] * decimal.Decimal(PRICES["inputPerMillionTokens"])
                   + cut_off["reserved_tokens_out"] * decimal.Decimal(PRICES["outputPerMillionTokens"])) / 10**6
    assert (attempts[0]["cost"], attempts[0]["cost_currency"]) == (reservation, "EUR")
    total = attempts[0]["cost"] + attempts[1]["cost"]
    assert attempts[1]["cost"] > 0
    assert (await spend.job_costs(db, job_id=cut_off["job_id"])).total == spend.Cost(total, "EUR")
    assert await spend.batch_cost(db, batch_id=accepted.batch_id) == spend.Cost(total, "EUR")
    budget = await fairness.tenant_budget(db, tenant=TenantName(factories.TENANT))
    assert budget is not None and budget.money is not None and budget.money.spent_this_month == total
