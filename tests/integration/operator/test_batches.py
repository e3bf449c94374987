"""ExtractionBatch reconciler against the Kubernetes emulator and real PostgreSQL, kopf running for real."""

from __future__ import annotations

import asyncio
import collections
from typing import Any

import asyncpg
import pytest
from lading_operator import app, kube
from lading_worker import running

from lading.ids import PoolName
from lading.jobs.states import JobState
from lading.settings import AttemptSettings, ClaimerSettings, LeaseSettings, ReaperSettings, WorkerProcessSettings
from lading_demo import builtin, generator
from tests.integration.operator import conftest
from tests.support import kube_emulator, waiting
from tests.support.waiting import until

BATCHES = "lading.dev/v1alpha1/extractionbatches"


def _condition(obj: dict[str, Any], type_: str) -> dict[str, Any] | None:
    for cond in obj.get("status", {}).get("conditions", []):
        if cond["type"] == type_:
            return dict(cond)
    return None


async def _jobs(db: asyncpg.Connection, **where: str) -> int:
    return int(await db.fetchval("SELECT count(*) FROM extraction_jobs"))


async def _finish_all(db: asyncpg.Connection, *, state: JobState = JobState.SUCCEEDED) -> None:
    """Settle every job, as workers would (the state machine's terminal write)."""
    await db.execute(
        "UPDATE extraction_jobs SET state = $1, finished_at = clock_timestamp(), updated_at = clock_timestamp() "
        "WHERE state IN ('READY', 'RETRY_SCHEDULED')",
        str(state),
    )


async def test_batch_is_admitted_and_status_follows_the_work_to_completion(
    emulator: kube_emulator.KubeEmulator, api: kube.Client, db: asyncpg.Connection, operator: Any
) -> None:
    await conftest.create_quota(api, "acme", ["acme"])
    await conftest.create_pool(api, "acme", "builtin")
    await conftest.create_batch(api, "acme", "march", documents=5)

    running = await kube_emulator.wait_for(
        emulator, BATCHES, "acme", "march", lambda o: o.get("status", {}).get("phase") == "Running"
    )
    assert running["status"]["total"] == 5 and running["status"]["ready"] == 5
    assert running["status"]["tenant"] == "acme"
    assert _condition(running, "Admitted")["status"] == "True"  # type: ignore[index]
    assert running["metadata"]["finalizers"] == [app.FINALIZER]
    assert await _jobs(db) == 5

    async def admitted_event() -> bool:
        stored = (emulator.stored("v1/events", "acme", n) for n in emulator.names("v1/events", "acme"))
        return "Admitted" in {e.get("reason") for e in stored if e}

    await until(admitted_event, timeout_s=10)

    await _finish_all(db)
    done = await kube_emulator.wait_for(
        emulator, BATCHES, "acme", "march", lambda o: o.get("status", {}).get("phase") == "Completed"
    )
    assert done["status"]["succeeded"] == 5 and done["status"]["ready"] == 0
    assert _condition(done, "Complete")["status"] == "True"  # type: ignore[index]
    assert done["status"]["observedGeneration"] == done["metadata"]["generation"]


async def test_no_tenant_quota_then_quota_created_admits(
    emulator: kube_emulator.KubeEmulator, api: kube.Client, db: asyncpg.Connection, operator: Any
) -> None:
    await conftest.create_pool(api, "acme", "builtin")
    await conftest.create_batch(api, "acme", "orphan", documents=2)
    pending = await kube_emulator.wait_for(
        emulator,
        BATCHES,
        "acme",
        "orphan",
        lambda o: (_condition(o, "Admitted") or {}).get("reason") == "NoTenantQuota",
    )
    assert pending["status"]["phase"] == "Pending"
    assert await _jobs(db) == 0

    await conftest.create_quota(api, "acme", ["acme"])
    await kube_emulator.wait_for(emulator, BATCHES, "acme", "orphan", lambda o: o["status"]["phase"] == "Running")
    assert await _jobs(db) == 2


