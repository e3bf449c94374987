"""
Durable acceptance of a batch: batch row, job rows, document rows, the tenant's queue counter
row and the batch's `batch.accepted.v1` outbox event, in ONE short transaction; its commit
wakes idle claimers of the pool (NOTIFY).

Idempotent by (tenant, idempotency key), where the key is the batch's identity
(`namespace/name/uid`):

    same key, same canonical hash       -> nothing inserted, the same job ids returned
    same key, different canonical hash  -> IdempotencyConflict, nothing changed  (HTTP 422)
    same key, original still committing -> waits up to lock_timeout_s, then
                                           AcceptanceInProgress                 (HTTP 409)

Concurrent acceptances of the same batch are decided by the unique index on
(tenant, idempotency_key), never by "SELECT then INSERT". The transaction looks the key up
first only to spare a repeated acceptance any writes; a batch committed elsewhere after that
lookup is found by the batch row's insert, which rolls back what this transaction wrote and
answers as a repeat. Rows go in with binary COPY (`lading.db.job_rows`): a 10,000-document
batch is a few round trips, not 10,000. The document rows go first, their texts hashed as the
COPY sends them (the server inserts while the client hashes), then the batch row, whose request
hash needs every document's digest, then the job rows.

A large batch gives its documents by manifest (`BatchRequest.manifest`, a manifest already
read and validated into a local spool by `lading.documents.manifest_lines.spool`, outside any
transaction). Its acceptance is the same one transaction: the spool is COPYed into a
transaction-local staging table, checked as a whole (unique keys), hashed in key order, and
moved into extraction_jobs and job_documents (URI, SHA-256, size; never the text) with one
set-based statement. The batch request hash covers (key, SHA-256 of the document's bytes) exactly
like inline documents' digests, so the same documents hash the same either way, and a
re-admission of the same manifest is idempotent like an inline one.

A value PostgreSQL cannot store (U+0000 in a text, a lone surrogate, a number out of range) is
refused by the spec models before anything gets here (`lading.models.specs`); should one still
reach the COPY or an INSERT, the data error rolls the whole transaction back and becomes
`UnstorableRequest`, a permanent error naming the field: retrying it could never succeed.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import asyncpg

from lading import errors, failpoints, storable
from lading.db import batches, fairness, job_documents, job_rows, jobs, locks, outbox
from lading.documents import manifest_lines
from lading.ids import BatchId, JobId, PoolName, TenantName
from lading.jobs import hashing

PRIORITIES: Mapping[str, int] = {"high": 0, "normal": 1, "low": 2}
"""Priority classes as stored (lower runs first)."""


def idempotency_key(*, namespace: str, name: str, uid: str) -> str:
    """The identity a batch is accepted under, with its tenant: `namespace/name/uid` of its resource.
    The one place the format is written; admission, acceptance and the operator's lookups all use it.
    The uid makes a batch deleted and created again under the same name a new batch."""
    return f"{namespace}/{name}/{uid}"


@dataclasses.dataclass(frozen=True)
class DocumentInput:
    key: str
    text: str


@dataclasses.dataclass(frozen=True)
class BatchRequest:
    """Everything acceptance needs; tenant identity comes from trusted context (the namespace)."""

    tenant: TenantName
    namespace: str
    name: str
    uid: str
    schema: str
    pool: PoolName
    model_policy: Mapping[str, Any]
    """What decides the model's behaviour (provider, model): part of the request hash."""
    validation_policy: str
    priority: str
    deadline_s: int
    documents: Sequence[DocumentInput]
    """Inline documents; empty when `manifest` gives them."""
    endpoint: str | None = None
    suspended: bool = False
    reuse: bool = True
    """ExtractionBatch spec.reuse: jobs may take an earlier accepted result of the tenant (docs/reuse.md)."""
    max_attempts: int = 5
    manifest: manifest_lines.Spooled | None = None
    """A validated manifest on local disk (large batches), instead of inline `documents`."""

    @property
    def document_count(self) -> int:
        return self.manifest.documents if self.manifest is not None else len(self.documents)

    @property
    def idempotency_key(self) -> str:
        return idempotency_key(namespace=self.namespace, name=self.name, uid=self.uid)


class UnstorableRequest(errors.PermanentError):
    """PostgreSQL refused a value of the request (a data error, SQLSTATE class 22 or 54): the
    transaction rolled back, nothing was accepted, and retrying the same request cannot succeed.
    The message names the field (and the document key) when it can be found, and never repeats
    the value."""


@dataclasses.dataclass(frozen=True)
class AcceptResult:
    batch_id: BatchId
    job_ids: tuple[JobId, ...]
    created: bool
    """False when an earlier acceptance of the same request already committed."""


