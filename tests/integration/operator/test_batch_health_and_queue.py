"""An ExtractionBatch as GitOps tools and people read it: kstatus conditions (Ready, Stalled, Reconciling,
a Failed separate from Complete) that the documented Argo CD health checks understand, its queue position and
ETA while it waits, and spec.priority changes applied to its jobs before observedGeneration moves."""

from __future__ import annotations

from typing import Any

import asyncpg
from lading_operator import kube

from tests.integration.operator import conftest
from tests.support import argocd_health, kube_emulator, waiting

BATCHES = "lading.dev/v1alpha1/extractionbatches"
POOLS = "lading.dev/v1alpha1/inferencepools"


def _condition(obj: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in obj.get("status", {}).get("conditions", []) if c["type"] == type_), {})


def _status(obj: dict[str, Any], type_: str) -> tuple[str, str]:
    condition = _condition(obj, type_)
    return condition.get("status", ""), condition.get("reason", "")


async def _settle(db: asyncpg.Connection, batch: str, state: str) -> None:
    await db.execute(
        "UPDATE extraction_jobs j SET state = $2, finished_at = clock_timestamp(), updated_at = clock_timestamp() "
        "FROM batches b WHERE j.batch_id = b.id AND b.name = $1 AND j.state IN ('READY', 'RETRY_SCHEDULED')",
        batch, state,
    )  # fmt: skip


async def test_conditions_queue_position_priority_and_health_follow_the_batch(
    emulator: kube_emulator.KubeEmulator, api: kube.Client, db: asyncpg.Connection, operator: Any
) -> None:
    await conftest.create_quota(api, "acme", ["acme"], allowedPriorities=["normal", "high"], maxQueuedJobs=7)
    await conftest.create_pool(api, "acme", "builtin")
    await conftest.create_batch(api, "acme", "first", documents=4)
    first = await kube_emulator.wait_for(
        emulator, BATCHES, "acme", "first", lambda o: "queuePosition" in o.get("status", {})
    )
    await conftest.create_batch(api, "acme", "second", documents=3)
    second = await kube_emulator.wait_for(
        emulator, BATCHES, "acme", "second", lambda o: "queuePosition" in o.get("status", {})
    )

    # Claim order: all of "first" before "second"; no call finished in the pool yet, so no ETA.
    assert first["status"]["queuePosition"] == 0
    assert second["status"]["queuePosition"] == 4
    assert "etaSeconds" not in second["status"]
    assert _status(second, "Ready") == ("False", "JobsRemaining")
    assert _status(second, "Stalled") == ("False", "NotStalled")
    assert _status(second, "Reconciling") == ("False", "Reconciled")  # admitted: its generation is in place
    assert argocd_health.health("ExtractionBatch", second)[0] == "Progressing"
    # Over quota: Pending, not stalled (room comes by itself), queued behind all of the tenant's work.
    await conftest.create_batch(api, "acme", "third", documents=2)
    third = await kube_emulator.wait_for(
        emulator, BATCHES, "acme", "third", lambda o: "queuePosition" in o.get("status", {})
    )
    assert third["status"]["phase"] == "Pending" and third["status"]["queuePosition"] == 7
    assert _status(third, "Ready") == ("False", "QuotaExceeded")
    assert _status(third, "Stalled") == ("False", "NotStalled")
    assert _status(third, "Reconciling") == ("True", "QuotaExceeded")  # kstatus: InProgress until admitted
    pool = await kube_emulator.wait_for(
        emulator, POOLS, "acme", "builtin", lambda o: "conditions" in o.get("status", {})
    )
    assert argocd_health.health("InferencePool", pool) == ("Healthy", "Applied: workers and limits in place")

    # A priority change reaches the jobs before observedGeneration moves; "second" now goes first.
    path = conftest.batch_path("acme", "second")
    await api.merge_patch(path, {"spec": {"priority": "high"}})
    seen = await kube_emulator.wait_for(
        emulator, BATCHES, "acme", "second", lambda o: o.get("status", {}).get("observedGeneration") == 2
    )
    assert seen["metadata"]["generation"] == 2
    assert await db.fetchval("SELECT array_agg(DISTINCT j.priority) FROM extraction_jobs j JOIN batches b "
                             "ON b.id = j.batch_id WHERE b.name = 'second'") == [0]  # fmt: skip
    assert await db.fetchval("SELECT priority FROM batches WHERE name = 'second'") == 0
    await kube_emulator.wait_for(
        emulator, BATCHES, "acme", "first", lambda o: o.get("status", {}).get("queuePosition") == 3
    )

    async def reranked_event() -> bool:
        stored = (emulator.stored("v1/events", "acme", n) for n in emulator.names("v1/events", "acme"))
        return "PriorityChanged" in {e.get("reason") for e in stored if e}

    await waiting.until(reranked_event, timeout_s=10)

    # A priority the tenant's quota does not allow is not applied: Stalled says why, the jobs keep theirs.
    await api.merge_patch(path, {"spec": {"priority": "low"}})
    stalled = await kube_emulator.wait_for(
        emulator, BATCHES, "acme", "second", lambda o: o.get("status", {}).get("observedGeneration") == 3
    )
    assert _status(stalled, "Stalled") == ("True", "PriorityNotAllowed")
    assert _status(stalled, "Reconciling") == ("False", "Reconciled")
    assert "allowedPriorities" in _condition(stalled, "Stalled")["message"]
    assert argocd_health.health("ExtractionBatch", stalled)[0] == "Degraded"
    assert await db.fetchval("SELECT priority FROM batches WHERE name = 'second'") == 0

    # Success: Complete and Ready, Failed=False; the queue fields are gone with the queue.
    await _settle(db, "first", "SUCCEEDED")
    done = await kube_emulator.wait_for(
        emulator, BATCHES, "acme", "first", lambda o: o.get("status", {}).get("phase") == "Completed"
    )
    assert _status(done, "Complete") == ("True", "Completed") and _status(done, "Failed") == ("False", "Completed")
    assert _status(done, "Ready") == ("True", "Completed") and _status(done, "Stalled") == ("False", "NotStalled")
    assert "queuePosition" not in done["status"] and "etaSeconds" not in done["status"]
    assert argocd_health.health("ExtractionBatch", done)[0] == "Healthy"

    # Nothing succeeded: Failed, never Complete (so `kubectl wait --for=condition=Complete` does not pass).
    await _settle(db, "second", "FAILED_TERMINAL")
    failed = await kube_emulator.wait_for(
        emulator, BATCHES, "acme", "second", lambda o: o.get("status", {}).get("phase") == "Failed"
    )
    assert _status(failed, "Failed") == ("True", "Failed") and _status(failed, "Complete") == ("False", "Failed")
    assert _status(failed, "Ready") == ("False", "Failed") and _status(failed, "Stalled") == ("True", "Failed")
    assert argocd_health.health("ExtractionBatch", failed)[0] == "Degraded"
