"""
Group commit of single documents (`lading.intake.GroupSubmitter`): documents submitted together
are accepted in one transaction, and each gets exactly the answer `submit_document` would give it
alone (replay, mismatch, refusal by a rule or by PostgreSQL) while the rest of its group is accepted.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import asyncpg
import pytest

from lading import accepting, applying, errors, failpoints, intake, reasons
from lading.db import pool as asyncpg_pool
from lading.db import queries, registry
from lading.ids import TenantName
from lading.settings import RollingBatchSettings
from tests.integration.test_admission_rules import seed
from tests.support import factories


def request(key: str, **fields: Any) -> intake.DocumentRequest:
    return intake.DocumentRequest.model_validate({"key": key, "text": f"Invoice {key}", "inferencePoolRef": "cheap",
                                                  **fields})


async def together(
        submitter: intake.GroupSubmitter, items: list[tuple[str, intake.DocumentRequest]]
) -> list[intake.Submission | BaseException]:
    """Submit every (idempotency key, request) at once; the outcomes in order."""
    return list(await asyncio.gather(*(
        submitter.submit(namespace="acme", request=r, idempotency_key=k, request_digest=intake.request_digest(r))
        for k, r in items
    ), return_exceptions=True))  # fmt: skip


async def count(db: asyncpg.Connection, table: str) -> int:
    return int(await db.fetchval(f"SELECT count(*) FROM {table}"))


async def test_one_transaction_answers_each_document_as_if_it_were_alone(
        db: asyncpg.Connection, dbpool: asyncpg.Pool) -> None:  # fmt: skip
    await seed(db, maxQueuedJobs=6)
    submitter = intake.GroupSubmitter(dbpool, settings=intake.GroupSettings(flushers=1))
    earlier = await together(submitter, [("old", request("old")), ("old-2", request("old-2"))])
    assert all(isinstance(e, intake.Submission) for e in earlier)
    groups_before = submitter.groups.applied_groups
    outcomes = await together(submitter, [
        ("a", request("a")),
        ("no-pool", request("b", inferencePoolRef="missing")),
        ("old", request("old")),  # a replay
        ("old-2", request("old-2", text="Invoice changed")),  # same key, other request
        ("c", request("c")),
        ("dup", request("d")),
        ("dup", request("d")),  # the same key again: a later group, answered as a repeat
        ("e", request("e")),
        ("over", request("f")),  # the seventh queued job: over maxQueuedJobs=6
    ])  # fmt: skip
    assert submitter.groups.applied_groups - groups_before == 2  # all at once, then the repeated key
    a, no_pool, old, old_2, c, dup, dup_again, e, over = outcomes
    assert isinstance(a, intake.Submission) and not a.replayed
    assert isinstance(no_pool, applying.AdmissionRejected) and no_pool.reason == reasons.POOL_NOT_FOUND
    assert isinstance(old, intake.Submission) and old.replayed and isinstance(earlier[0], intake.Submission)
    assert old.job_id == earlier[0].job_id
    assert isinstance(old_2, intake.IdempotencyMismatch)
    assert isinstance(dup, intake.Submission) and isinstance(dup_again, intake.Submission)
    assert dup_again.replayed and dup_again.job_id == dup.job_id
    assert isinstance(over, applying.AdmissionRejected) and over.reason == reasons.QUOTA_EXCEEDED
    assert "has 6 queued jobs" in str(over)
    accepted = [a, c, dup, e]
    assert all(isinstance(s, intake.Submission) and not s.replayed for s in accepted)
    assert await count(db, "extraction_jobs") == 2 + 4
    assert await count(db, "job_documents") == 2 + 4
    # The refused documents' keys are free; every accepted one holds its job.
    keys = {r["idempotency_key"]: r["job_id"] for r in await db.fetch("SELECT * FROM document_submissions")}
    assert set(keys) == {"old", "old-2", "a", "c", "dup", "e"}
    ordinals = await db.fetch("SELECT batch_id, array_agg(ordinal ORDER BY ordinal) AS o FROM extraction_jobs "
                              "GROUP BY batch_id")
    assert all(list(r["o"]) == list(range(len(r["o"]))) for r in ordinals)
    totals = await db.fetchval("SELECT bool_and(total_jobs = (SELECT count(*) FROM extraction_jobs j "
                               "WHERE j.batch_id = b.id)) FROM batches b")
    assert totals is True


async def test_a_value_postgresql_refuses_is_refused_alone_and_the_rest_accepted(
        db: asyncpg.Connection, dbpool: asyncpg.Pool) -> None:  # fmt: skip
    await seed(db)
    submitter = intake.GroupSubmitter(dbpool, settings=intake.GroupSettings(flushers=1))
    # Validation refuses a NUL; built without it, the document reaches PostgreSQL, which refuses it.
    unstorable = intake.DocumentRequest.model_construct(key="bad", text="Invoice \x00", inference_pool_ref="cheap")
    outcomes = await together(submitter, [("a", request("a")), ("bad", unstorable), ("b", request("b"))])
    a, bad, b = outcomes
    assert isinstance(a, intake.Submission) and isinstance(b, intake.Submission)
    assert isinstance(bad, applying.InvalidDocument) and "SQLSTATE 22" in str(bad) and "\x00" not in str(bad)
    assert await count(db, "extraction_jobs") == 2
    assert {r["idempotency_key"] for r in await db.fetch("SELECT idempotency_key FROM document_submissions")} == {
        "a", "b"}


async def test_a_group_spreads_over_batches_by_room_and_by_document_key(
        db: asyncpg.Connection, dbpool: asyncpg.Pool) -> None:  # fmt: skip
    await seed(db)
    submitter = intake.GroupSubmitter(
        dbpool, settings=intake.GroupSettings(flushers=1), rolling=RollingBatchSettings(max_documents=3)
    )
    items = [(f"k{i}", request("same" if i < 3 else f"doc-{i}")) for i in range(8)]
    outcomes = await together(submitter, items)
    assert all(isinstance(o, intake.Submission) for o in outcomes), outcomes
    rows = await db.fetch("SELECT batch_id, document_key FROM extraction_jobs")
    assert len(rows) == 8
    batches: dict[int, list[str]] = {}
    for row in rows:
        batches.setdefault(row["batch_id"], []).append(row["document_key"])
    assert all(len(keys) <= 3 and len(set(keys)) == len(keys) for keys in batches.values()), batches
    assert len([keys for keys in batches.values() if "same" in keys]) == 3
    events = await db.fetchval("SELECT count(*) FROM outbox_events WHERE type = 'batch.accepted.v1'")
    assert events == len(batches)


@pytest.mark.parametrize("flushers", [1, 3])
async def test_many_concurrent_callers_each_get_their_own_job_once(
        db: asyncpg.Connection, dbpool: asyncpg.Pool, flushers: int) -> None:  # fmt: skip
    await seed(db)
    submitter = intake.GroupSubmitter(dbpool, settings=intake.GroupSettings(flushers=flushers, max_documents=16))
    items = [(f"k{i % 150}", request(f"doc-{i % 150}")) for i in range(200)]  # 50 keys sent twice
    outcomes = await together(submitter, items)
    assert all(isinstance(o, intake.Submission) for o in outcomes), [o for o in outcomes if isinstance(o, Exception)]
    by_key: dict[str, set[int]] = {}
    for (key, _), outcome in zip(items, outcomes, strict=True):
        assert isinstance(outcome, intake.Submission)
        by_key.setdefault(key, set()).add(outcome.job_id)
    assert all(len(ids) == 1 for ids in by_key.values())
    assert await count(db, "extraction_jobs") == 150
    assert sum(isinstance(o, intake.Submission) and o.replayed for o in outcomes) == 50
    assert submitter.groups.applied_groups < 200  # grouped: fewer transactions than documents
    digest = hashlib.sha256(b"Invoice doc-0").hexdigest()
    assert await db.fetchval("SELECT content_sha256 FROM extraction_jobs WHERE document_key = 'doc-0'") == digest


def answer(submission: intake.Submission) -> tuple[str, dict[str, Any]]:
    return f"/v1/jobs/{submission.job_id}", {"jobId": submission.job_id, "batch": submission.batch_name}


async def posted(
        submitter: intake.GroupSubmitter, items: list[tuple[str, intake.DocumentRequest]]
) -> list[intake.Submission | intake.Recorded | BaseException]:
    """`together` for documents that came in HTTP POSTs, each with its Idempotency-Key record."""
    return list(await asyncio.gather(*(
        submitter.submit_post(namespace="acme", request=r, idempotency_key=k, request_digest=intake.request_digest(r),
                              answer=answer)
        for k, r in items
    ), return_exceptions=True))  # fmt: skip


async def test_a_posts_record_is_claimed_and_answered_in_the_transaction_that_accepts_its_document(
        db: asyncpg.Connection, dbpool: asyncpg.Pool) -> None:  # fmt: skip
    await seed(db, maxQueuedJobs=3)
    submitter = intake.GroupSubmitter(dbpool, settings=intake.GroupSettings(flushers=1))
    queued = await submitter.submit(namespace="acme", request=request("queued"), idempotency_key="queued",
                                    request_digest=intake.request_digest(request("queued")))  # no record
    first = await posted(submitter, [("a", request("a")), ("no-pool", request("b", inferencePoolRef="missing"))])
    a, no_pool = first
    assert isinstance(a, intake.Submission) and not a.replayed
    assert isinstance(no_pool, applying.AdmissionRejected)
    rows = {r["idempotency_key"]: r for r in await db.fetch("SELECT * FROM api_requests")}
    assert set(rows) == {"a"}  # a refusal is not kept
    assert (rows["a"]["status"], rows["a"]["location"]) == (202, f"/v1/jobs/{a.job_id}")
    assert rows["a"]["request_sha256"] == intake.request_digest(request("a"))
    # Together: the record's replay, its mismatch, a document the core knew without a record (a
    # replay, now recorded), a fresh one, and a refusal by the quota (three queued already).
    again = await posted(submitter, [
        ("a", request("a")), ("a-2", request("c")), ("queued", request("queued")), ("no-pool", request("d")),
        ("over", request("e")),
    ])  # fmt: skip
    replayed, fresh_key, known, retried, over = again
    assert isinstance(replayed, intake.Recorded) and replayed.answered.location == f"/v1/jobs/{a.job_id}"
    assert replayed.answered.body == {"jobId": a.job_id, "batch": a.batch_name}
    assert isinstance(known, intake.Submission) and known.replayed and known.job_id == queued.job_id
    assert isinstance(fresh_key, intake.Submission) and isinstance(retried, applying.AdmissionRejected)
    assert retried.reason == reasons.QUOTA_EXCEEDED and isinstance(over, applying.AdmissionRejected)
    assert {r["idempotency_key"] for r in await db.fetch("SELECT idempotency_key FROM api_requests")} == {
        "a", "a-2", "queued"}
    other = await posted(submitter, [("a", request("a", text="Invoice a, changed"))])
    assert isinstance(other[0], intake.Recorded)
    assert other[0].answered.request_sha256 != intake.request_digest(request("a", text="Invoice a, changed"))
    assert await count(db, "extraction_jobs") == 3


@pytest.mark.parametrize("flushers", [1, 3])
async def test_posts_of_one_key_in_concurrent_groups_make_one_job_and_one_record(
        db: asyncpg.Connection, dbpool: asyncpg.Pool, flushers: int) -> None:  # fmt: skip
    await seed(db)
    submitter = intake.GroupSubmitter(
        dbpool, settings=intake.GroupSettings(flushers=flushers, max_documents=8, in_progress_wait_s=5.0)
    )
    # 20 keys sent 5 times each, interleaved, so every group holds several keys other groups in
    # flight hold too (in other orders): claims in one order, never a deadlock.
    items = [(f"k{(i * 7) % 20}", request(f"doc-{(i * 7) % 20}")) for i in range(100)]
    outcomes = await posted(submitter, items)
    assert not [o for o in outcomes if isinstance(o, BaseException)], outcomes
    made: dict[str, int] = {}
    for (key, _), outcome in zip(items, outcomes, strict=True):
        if isinstance(outcome, intake.Submission):
            assert not outcome.replayed and key not in made
            made[key] = outcome.job_id
    assert len(made) == 20
    for (key, _), outcome in zip(items, outcomes, strict=True):
        if isinstance(outcome, intake.Recorded):
            assert outcome.answered.location == f"/v1/jobs/{made[key]}"
    assert await count(db, "extraction_jobs") == 20
    assert await count(db, "api_requests") == 20


async def test_a_lone_documents_transaction_takes_four_round_trips_once_its_group_is_known(
        db: asyncpg.Connection, database_url: str) -> None:  # fmt: skip
    # BEGIN; records, keys, rules and the batch the last document of these fields went to; the
    # append, queue, NOTIFY and answer; COMMIT. More while nothing is known (the batch's pick).
    await seed(db)
    single = await asyncpg_pool.create_pool(database_url, min_size=1, max_size=1)
    sent: list[str] = []
    try:
        async with single.acquire() as conn:
            conn.add_query_logger(lambda logged: sent.append(logged.query))
        submitter = intake.GroupSubmitter(single)
        per_document = []
        for i in range(4):
            before = len(sent)
            outcome = await submitter.submit_post(
                namespace="acme", request=request(f"doc-{i}"), idempotency_key=f"k{i}",
                request_digest=intake.request_digest(request(f"doc-{i}")), answer=answer,
            )  # fmt: skip
            assert isinstance(outcome, intake.Submission) and not outcome.replayed
            # The pool's reset when the connection is handed back is not the transaction's.
            per_document.append([q for q in sent[before:] if "pg_advisory_unlock_all" not in q])
    finally:
        await single.close()
    # The first: nothing known (a pick of its own), it opened the batch (and its outbox event).
    assert any("batch_rolling_pick for the slots" in q for q in per_document[0])
    assert any("Open a rolling batch" in q for q in per_document[0])
    assert [len(statements) for statements in per_document[1:]] == [4, 4, 4], per_document[1:]
    assert [q.strip() for q in per_document[1]][::3] == ["BEGIN;", "COMMIT;"]
    assert await db.fetchval("SELECT count(DISTINCT batch_id) FROM extraction_jobs") == 1
    recorded = await db.fetch("SELECT status, location FROM api_requests ORDER BY idempotency_key")
    assert [r["status"] for r in recorded] == [202] * 4 and all(r["location"] for r in recorded)


async def test_a_wrong_guess_of_a_lone_documents_batch_places_it_by_its_rules(
        db: asyncpg.Connection, dbpool: asyncpg.Pool) -> None:  # fmt: skip
    # The namespace moves to another tenant between two documents: the batch picked for the first
    # one's group (tenant acme) is not used, the second goes to a batch of its own tenant.
    await seed(db)
    submitter = intake.GroupSubmitter(dbpool)
    first = await submitter.submit(namespace="acme", request=request("a"), idempotency_key="a",
                                   request_digest=intake.request_digest(request("a")))
    await registry.revoke_tenant(db, name=TenantName("acme"))
    await registry.upsert_tenant(db, name=TenantName("acme-b"), namespaces=["acme"], weight=1, max_queued_jobs=None,
                                 max_in_flight=None, spec={})
    second = await submitter.submit(namespace="acme", request=request("b"), idempotency_key="b",
                                    request_digest=intake.request_digest(request("b")))
    assert first.batch_name != second.batch_name
    rows = await db.fetch("SELECT j.document_key, j.tenant, b.tenant AS batch_tenant FROM extraction_jobs j "
                          "JOIN batches b ON b.id = j.batch_id ORDER BY j.document_key")
    assert [(r["document_key"], r["tenant"], r["batch_tenant"]) for r in rows] == [
        ("a", "acme", "acme"), ("b", "acme-b", "acme-b")]
    queues = await db.fetch("SELECT tenant FROM tenant_queues ORDER BY tenant")
    assert [r["tenant"] for r in queues] == ["acme", "acme-b"]


async def test_a_group_of_documents_of_one_kind_takes_four_round_trips_once_their_batch_is_known(
        db: asyncpg.Connection, database_url: str) -> None:  # fmt: skip
    # As a lone document's: the claim picks the batch the last documents of these fields went to and
    # reads which of the group's other keys it holds, so neither the pick nor that read is a round
    # trip of its own. The group's second document repeats the key of a document the batch holds
    # (under another idempotency key): it is another job, in another batch.
    await seed(db)
    async with _one_connection(database_url) as one:
        first = await one.post("k0", "doc-0")
        before = len(one.sent)
        outcomes = await asyncio.gather(one.post("k1", "doc-1"), one.post("k2", "doc-0"), one.post("k3", "doc-3"))
        statements = one.statements_since(before)
    groups = one.submitter.groups
    assert (groups.applied_groups, groups.applied_items) == (2, 4), "a lone one, then three"
    assert all(isinstance(o, intake.Submission) for o in (first, *outcomes))
    assert isinstance(first, intake.Submission)
    batch_names = [o.batch_name for o in outcomes if isinstance(o, intake.Submission)]
    assert batch_names[0] == batch_names[2] == first.batch_name != batch_names[1]
    # One transaction (not each document alone after a unique violation), which read no batch's keys
    # on its own: the claim had found the repeated one.
    assert [q.strip() for q in statements].count("BEGIN;") == 1, statements
    assert not any(KEYS_TAKEN in q for q in statements), statements


KEYS_TAKEN = "SELECT document_key FROM extraction_jobs WHERE batch_id = $1"


async def test_a_group_of_new_documents_of_one_kind_takes_four_round_trips(
        db: asyncpg.Connection, database_url: str) -> None:  # fmt: skip
    await seed(db)
    async with _one_connection(database_url) as one:
        await one.post("k0", "doc-0")
        before = len(one.sent)
        outcomes = await asyncio.gather(*(one.post(f"k{i}", f"doc-{i}") for i in range(1, 4)))
        statements = one.statements_since(before)
    groups = one.submitter.groups
    assert (groups.applied_groups, groups.applied_items) == (2, 4), "a lone one, then three"
    assert len({o.batch_name for o in outcomes if isinstance(o, intake.Submission)}) == 1
    assert len(statements) == 4, statements
    assert await db.fetchval("SELECT count(DISTINCT batch_id) FROM extraction_jobs") == 1
    assert await db.fetchval("SELECT count(DISTINCT ordinal) FROM extraction_jobs") == 4


@dataclasses.dataclass
class _OneConnection:
    """A GroupSubmitter with one flusher over a pool of one connection, whose statements are logged."""

    submitter: intake.GroupSubmitter
    sent: list[str]

    async def post(self, idempotency_key: str, key: str) -> intake.Submission | intake.Recorded:
        return await self.submitter.submit_post(
            namespace="acme", request=request(key), idempotency_key=idempotency_key,
            request_digest=intake.request_digest(request(key)), answer=answer,
        )  # fmt: skip

    def statements_since(self, before: int) -> list[str]:
        """The statements sent since `len(sent)` was `before`, without the pool's reset."""
        return [q for q in self.sent[before:] if "pg_advisory_unlock_all" not in q]


