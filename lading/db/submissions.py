"""
Repository of `document_submissions` (`sql/document_submissions.sql`): the idempotency record of
each single document (`lading.intake`). Its primary key (namespace, idempotency key) decides a
race between concurrent submissions of one key; the row keeps the request digest a repeat is
compared against and the job it became.

A group's acceptance is written mostly here, in as few round trips as its shape allows: its first
statement (`claim_group`: the POSTs' records, the documents' keys and the admission context the
rules are decided on) and its last (`append_and_finish`: the last documents, the tenants' queues,
the claimers woken, refused keys released, the POSTs' answers), so the transaction of a lone
document, or of a group of documents bound for one rolling batch, is BEGIN, `claim_group` (which
also picks and locks that batch), `append_and_finish`, COMMIT.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import asyncpg
import orjson

from lading.db import batches, queries, registry
from lading.ids import BatchId, JobId, PoolName


@dataclasses.dataclass(frozen=True)
class Stored:
    """The submission already holding a (namespace, idempotency key), with its job's batch."""

    request_digest: str
    job_id: JobId
    batch_namespace: str
    batch_name: str


# --- Many at once (`lading.intake.GroupSubmitter`: documents that arrived together, one transaction).


async def get_many(conn: asyncpg.Connection, keys: Sequence[tuple[str, str]]) -> dict[tuple[str, str], Stored]:
    """The submissions holding the (namespace, idempotency key) pairs `keys`, by pair."""
    rows = await conn.fetch(queries.sql("submission_get_many"), [k[0] for k in keys], [k[1] for k in keys])
    return {
        (row["namespace"], row["idempotency_key"]): Stored(
            request_digest=row["request_digest"], job_id=JobId(row["job_id"]),
            batch_namespace=row["batch_namespace"], batch_name=row["batch_name"],
        )
        for row in rows
    }  # fmt: skip


async def keys_taken(conn: asyncpg.Connection, *, batch_id: BatchId, document_keys: Sequence[str]) -> set[str]:
    """Which of `document_keys` rolling batch `batch_id` holds already."""
    rows = await conn.fetch(queries.sql("submission_keys_taken"), batch_id, list(document_keys))
    return {row["document_key"] for row in rows}


@dataclasses.dataclass(frozen=True)
class AppendedDocument:
    """One document of `append_jobs`: its job id, key, hashes and content (text, or URI)."""

    job_id: JobId
    document_key: str
    request_hash: str
    content_sha256: str
    text: str | None
    uri: str | None
    document_bytes: int


@dataclasses.dataclass(frozen=True)
class AppendedJobs:
    """What the documents of one `append_jobs` call share (their rolling batch's columns)."""

    tenant: str
    pool: PoolName
    schema: str
    validation_policy: str
    priority: int
    max_attempts: int
    deadline_s: int


async def append_jobs(
        conn: asyncpg.Connection,
        *,
        batch_id: BatchId,
        shared: AppendedJobs,
        documents: Sequence[AppendedDocument],
) -> None:
    """Append READY jobs and their document rows to rolling batch `batch_id`, which the caller
    holds locked (`batches.pick_open_rolling` and the like), counting them in the batch, in one
    statement (`append_and_finish` with nothing else to finish)."""
    await append_and_finish(conn, Appending(batch_id=batch_id, shared=shared, documents=documents), Finish())


# --- A group's whole acceptance in few round trips (`lading.intake`): its first and last statements.


@dataclasses.dataclass(frozen=True)
class GroupClaim:
    """One document of `claim_group`: its (namespace, idempotency key) and request digest."""

    namespace: str
    idempotency_key: str
    request_digest: str
    recorded: bool
    """An HTTP POST: its Idempotency-Key record (`api_requests`) is claimed first, and the
    document's key only when that record is this transaction's."""


@dataclasses.dataclass(frozen=True)
class GroupClaimed:
    """What `claim_group` took, and the admission context it read."""

    recorded: set[tuple[str, str]]
    """The POSTs' records that are this transaction's now (the others were answered before)."""
    job_ids: dict[tuple[str, str], JobId]
    """The document keys claimed, each with its new job id (the others are taken: repeats)."""
    context: registry.AdmissionContext
    picked: batches.OpenRolling | None = None
    """The open rolling batch picked and locked for `claim_group`'s `pick_key`, if any."""
    picked_holds: frozenset[str] = frozenset()
    """Which of `claim_group`'s `pick_keys` the picked batch holds already."""


