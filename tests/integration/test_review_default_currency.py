"""
`lading review correct` re-checks a correction as the worker checked the model's answer: with
the default currency of the job's pool (`InferencePool.spec.defaultCurrency`).
"""

from __future__ import annotations

import dataclasses

import asyncpg

from lading import accepting, applying, ids, reviewing, validation
from lading.db import jobs
from lading.jobs import transitions
from lading.models import specs
from tests.support import factories, invoices

WORKER = ids.WorkerId("w1")
POLICY = "invoice-strict-v2"


async def _awaiting_review(db: asyncpg.Connection, *, pool: str, **spec: object) -> ids.JobId:
    """One no-currency invoice of a batch on a new builtin `pool`, waiting for a reviewer."""
    namespace, name = pool.split("/")
    await applying.apply_inference_pool(db, specs.InferencePool.model_validate({
        "metadata": {"name": name, "namespace": namespace}, "spec": {"provider": "builtin", **spec},
    }))
    request = dataclasses.replace(
        factories.batch_request(name=name, count=1, pool=pool),
        validation_policy=POLICY,
        documents=[accepting.DocumentInput(key="no-currency", text=invoices.NO_CURRENCY_DOCUMENT)],
    )
    [job_id] = (await accepting.accept_batch(db, request)).job_ids
    [claimed] = await jobs.claim_batch(db, pool=ids.PoolName(pool), worker_id=WORKER, limit=1, lease_ttl_s=600)
    doubtful = {**invoices.NO_CURRENCY_ANSWER, "currency": "TRY"}
    verdict = validation.validate(doubtful, source_text=invoices.NO_CURRENCY_DOCUMENT, policy=POLICY)
    assert not verdict.passed
    finish = transitions.needs_review(claimed.id, claimed.fence, result=doubtful, validation=verdict.to_json())
    assert await jobs.finish_many(db, [finish], worker_id=WORKER) == {job_id}
    return job_id


async def test_a_correction_is_judged_with_the_default_currency_of_its_jobs_pool(db: asyncpg.Connection) -> None:
    await factories.seed(db)
    on_eur = await _awaiting_review(db, pool="lading-system/eur", defaultCurrency="EUR")
    on_plain = await _awaiting_review(db, pool="lading-system/plain")
    corrected = invoices.NO_CURRENCY_ANSWER

    decision = await reviewing.correct(db, job_id=on_eur, reviewer="bob", reason="EUR", corrected=corrected)
    assert decision.corrected_verdict == validation.Verdict(policy=POLICY, passed=True, failed=())

    decision = await reviewing.correct(db, job_id=on_plain, reviewer="bob", reason="EUR", corrected=corrected)
    assert decision.corrected_verdict is not None
    assert [c.check for c in decision.corrected_verdict.failed] == ["currency_not_shown"]
    stored = await db.fetchval("SELECT validation FROM results WHERE job_id = $1", on_plain)
    assert [c["check"] for c in stored["failed_checks"]] == ["currency_not_shown"]