@contextlib.asynccontextmanager
async def _one_connection(database_url: str) -> AsyncIterator[_OneConnection]:
    single = await asyncpg_pool.create_pool(database_url, min_size=1, max_size=1)
    sent: list[str] = []
    try:
        async with single.acquire() as conn:
            conn.add_query_logger(lambda logged: sent.append(logged.query))
        yield _OneConnection(intake.GroupSubmitter(single, settings=intake.GroupSettings(flushers=1)), sent)
    finally:
        await single.close()


async def test_documents_waiting_behind_a_group_whose_connection_died_are_accepted_on_another(
        db: asyncpg.Connection, database_url: str) -> None:  # fmt: skip
    # The first document's backend is terminated while two wait: its commit fails, and the two are
    # accepted on a new connection.
    await seed(db)
    single = await asyncpg_pool.create_pool(database_url, min_size=1, max_size=1)
    try:
        async with single.acquire() as conn:
            first_backend = conn.get_server_pid()
        submitter = intake.GroupSubmitter(single, settings=intake.GroupSettings(flushers=1, max_documents=1))

        async def post(i: int) -> intake.Submission | intake.Recorded:
            return await submitter.submit_post(
                namespace="acme", request=request(f"doc-{i}"), idempotency_key=f"k{i}",
                request_digest=intake.request_digest(request(f"doc-{i}")), answer=answer,
            )  # fmt: skip

        with failpoints.enabled("intake.before_commit", "sleep(500)@1"):
            first = asyncio.create_task(post(0))
            async with asyncio.timeout(10):
                while not await db.fetchval("SELECT state = 'idle in transaction' FROM pg_stat_activity "
                                            "WHERE pid = $1", first_backend):
                    pass  # until its append is done: it waits before its commit
            waiting = [asyncio.create_task(post(i)) for i in (1, 2)]
            await db.execute("SELECT pg_terminate_backend($1)", first_backend)
            outcomes = await asyncio.gather(first, *waiting, return_exceptions=True)
    finally:
        await single.close()
    assert not isinstance(outcomes[0], intake.Submission), "its commit never happened"
    assert all(isinstance(o, intake.Submission) for o in outcomes[1:]), outcomes
    assert await count(db, "extraction_jobs") == 2