async def test_quota_exceeded_waits_then_raised_quota_admits(
    emulator: kube_emulator.KubeEmulator, api: kube.Client, db: asyncpg.Connection, operator: Any
) -> None:
    await conftest.create_quota(api, "acme", ["acme"], maxQueuedJobs=5)
    await conftest.create_pool(api, "acme", "builtin")
    await conftest.create_batch(api, "acme", "first", documents=4)
    await kube_emulator.wait_for(
        emulator, BATCHES, "acme", "first", lambda o: o.get("status", {}).get("phase") == "Running"
    )
    await conftest.create_batch(api, "acme", "second", documents=3)
    waiting = await kube_emulator.wait_for(
        emulator,
        BATCHES,
        "acme",
        "second",
        lambda o: (_condition(o, "Admitted") or {}).get("reason") == "QuotaExceeded",
    )
    assert waiting["status"]["phase"] == "Pending"
    assert "maxQueuedJobs=5" in _condition(waiting, "Admitted")["message"]  # type: ignore[index]
    assert await _jobs(db) == 4

    await api.merge_patch(kube.path(conftest.GROUP_VERSION, "tenantquotas", namespace=None, name="acme"),
                          {"spec": {"maxQueuedJobs": 10}})  # fmt: skip
    await kube_emulator.wait_for(emulator, BATCHES, "acme", "second", lambda o: o["status"]["phase"] == "Running")
    assert await _jobs(db) == 7


async def test_room_freed_by_work_admits_the_waiting_batch(
    emulator: kube_emulator.KubeEmulator, api: kube.Client, db: asyncpg.Connection, operator: Any
) -> None:
    await conftest.create_quota(api, "acme", ["acme"], maxQueuedJobs=5)
    await conftest.create_pool(api, "acme", "builtin")
    await conftest.create_batch(api, "acme", "first", documents=4)
    await kube_emulator.wait_for(
        emulator, BATCHES, "acme", "first", lambda o: o.get("status", {}).get("phase") == "Running"
    )
    await conftest.create_batch(api, "acme", "second", documents=3)
    await kube_emulator.wait_for(
        emulator,
        BATCHES,
        "acme",
        "second",
        lambda o: (_condition(o, "Admitted") or {}).get("reason") == "QuotaExceeded",
    )
    await _finish_all(db)  # the first batch completes: room appears, no quota change
    await kube_emulator.wait_for(emulator, BATCHES, "acme", "second", lambda o: o["status"]["phase"] == "Running")
    assert await _jobs(db) == 7


async def test_suspend_and_resume(
    emulator: kube_emulator.KubeEmulator, api: kube.Client, db: asyncpg.Connection, operator: Any
) -> None:
    await conftest.create_quota(api, "acme", ["acme"])
    await conftest.create_pool(api, "acme", "builtin")
    await conftest.create_batch(api, "acme", "b", documents=2)
    await kube_emulator.wait_for(
        emulator, BATCHES, "acme", "b", lambda o: o.get("status", {}).get("phase") == "Running"
    )

    await api.merge_patch(conftest.batch_path("acme", "b"), {"spec": {"suspend": True}})
    suspended = await kube_emulator.wait_for(
        emulator, BATCHES, "acme", "b", lambda o: o["status"]["phase"] == "Suspended"
    )
    assert suspended["metadata"]["generation"] == 2
    assert await db.fetchval("SELECT suspended FROM batches") is True
    assert await db.fetchval("SELECT bool_and(suspended) FROM extraction_jobs") is True, "no job is claimable"

    await api.merge_patch(conftest.batch_path("acme", "b"), {"spec": {"suspend": False}})
    await kube_emulator.wait_for(emulator, BATCHES, "acme", "b", lambda o: o["status"]["phase"] == "Running")
    assert await db.fetchval("SELECT suspended FROM batches") is False
    assert await db.fetchval("SELECT bool_or(suspended) FROM extraction_jobs") is False


async def test_delete_cancels_jobs_keeps_results_and_releases_the_finalizer(
    emulator: kube_emulator.KubeEmulator, api: kube.Client, db: asyncpg.Connection, operator: Any
) -> None:
    await conftest.create_quota(api, "acme", ["acme"])
    await conftest.create_pool(api, "acme", "builtin")
    await conftest.create_batch(api, "acme", "doomed", documents=3)
    await kube_emulator.wait_for(
        emulator, BATCHES, "acme", "doomed", lambda o: o.get("status", {}).get("phase") == "Running"
    )
    first = await db.fetchval("SELECT min(id) FROM extraction_jobs")
    await db.execute(
        "UPDATE extraction_jobs SET state = 'SUCCEEDED', finished_at = clock_timestamp() WHERE id = $1", first
    )

    assert await api.delete(conftest.batch_path("acme", "doomed"))

    async def gone() -> bool:
        return emulator.stored(BATCHES, "acme", "doomed") is None

    await until(gone, timeout_s=20)
    states = dict(await db.fetch("SELECT state, count(*) FROM extraction_jobs GROUP BY state"))
    assert states == {"SUCCEEDED": 1, "CANCELLED": 2}
    assert await db.fetchval("SELECT count(*) FROM batches") == 1