async def accept_batch(
        conn: asyncpg.Connection,
        request: BatchRequest,
        *,
        lock_timeout_s: float = 5.0,
) -> AcceptResult:
    """Accept `request` in one transaction (see the module). Raises AcceptanceInProgress
    (temporary), IdempotencyConflict, ManifestInvalid or UnstorableRequest (permanent)."""
    try:
        return await _accept(conn, request, lock_timeout_s=lock_timeout_s)
    except asyncpg.PostgresError as exc:
        if not storable.is_data_error(exc):
            raise
        raise UnstorableRequest(_unstorable_message(request, exc)) from exc
    except UnicodeEncodeError as exc:  # asyncpg's COPY encodes text itself: a lone surrogate fails here
        raise UnstorableRequest(_unstorable_message(request, exc)) from exc


def _unstorable_message(request: BatchRequest, exc: Exception) -> str:
    key = request.idempotency_key
    where = f"batch {key!r}: " if storable.unstorable_reason(key) is None else ""
    fields: list[tuple[str, object]] = [
        ("metadata.namespace", request.namespace), ("metadata.name", request.name), ("metadata.uid", request.uid),
        ("spec.schema", request.schema), ("spec.inferencePoolRef", request.pool),
        ("spec.validationPolicy", request.validation_policy), ("spec.deliveryEndpointRef", request.endpoint),
        ("model policy", dict(request.model_policy)),
    ]  # fmt: skip
    for field, value in fields:
        if (reason := storable.unstorable_reason(value, where=field)) is not None:
            return f"{where}{reason}; nothing was accepted"
    for index, document in enumerate(request.documents):
        for name, value in (("key", document.key), ("text", document.text)):
            reason = storable.unstorable_reason(value, where=f"spec.documents[{index}].{name}")
            if reason is not None:
                key = f" (document {storable.escaped(document.key)!r})" if name == "text" else ""
                return f"{where}{reason}{key}; nothing was accepted"
    # Nothing found in the request itself (a manifest's spool, or a limit the server enforces):
    # the kind of error, never its text (asyncpg's repeats the value, which may be document data).
    sqlstate = getattr(exc, "sqlstate", None)
    detail = type(exc).__name__ + (f", SQLSTATE {sqlstate}" if isinstance(sqlstate, str) else "")
    return f"{where}PostgreSQL refused a value of the request ({detail}); nothing was accepted"


async def _accept(
        conn: asyncpg.Connection,
        request: BatchRequest,
        *,
        lock_timeout_s: float,
) -> AcceptResult:
    if request.priority not in PRIORITIES:
        raise ValueError(f"unknown priority {request.priority!r}; expected one of {sorted(PRIORITIES)}")
    if request.manifest is not None:
        return await _accept_manifest(conn, request, request.manifest, lock_timeout_s=lock_timeout_s)
    try:
        async with conn.transaction():
            await locks.set_local_lock_timeout(conn, seconds=lock_timeout_s)
            stored = await batches.get_by_key(conn, tenant=request.tenant, idempotency_key=request.idempotency_key)
            if stored is not None:
                # Accepted before: nothing to write, only the request hashes to compare. (A lookup,
                # not the decision: the key's unique index still decides below.) The insert
                # settings are left alone, so a caller's transaction goes on counted by the triggers.
                digests = _HashedTexts(request.documents).digests
                return await _existing(conn, request, _batch_hash(request, digests), stored=stored)
            await jobs.set_local_insert_settings(conn, counted_by_caller=True)
            job_ids = await jobs.allocate_ids(conn, count=len(request.documents))
            # The documents go first: their texts are hashed as the COPY sends them, so the
            # server inserts one chunk of documents while the next chunk's SHA-256s are computed.
            hashed = _HashedTexts(request.documents, lazily=True)
            await job_rows.copy_documents(conn, hashed.records(job_ids))
            batch_hash = _batch_hash(request, hashed.digests)
            inserted = await _insert_batch(conn, request, batch_hash, total_jobs=len(request.documents))
            if inserted is None:
                # Committed by another transaction since the lookup: undo the documents.
                raise _AcceptedMeanwhile(batch_hash)
            batch_id = inserted.id
            await _copy_jobs(conn, request, batch_id, job_ids, hashed.digests, accepted_at=inserted.now)
            await failpoints.ahit("accept.after_bulk_inserts")
            # Every job is READY, so all of them and their documents' bytes join the tenant's queue.
            await jobs.add_queued(conn, tenant=request.tenant, jobs=len(job_ids), document_bytes=hashed.total_bytes)
            await _accepted(conn, request, batch_id, jobs_count=len(job_ids))
            await failpoints.ahit("accept.before_commit")
    except _AcceptedMeanwhile as meanwhile:
        return await _existing(conn, request, meanwhile.batch_hash)
    except asyncpg.LockNotAvailableError:
        raise errors.AcceptanceInProgress(
            f"batch {request.idempotency_key} is being accepted by another transaction; retry shortly"
        ) from None
    return AcceptResult(batch_id=batch_id, job_ids=tuple(job_ids), created=True)