async def test_the_rolling_batch_pick_looks_a_key_up_in_its_batch_under_any_plan(
        db: asyncpg.Connection, database_url: str) -> None:  # fmt: skip
    # A generic plan made while extraction_jobs was small turned the pick's "is this key in the batch"
    # into one scan of every job with that key: the (batch, key) index walked whole, per group.
    await seed(db)
    await factories.seed(db)
    async with _one_connection(database_url) as one:
        await one.post("k0", "doc-0")
    [group] = await db.fetch("SELECT rolling_group FROM batches WHERE rolling_group IS NOT NULL")
    await db.execute("ALTER TABLE extraction_jobs SET (autovacuum_enabled = false)")
    try:
        await db.execute("ANALYZE extraction_jobs")  # one job: what the generic plan is made on
        await accepting.accept_batch(db, factories.batch_request(count=2000))
        await db.execute(f"PREPARE pick(text[], text) AS {queries.sql('batch_pick_open_rolling')}")
        async with db.transaction():
            await db.execute("SET LOCAL plan_cache_mode = force_generic_plan")
            explain = await db.fetchval("SELECT format('EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE pick(ARRAY[%L], %L)',"
                                        " $1::text, 'doc-0')", group["rolling_group"])
            raw = await db.fetchval(explain)
            await db.execute("DEALLOCATE pick")
    finally:
        await db.execute("ALTER TABLE extraction_jobs RESET (autovacuum_enabled)")
    (top,) = json.loads(raw)
    scans = list(_scans_of(top["Plan"], "extraction_jobs"))
    assert scans, "the pick looks the key up"
    assert all("batch_id" in scan.get("Index Cond", "") for scan in scans), scans