async def test_a_real_worker_drives_the_status_to_completion(
    emulator: kube_emulator.KubeEmulator,
    api: kube.Client,
    db: asyncpg.Connection,
    dbpool: asyncpg.Pool,
    operator: Any,
) -> None:
    samples = generator.generate(24, seed=11)
    expected = collections.Counter(s.expected_state for s in samples)
    await conftest.create_quota(api, "acme", ["acme"])
    await conftest.create_pool(api, "acme", "builtin")
    body = conftest.batch_body("acme", "real", documents=1)
    body["spec"]["documents"] = [{"key": s.key, "text": s.text} for s in samples]
    await api.create(conftest.batch_path("acme"), body)
    await kube_emulator.wait_for(
        emulator, BATCHES, "acme", "real", lambda o: o.get("status", {}).get("phase") == "Running"
    )

    settings = WorkerProcessSettings(
        pool=PoolName("acme/builtin"),
        lease=LeaseSettings(ttl_s=10, heartbeat_interval_s=0.1),
        claimer=ClaimerSettings(concurrency=8, batch_size=8, poll_interval_s=0.05),
        reaper=ReaperSettings(interval_s=0.1),
        attempt=AttemptSettings(backoff_base_s=0.01, backoff_cap_s=0.02, timeout_s=5),
        shutdown_grace_s=5.0,
    )
    worker = running.Worker(dbpool, settings=settings, provider=builtin.BuiltinProvider())
    async with waiting.running(worker.run):
        done = await kube_emulator.wait_for(
            emulator, BATCHES, "acme", "real", lambda o: o.get("status", {}).get("phase") in ("Completed", "Failed"),
            timeout_s=60,
        )  # fmt: skip
    status = done["status"]
    assert status["phase"] == "Completed"
    assert status["total"] == 24
    assert status["succeeded"] == expected["SUCCEEDED"]
    assert status["reviewRequired"] == expected["REVIEW_REQUIRED"]
    assert status["failed"] == expected["FAILED_TERMINAL"]
    assert status["ready"] == status["running"] == status["retryScheduled"] == 0
    assert "completedAt" in status
    if expected["FAILED_TERMINAL"]:
        keys = {f["documentKey"] for f in status["recentFailures"]}
        assert keys == {s.key for s in samples if s.expected_state == "FAILED_TERMINAL"}

    # Events are posted asynchronously (kopf's posting queue): wait for them rather than race.
    async def posted() -> bool:
        stored = (emulator.stored("v1/events", "acme", n) for n in emulator.names("v1/events", "acme"))
        return {"Admitted", "Completed"} <= {e.get("reason") for e in stored if e}

    await until(posted, timeout_s=10)


async def test_the_emulator_rejects_what_the_api_server_would(api: kube.Client) -> None:
    body = conftest.batch_body("acme", "bad", documents=1)
    body["spec"]["priority"] = "urgent"
    with pytest.raises(kube.KubeError) as rejected:
        await api.create(conftest.batch_path("acme"), body)
    assert rejected.value.status == 422 and "priority" in str(rejected.value)
    created = await api.create(conftest.batch_path("acme"), conftest.batch_body("acme", "good", documents=1))
    assert created["spec"]["priority"] == "normal", "defaults are applied"
    with pytest.raises(kube.KubeError) as immutable:
        await api.merge_patch(
            conftest.batch_path("acme", "good"), {"spec": {"schema": "invoice.v1", "deadlineSeconds": 120}}
        )
    assert immutable.value.status == 422
    with pytest.raises(kube.KubeError) as bad_status:
        await api.merge_patch(conftest.batch_path("acme", "good", sub="status"), {"status": {"phase": "Exploded"}})
    assert bad_status.value.status == 422