class _AcceptedMeanwhile(Exception):
    """The batch row's insert found the key taken by a transaction that committed after this one
    looked it up: raised to roll back what this one wrote, then the stored batch is compared."""

    def __init__(self, batch_hash: str) -> None:
        super().__init__(batch_hash)
        self.batch_hash = batch_hash


class _HashedTexts:
    """Each inline document's text encoded once, for its SHA-256 (hex, what hashing.content_digest
    computes), its size and its row. Computed at once, or, `lazily`, as `records` hands the
    documents to the COPY (complete once the COPY has consumed them)."""

    def __init__(self, documents: Sequence[DocumentInput], *, lazily: bool = False) -> None:
        self._documents = documents
        self.digests: list[str] = []
        self.total_bytes = 0
        if not lazily:
            for _ in self._encoded():
                pass

    def records(self, job_ids: Sequence[JobId]) -> Iterator[tuple[JobId, bytes]]:
        """(job id, UTF-8 bytes of the text) of each document, hashing it on the way."""
        return zip(job_ids, self._encoded(), strict=True)

    def _encoded(self) -> Iterator[bytes]:
        sha256, digests = hashlib.sha256, self.digests
        for document in self._documents:
            data = document.text.encode()
            digests.append(sha256(data).hexdigest())
            self.total_bytes += len(data)
            yield data


def _batch_hash(request: BatchRequest, digests: Sequence[str]) -> str:
    return hashing.batch_request_hash_of_pairs(
        schema=request.schema,
        model_policy=request.model_policy,
        validation_policy=request.validation_policy,
        documents=zip([d.key for d in request.documents], digests, strict=True),
    )


async def _accept_manifest(
        conn: asyncpg.Connection,
        request: BatchRequest,
        manifest: manifest_lines.Spooled,
        *,
        lock_timeout_s: float,
) -> AcceptResult:
    """The manifest path of accept_batch: same transaction shape, same idempotency, bulk SQL."""
    if request.documents:
        raise ValueError("a batch request has inline documents or a manifest, not both")
    try:
        async with conn.transaction():
            await locks.set_local_lock_timeout(conn, seconds=lock_timeout_s)
            await jobs.set_local_insert_settings(conn, counted_by_caller=False)
            await job_documents.stage_manifest(conn, manifest)
            batch_hash = await _staged_batch_hash(conn, request)
            inserted = await _insert_batch(conn, request, batch_hash, total_jobs=manifest.documents)
            if inserted is None:
                return await _existing(conn, request, batch_hash)
            batch_id = inserted.id
            prefix, suffix = hashing.job_request_template(
                schema=request.schema, model_policy=request.model_policy, validation_policy=request.validation_policy
            )
            job_ids = await job_documents.insert_staged_jobs(
                conn,
                tenant=request.tenant,
                batch_id=batch_id,
                hash_prefix=prefix,
                hash_suffix=suffix,
                pool=request.pool,
                schema=request.schema,
                validation_policy=request.validation_policy,
                priority=PRIORITIES[request.priority],
                max_attempts=request.max_attempts,
                deadline_at=inserted.now + dt.timedelta(seconds=request.deadline_s),
            )
            await failpoints.ahit("accept.after_bulk_inserts")
            await _accepted(conn, request, batch_id, jobs_count=len(job_ids))
            await failpoints.ahit("accept.before_commit")
    except asyncpg.LockNotAvailableError:
        raise errors.AcceptanceInProgress(
            f"batch {request.idempotency_key} is being accepted by another transaction; retry shortly"
        ) from None
    return AcceptResult(batch_id=batch_id, job_ids=job_ids, created=True)


async def _staged_batch_hash(conn: asyncpg.Connection, request: BatchRequest) -> str:
    """The batch request hash of the staged manifest, its (key, sha256) pairs streamed in key order.
    The same pass checks that every key is unique: a key listed twice arrives twice in a row, which
    the hasher refuses; only then is the staging table searched for the lines to name (so a valid
    manifest is not sorted by key a second time for the check)."""
    hasher = hashing.BatchRequestHasher(
        schema=request.schema, model_policy=request.model_policy, validation_policy=request.validation_policy
    )
    try:
        async for pairs in job_documents.staged_pair_chunks(conn):
            hasher.add_many(pairs)
    except ValueError:
        duplicate = await job_documents.staged_duplicate_key(conn)
        if duplicate is None:
            raise
        raise manifest_lines.ManifestInvalid(
            f"manifest line {duplicate.line}: key: {duplicate.key!r} is already listed on line "
            f"{duplicate.first_line}; keys must be unique in a manifest",
            line=duplicate.line,
            field="key",
        ) from None
    return hasher.hexdigest()