def _scans_of(plan: dict[str, Any], relation: str) -> Iterator[dict[str, Any]]:
    if plan.get("Relation Name") == relation:
        yield plan
    for child in plan.get("Plans", []):
        yield from _scans_of(child, relation)


async def test_document_keys_sent_under_many_keys_at_once_by_many_replicas_never_break_a_batch(
        db: asyncpg.Connection, dbpool: asyncpg.Pool) -> None:  # fmt: skip
    # Replicas of the intake accept lone documents, each of three document keys under a hundred
    # idempotency keys. A batch holds a key once, so batches are closed and opened all the time,
    # and a batch is often locked just after another transaction appended the key to it and
    # committed. Every document is accepted, each in a batch that did not hold its key; the only
    # refusal allowed on the way is the temporary "in progress", which a client retries.
    await seed(db)
    replicas = [intake.GroupSubmitter(dbpool, settings=intake.GroupSettings(flushers=1, max_documents=1),
                                      rolling=RollingBatchSettings(open_batches=2)) for _ in range(6)]

    async def client(i: int) -> intake.Submission | intake.Recorded:
        r = request(f"same-{i % 3}")
        for _ in range(50):
            try:
                return await replicas[i % len(replicas)].submit_post(
                    namespace="acme", request=r, idempotency_key=f"k{i}", request_digest=intake.request_digest(r),
                    answer=answer,
                )  # fmt: skip
            except errors.AcceptanceInProgress:
                continue  # temporary: the client sends it again
        raise AssertionError(f"document {i} was in progress 50 times")

    outcomes = await asyncio.gather(*(client(i) for i in range(300)), return_exceptions=True)
    failed = [o for o in outcomes if not isinstance(o, intake.Submission)]
    assert not failed, failed[:3]
    rows = await db.fetch("SELECT batch_id, document_key FROM extraction_jobs")
    assert len(rows) == 300 and len({(r["batch_id"], r["document_key"]) for r in rows}) == 300
