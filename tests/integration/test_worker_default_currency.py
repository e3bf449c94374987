"""
A pool's `defaultCurrency` reaches the worker's validation: stored with the pool by
`apply_inference_pool`, read by the worker when it starts, passed to `invoice-strict-v2`.
"""

from __future__ import annotations

import dataclasses

import asyncpg
from lading_worker import running

from lading import accepting, applying
from lading.models import specs
from lading.providers import base
from lading.settings import AttemptSettings, ClaimerSettings, LeaseSettings, ReaperSettings, WorkerProcessSettings
from tests.support import factories, invoices, providers, waiting


def _pool(name: str, **spec: object) -> specs.InferencePool:
    return specs.InferencePool.model_validate({
        "metadata": {"name": name, "namespace": "lading-system"},
        "spec": {"provider": "builtin", **spec},
    })


def _settings(pool: str) -> WorkerProcessSettings:
    return WorkerProcessSettings(
        pool=pool,
        lease=LeaseSettings(ttl_s=10, heartbeat_interval_s=0.05),
        claimer=ClaimerSettings(concurrency=4, batch_size=4, poll_interval_s=0.05),
        reaper=ReaperSettings(interval_s=0.05),
        attempt=AttemptSettings(backoff_base_s=0.01, backoff_cap_s=0.02, timeout_s=5),
        shutdown_grace_s=5.0,
    )


async def _settled_state(db: asyncpg.Connection, dbpool: asyncpg.Pool, *, pool: str) -> str:
    """Run a worker of `pool` over one no-currency invoice answered correctly; the job's final state."""
    request = dataclasses.replace(
        factories.batch_request(name=pool.rsplit("/", 1)[1], count=1, pool=pool),
        validation_policy="invoice-strict-v2",
        documents=[accepting.DocumentInput(key="no-currency", text=invoices.NO_CURRENCY_DOCUMENT)],
    )
    [job_id] = (await accepting.accept_batch(db, request)).job_ids
    provider = providers.ScriptedProvider(providers.always(base.Outcome.ok(invoices.NO_CURRENCY_ANSWER)))

    async def settled() -> bool:
        return await db.fetchval("SELECT state FROM extraction_jobs WHERE id = $1", job_id) in (
            "SUCCEEDED", "REVIEW_REQUIRED", "FAILED_TERMINAL")

    async with waiting.running(running.Worker(dbpool, settings=_settings(pool), provider=provider).run):
        await waiting.until(settled, timeout_s=30)
    return str(await db.fetchval("SELECT state FROM extraction_jobs WHERE id = $1", job_id))


async def test_a_document_showing_no_currency_succeeds_only_on_a_pool_naming_its_currency(
        db: asyncpg.Connection, dbpool: asyncpg.Pool
) -> None:
    await factories.seed(db)
    await applying.apply_inference_pool(db, _pool("eur", defaultCurrency="EUR"))
    await applying.apply_inference_pool(db, _pool("plain"))
    stored = await db.fetchval("SELECT spec FROM pools WHERE name = 'lading-system/eur'")
    assert stored["defaultCurrency"] == "EUR"

    assert await _settled_state(db, dbpool, pool="lading-system/eur") == "SUCCEEDED"
    assert await _settled_state(db, dbpool, pool="lading-system/plain") == "REVIEW_REQUIRED"
    checks = await db.fetchval(
        "SELECT r.validation FROM results r JOIN extraction_jobs j ON j.id = r.job_id WHERE j.pool = $1",
        "lading-system/plain",
    )
    assert [c["check"] for c in checks["failed_checks"]] == ["currency_not_shown"]