async def _insert_batch(
        conn: asyncpg.Connection,
        request: BatchRequest,
        batch_hash: str,
        *,
        total_jobs: int,
) -> batches.Inserted | None:
    """The batch row, or None when the idempotency key is taken (ON CONFLICT DO NOTHING)."""
    return await batches.insert(conn, batches.NewBatch(
        tenant=request.tenant, namespace=request.namespace, name=request.name, uid=request.uid,
        idempotency_key=request.idempotency_key, request_hash=batch_hash, hash_version=hashing.HASH_VERSION,
        schema=request.schema, pool=request.pool, validation_policy=request.validation_policy,
        priority=PRIORITIES[request.priority], deadline_s=request.deadline_s, endpoint=request.endpoint,
        suspended=request.suspended, total_jobs=total_jobs, reuse=request.reuse,
    ))  # fmt: skip


async def _accepted(conn: asyncpg.Connection, request: BatchRequest, batch_id: BatchId, *, jobs_count: int) -> None:
    """After the job rows are in, in the accepting transaction: the batch's `batch.accepted.v1` event,
    its tenant's queue in the pool for fair claiming, for a batch accepted suspended the mark that keeps
    its jobs out of the claim index (docs/fairness.md), and a wake-up for the pool's idle claimers. All
    take effect at commit."""
    await outbox.insert_batch_accepted(conn, batch_id=batch_id, payload={
        "batch_id": batch_id,
        "tenant": request.tenant,
        "batch": {"namespace": request.namespace, "name": request.name},
        "pool": request.pool,
        "jobs": jobs_count,
    })  # fmt: skip
    await fairness.register_queue(conn, pool=request.pool, tenant=request.tenant)
    if request.suspended:
        await jobs.hold_batch(conn, batch_id=batch_id)
    await jobs.notify_available(conn, pool=request.pool)


async def _existing(
        conn: asyncpg.Connection, request: BatchRequest, batch_hash: str, *, stored: batches.Stored | None = None
) -> AcceptResult:
    """The stored batch of the request's key (looked up unless given), if its hash is `batch_hash`."""
    if stored is None:
        stored = await batches.get_by_key(conn, tenant=request.tenant, idempotency_key=request.idempotency_key)
    assert stored is not None, "ON CONFLICT DO NOTHING returned nothing, so the row exists"
    if stored.request_hash != batch_hash:
        raise errors.IdempotencyConflict(
            key=request.idempotency_key, stored_hash=stored.request_hash, new_hash=batch_hash
        )
    return AcceptResult(
        batch_id=stored.id, job_ids=await jobs.ids_of_batch(conn, batch_id=stored.id), created=False
    )


async def _copy_jobs(
        conn: asyncpg.Connection,
        request: BatchRequest,
        batch_id: BatchId,
        job_ids: Sequence[JobId],
        digests: Sequence[str],
        *,
        accepted_at: dt.datetime,
) -> None:
    shared = job_rows.SharedJobValues(
        tenant=request.tenant, batch_id=batch_id, pool=request.pool, schema=request.schema,
        validation_policy=request.validation_policy, priority=PRIORITIES[request.priority],
        max_attempts=request.max_attempts, deadline_at=accepted_at + dt.timedelta(seconds=request.deadline_s),
    )  # fmt: skip
    prefix, suffix = hashing.job_request_template(
        schema=request.schema, model_policy=request.model_policy, validation_policy=request.validation_policy
    )
    # The job request hash of each digest, spliced as hashing.job_request_hasher does (one
    # SHA-256 per job), hex in bytes as the row takes it. A generator, not a list: the COPY sends
    # its rows in chunks as they are made, so the server inserts one chunk while the next is hashed.
    prefix, suffix, sha256 = prefix + b'"', b'"' + suffix, hashlib.sha256
    rows = (
        (job_id, ordinal, document.key, sha256(prefix + digest + suffix).hexdigest().encode(), digest)
        for ordinal, (job_id, document, digest) in enumerate(
            zip(job_ids, request.documents, (d.encode() for d in digests), strict=True)
        )
    )  # fmt: skip
    await job_rows.copy_jobs(conn, shared, rows)