async def test_a_spent_daily_token_budget_shows_on_the_batch_and_the_quota(
    emulator: kube_emulator.KubeEmulator, api: kube.Client, db: asyncpg.Connection, operator: Any
) -> None:
    await conftest.create_quota(api, "acme", ["acme"], dailyTokenBudget=1000)
    await conftest.create_pool(api, "acme", "builtin")
    await conftest.create_batch(api, "acme", "b", documents=2)
    running = await kube_emulator.wait_for(
        emulator, BATCHES, "acme", "b", lambda o: o.get("status", {}).get("phase") == "Running"
    )
    assert _condition(running, "BudgetExhausted")["status"] == "False"  # type: ignore[index]
    await db.execute(
        "INSERT INTO tenant_usage (tenant, day, tokens) "
        "VALUES ('acme', (clock_timestamp() AT TIME ZONE 'UTC')::date, 5000)"
    )
    spent = await kube_emulator.wait_for(
        emulator, BATCHES, "acme", "b", lambda o: (_condition(o, "BudgetExhausted") or {}).get("status") == "True"
    )
    assert "5000 of 1000" in _condition(spent, "BudgetExhausted")["message"]  # type: ignore[index]
    quota = await kube_emulator.wait_for(
        emulator,
        "lading.dev/v1alpha1/tenantquotas",
        None,
        "acme",
        lambda o: o.get("status", {}).get("tokensToday") == 5000,
    )
    assert _condition(quota, "BudgetExhausted")["reason"] == "DailyTokenBudgetSpent"  # type: ignore[index]


async def test_a_spent_money_budget_and_the_batch_cost_show_on_the_batch_and_the_quota(
    emulator: kube_emulator.KubeEmulator, api: kube.Client, db: asyncpg.Connection, operator: Any
) -> None:
    await conftest.create_quota(api, "acme", ["acme"], budget={"currency": "USD", "monthly": "1.00"})
    pricing = {"currency": "USD", "inputPerMillionTokens": "0.15", "outputPerMillionTokens": "0.60"}
    await conftest.create_pool(api, "acme", "builtin", pricing=pricing)
    await conftest.create_batch(api, "acme", "b", documents=2)
    running = await kube_emulator.wait_for(
        emulator, BATCHES, "acme", "b", lambda o: o.get("status", {}).get("phase") == "Running"
    )
    assert _condition(running, "BudgetExhausted")["reason"] == "WithinBudget"  # type: ignore[index]
    # What finished attempts write (job_finish_many): the job's sum, the batch's running sum (batch_costs)
    # and the tenant's spend of the day.
    await db.execute("UPDATE extraction_jobs SET cost = 0.6000001, cost_currency = 'USD' WHERE tenant = 'acme'")
    await db.execute("INSERT INTO batch_costs (batch_id, currency, amount) SELECT batch_id, 'USD', sum(cost) "
                     "FROM extraction_jobs WHERE tenant = 'acme' GROUP BY batch_id")  # fmt: skip
    await db.execute(
        "INSERT INTO tenant_spend (tenant, currency, day, amount) "
        "VALUES ('acme', 'USD', (clock_timestamp() AT TIME ZONE 'UTC')::date, 1.2000002)"
    )
    spent = await kube_emulator.wait_for(
        emulator, BATCHES, "acme", "b", lambda o: (_condition(o, "BudgetExhausted") or {}).get("status") == "True"
    )
    condition = _condition(spent, "BudgetExhausted")
    assert condition is not None and condition["reason"] == "MonthlyBudgetSpent"
    assert "1.2000002 of 1.00 USD spent this month" in condition["message"]
    assert "jobs wait (they do not fail) until" in condition["message"]
    assert spent["status"]["cost"] == {"amount": "1.2000002", "currency": "USD"}  # the two jobs' sums
    quota = await kube_emulator.wait_for(
        emulator, "lading.dev/v1alpha1/tenantquotas", None, "acme",
        lambda o: o.get("status", {}).get("spentThisMonth") == {"amount": "1.2000002", "currency": "USD"},
    )  # fmt: skip
    assert _condition(quota, "BudgetExhausted")["reason"] == "MonthlyBudgetSpent"  # type: ignore[index]


async def test_an_operator_limited_to_namespaces_leaves_others_alone(
    emulator: kube_emulator.KubeEmulator,
    api: kube.Client,
    db: asyncpg.Connection,
    operator_factory: Any,
) -> None:
    with operator_factory(namespaces=("acme",)) as handle:
        await asyncio.get_running_loop().run_in_executor(None, handle.ready.wait, 30)
        await conftest.create_quota(api, "acme", ["acme", "other"])
        await conftest.create_pool(api, "acme", "builtin")
        await conftest.create_batch(
            api, "other", "theirs", documents=2, inferencePoolRef={"name": "builtin", "namespace": "acme"}
        )
        await conftest.create_batch(api, "acme", "ours", documents=3)
        await kube_emulator.wait_for(
            emulator, BATCHES, "acme", "ours", lambda o: o.get("status", {}).get("phase") == "Running"
        )
        theirs = emulator.stored(BATCHES, "other", "theirs")
        assert theirs is not None and "status" not in theirs and not theirs["metadata"].get("finalizers")
        assert await db.fetchval("SELECT count(*) FROM batches") == 1
