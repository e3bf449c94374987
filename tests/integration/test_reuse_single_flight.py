"""
Single flight of result reuse under concurrent claims (docs/reuse.md, migration 0029): eight
claimers on their own connections claim and resolve copies of the same documents at once, half of
them marking the reuse key in the claim (this release's worker) and half leaving the mark to the
resolution (an earlier release's); a leading job "calls the model" for a few milliseconds and
succeeds, a waiting one is given back, a reusing one takes the result. Every document is extracted
by exactly one leading job, and no lead is ever decided while another job of the same document is
still leading.
"""

from __future__ import annotations

import asyncio
import dataclasses

import asyncpg

from lading import accepting
from lading.db import jobs
from lading.db import reuse as reuse_db
from lading.ids import JobId, PoolName, WorkerId
from lading.jobs import transitions
from lading_demo import generator
from tests.support import factories

KEY_OF = ("stub-model", "p1", "")
DOCUMENTS = 12
COPIES = 8
CLAIMERS = 8


async def test_concurrent_copies_are_extracted_once(db: asyncpg.Connection, dbpool: asyncpg.Pool) -> None:
    await factories.seed(db)
    texts = [s.text for s in generator.generate(DOCUMENTS, seed=29)]
    request = factories.batch_request(name="copies", count=0)
    request = dataclasses.replace(request, documents=[
        accepting.DocumentInput(key=f"doc-{d}-{c}", text=texts[d]) for d in range(DOCUMENTS) for c in range(COPIES)
    ])  # fmt: skip
    accepted = await accepting.accept_batch(db, request)
    document_of = {
        JobId(r["job_id"]): texts.index(r["text"])
        for r in await db.fetch("SELECT job_id, text FROM job_documents WHERE job_id = ANY($1::bigint[])",
                                list(accepted.job_ids))
    }  # fmt: skip
    leading: dict[int, JobId] = {}
    """Document -> the job leading it now (its model call not yet committed)."""
    leads: dict[int, list[JobId]] = {}
    overlaps: list[tuple[JobId, JobId]] = []
    decided: dict[reuse_db.Kind, int] = dict.fromkeys(reuse_db.Kind, 0)

    async def claimer(n: int) -> None:
        worker = WorkerId(f"w{n}")
        async with dbpool.acquire() as conn:
            while True:
                claimed = await jobs.claim_batch(
                    conn, pool=PoolName(factories.POOL), worker_id=worker, limit=3, lease_ttl_s=60,
                    reuse_key_of=KEY_OF if n % 2 == 0 else None,
                )  # fmt: skip
                if not claimed:
                    settled = await conn.fetchval(
                        "SELECT count(*) FROM extraction_jobs WHERE state = 'SUCCEEDED'"
                    )  # fmt: skip
                    if settled == len(accepted.job_ids):
                        return
                    await asyncio.sleep(0.005)  # pacing a poll, not waiting for a race
                    continue
                decisions = await reuse_db.resolve(
                    conn, [(j.id, j.fence) for j in claimed], worker_id=worker, model=KEY_OF[0],
                    prompt_version=KEY_OF[1], judging=KEY_OF[2], wait_margin_s=1.0,
                )  # fmt: skip
                assert set(decisions) == {j.id for j in claimed}
                finishes, reused = [], []
                for job in claimed:
                    decision = decisions[job.id]
                    decided[decision.kind] += 1
                    document = document_of[job.id]
                    if decision.kind is reuse_db.Kind.LEAD:
                        if document in leading:
                            overlaps.append((leading[document], job.id))
                        leading[document] = job.id
                        leads.setdefault(document, []).append(job.id)
                        finishes.append(transitions.succeed(
                            job.id, job.fence, result={"document": document}, validation={"passed": True}
                        ))  # fmt: skip
                    elif decision.kind is reuse_db.Kind.WAIT:
                        finishes.append(transitions.deferred(
                            job.id, job.fence, leader=decision.other_job or job.id, retry_in_s=0.0
                        ))  # fmt: skip
                    else:
                        assert decision.result is not None and decision.other_job is not None
                        reused.append(transitions.reused(
                            job.id, job.fence, source=decision.other_job, result=decision.result,
                            validation=decision.validation or {},
                        ))  # fmt: skip
                await asyncio.sleep(0.02)  # the model call of the leading jobs
                applied = await jobs.finish_many(conn, finishes, worker_id=worker)
                applied |= await reuse_db.finish_reused_many(conn, reused, worker_id=worker)
                assert applied == {f.job_id for f in finishes + reused}
                for finish in finishes:  # committed: a copy resolved from now on takes the result
                    if finish.outcome == "ok" and leading.get(document_of[finish.job_id]) == finish.job_id:
                        del leading[document_of[finish.job_id]]

    await asyncio.wait_for(asyncio.gather(*(claimer(n) for n in range(CLAIMERS))), timeout=120)

    assert overlaps == []
    assert {document: len(ids) for document, ids in leads.items()} == dict.fromkeys(range(DOCUMENTS), 1)
    assert decided[reuse_db.Kind.REUSE] == DOCUMENTS * (COPIES - 1)
    assert decided[reuse_db.Kind.WAIT] > 0
    # Nobody waits for a waiting job: only leaders and jobs that took a result keep a mark.
    assert await db.fetchval("SELECT count(*) FROM extraction_jobs WHERE reuse_key IS NULL") == 0
    assert await db.fetchval("SELECT count(DISTINCT reuse_key) FROM extraction_jobs") == DOCUMENTS


async def test_the_claim_marks_the_key_and_says_which_jobs_may_reuse(db: asyncpg.Connection) -> None:
    await factories.seed(db)
    await factories.seed(db, tenant="initech")
    await db.execute("UPDATE tenants SET spec = '{\"resultReuse\": \"none\"}' WHERE name = 'initech'")
    text = generator.generate(1, seed=29)[0].text
    requests = [
        factories.batch_request(name="on", count=0),
        dataclasses.replace(factories.batch_request(name="off", count=0), reuse=False),
        factories.batch_request(name="none", count=0, tenant="initech"),
    ]
    for request in requests:
        await accepting.accept_batch(db, dataclasses.replace(
            request, documents=[accepting.DocumentInput(key="doc", text=text)]
        ))  # fmt: skip
    claimed = await jobs.claim_batch(
        db, pool=PoolName(factories.POOL), worker_id=WorkerId("w"), limit=3, lease_ttl_s=60, reuse_key_of=KEY_OF
    )  # fmt: skip
    may = {await db.fetchval("SELECT b.name FROM batches b WHERE b.id = $1", j.batch_id): j.may_reuse for j in claimed}
    assert may == {"on": True, "off": False, "none": False}
    marked = await db.fetch("SELECT reuse_key FROM extraction_jobs")
    assert len({r["reuse_key"] for r in marked}) == 1 and marked[0]["reuse_key"] is not None  # the tenant is no part

    await accepting.accept_batch(db, dataclasses.replace(
        factories.batch_request(name="later", count=0), documents=[accepting.DocumentInput(key="doc", text=text)]
    ))  # fmt: skip
    [unmarked] = await jobs.claim_batch(
        db, pool=PoolName(factories.POOL), worker_id=WorkerId("w"), limit=3, lease_ttl_s=60
    )  # fmt: skip
    assert unmarked.may_reuse is None  # a claim without the producer neither asks nor marks
    assert await db.fetchval("SELECT reuse_key FROM extraction_jobs WHERE id = $1", unmarked.id) is None