async def claim_group(
        conn: asyncpg.Connection,
        claims: Sequence[GroupClaim],
        *,
        namespaces: Sequence[str],
        pools: Sequence[str],
        endpoints: Sequence[str],
        wait_s: float,
        then_wait_s: float,
        pick_slots: Sequence[str] = (),
        pick_key: str | None = None,
        pick_keys: Sequence[str] = (),
) -> GroupClaimed:
    """In one statement: the POSTs' records of `claims` (what `api_requests.claim` does for one),
    then the documents' keys, sorted here by (namespace, key): one lock order; then the admission
    context of `namespaces`, `pools` and `endpoints` (`registry.admission_context`); and, when a key
    was claimed and `pick_slots` are given, an open rolling batch of those slots for document key
    `pick_key`, locked (`batches.pick_open_rolling`), with which of document keys `pick_keys` it
    holds (`keys_taken`, read as the pick's own `key_taken` is: a key a transaction that committed
    while the statement ran appended is found by the batch's unique key at the append, which fails
    the group, whose documents are then accepted one by one). A key another transaction holds is
    waited for up to `wait_s` while records are claimed, then up to `then_wait_s`, which stays the
    transaction's lock timeout (then `asyncpg.LockNotAvailableError`)."""
    ordered = sorted(claims, key=lambda c: (c.namespace, c.idempotency_key))
    row = await conn.fetchrow(
        queries.sql("submission_claim_group"),
        [c.namespace for c in ordered], [c.idempotency_key for c in ordered], [c.request_digest for c in ordered],
        [c.recorded for c in ordered], f"{int(wait_s * 1000)}ms", f"{int(then_wait_s * 1000)}ms",
        list(namespaces), list(pools), list(endpoints), list(pick_slots), pick_key, list(pick_keys),
    )  # fmt: skip
    assert row is not None, "the statement answers one row"
    picked = None
    if row["picked_id"] is not None:
        picked = batches.OpenRolling(
            id=BatchId(row["picked_id"]), namespace=row["picked_namespace"], name=row["picked_name"],
            total_jobs=row["picked_total_jobs"], taking=row["picked_taking"], key_taken=row["picked_key_taken"],
        )  # fmt: skip
    return GroupClaimed(
        picked=picked, picked_holds=frozenset(row["picked_holds"]),
        recorded=set(zip(row["recorded_namespaces"], row["recorded_keys"], strict=True)),
        job_ids={
            (namespace, key): JobId(job_id)
            for namespace, key, job_id in zip(
                row["claimed_namespaces"], row["claimed_keys"], row["claimed_job_ids"], strict=True
            )
        },
        context=registry.context_of(row["context"]),
    )


@dataclasses.dataclass(frozen=True)
class Appending:
    """One `append_jobs` call: documents for rolling batch `batch_id`, which the caller holds locked."""

    batch_id: BatchId
    shared: AppendedJobs
    documents: Sequence[AppendedDocument]


@dataclasses.dataclass(frozen=True)
class Answer:
    """The 202 recorded for a POST's Idempotency-Key (`api_requests.answer_many`'s)."""

    namespace: str
    key: str
    status: int
    location: str
    body: dict[str, Any]
    request_digest: str


@dataclasses.dataclass(frozen=True)
class Finish:
    """What a group's transaction writes last, besides its last documents."""

    queues: Sequence[tuple[PoolName, str]] = ()
    """(pool, tenant) queues to register for fair claiming (`fairness.register_queue`); their
    pools' idle claimers are woken at commit."""
    unclaimed: Sequence[tuple[str, str]] = ()
    """Document keys this transaction claimed for documents it refused: released."""
    released: Sequence[tuple[str, str]] = ()
    """POST records this transaction claimed for documents it did not accept: dropped."""
    answers: Sequence[Answer] = ()
    """POST records this transaction claimed for documents it accepted: their answers."""


async def append_and_finish(conn: asyncpg.Connection, appending: Appending | None, finish: Finish) -> None:
    """`append_jobs(appending)` (when given) and `finish`, in one statement: the last round trip of a
    group's transaction before its commit."""
    documents = appending.documents if appending is not None else ()
    shared = appending.shared if appending is not None else None
    queues = sorted(set(finish.queues))
    await conn.execute(
        queries.sql("submission_jobs_append_finish"), None if appending is None else appending.batch_id,
        [d.job_id for d in documents], [d.document_key for d in documents], [d.request_hash for d in documents],
        [d.content_sha256 for d in documents], [d.text for d in documents], [d.uri for d in documents],
        [d.document_bytes for d in documents], None if shared is None else shared.tenant,
        None if shared is None else shared.pool, None if shared is None else shared.schema,
        None if shared is None else shared.validation_policy, None if shared is None else shared.priority,
        None if shared is None else shared.max_attempts, None if shared is None else float(shared.deadline_s),
        [pool for pool, _ in queues], [tenant for _, tenant in queues],
        [k[0] for k in finish.unclaimed], [k[1] for k in finish.unclaimed],
        [k[0] for k in finish.released], [k[1] for k in finish.released],
        [a.namespace for a in finish.answers], [a.key for a in finish.answers], [a.status for a in finish.answers],
        [a.location for a in finish.answers], [orjson.dumps(a.body).decode() for a in finish.answers],
        sorted({pool for pool, _ in queues}), [a.request_digest for a in finish.answers],
    )  # fmt: skip
