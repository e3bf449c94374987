"""
Single documents: the acceptance path of a document sent alone (the HTTP API's
`POST /v1/namespaces/{ns}/documents`, the queue intake's `document.submitted.v1`).

    submit_document(db, namespace=NS, document=..., idempotency_key=K, request_digest=D)
      1. the fields (`DocumentRequest`: an inline document's or a manifest line's rules)
                                                   -> applying.InvalidDocument, every field error
      2. ONE transaction, four round trips for a lone document (BEGIN and COMMIT included;
         one more when the batch it picked cannot take it, `_submit_group`):
         claim (NS, K) in document_submissions     taken: same D -> the same job, replayed
         (and the admission context, read in              other D -> IdempotencyMismatch
         the same statement)                              still committing -> AcceptanceInProgress
         the tenant's quota (applying.check_documents on that context) -> applying.AdmissionRejected
         the group's open rolling batch, locked    opened when none is open, it is full, it is
                                                   past its time or holds the document's key
         the job and its document appended, the tenant's queue registered, claimers woken
         at commit (NOTIFY), in one statement; a new batch's `batch.accepted.v1` outbox event

A refusal rolls the whole transaction back: nothing is half-applied, and the key stays free.

**Rolling batches.** Documents sent one by one are grouped into ordinary batch rows, so status,
fairness, quotas, cancellation and delivery work as for any batch, without one batch per
request. Documents share a batch when they share tenant, namespace, pool, delivery endpoint,
priority, deadline, schema and validation policy (the batch row's columns). A group has up to
`RollingBatchSettings.open_batches` open batches, one per slot (a unique index decides concurrent
openers of a slot); a batch takes documents until it holds `max_documents` or `open_s` has passed
since it opened. A document appends to an open batch no other transaction holds (SKIP LOCKED),
else opens one in a free slot, else waits for its key's slot: a batch's row is held from the
append to the commit, so concurrent documents spread over the slots instead of queuing on one
row. A document key repeated under another idempotency key is another job: it goes to another
batch, as keys are unique within a batch.

Tenant identity is the `namespace` argument, which callers take from trusted context (the
token's namespace, the broker's permissions), never from the document.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import hashlib
import logging
import re
import typing
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import asyncpg
import orjson
import pydantic

from lading import accepting, applying, errors, failpoints, grouping, storable
from lading.db import api_requests, batches, outbox, registry, submissions
from lading.documents import manifest_lines
from lading.ids import BatchId, JobId, PoolName, TenantName
from lading.jobs import hashing
from lading.models import specs
from lading.settings import RollingBatchSettings

logger = logging.getLogger(__name__)

IDEMPOTENCY_KEY_MAX = 255
"""Characters of an idempotency key: room for a UUID, a content hash or an ERP document number."""
REQUEST_DIGEST_MAX = 128
"""Characters of a request digest (a hex SHA-512 fits)."""
POOL_REF_PATTERN = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?/)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
"""`name` (an InferencePool of the document's namespace) or `namespace/name`."""
DIGEST_VERSION = "v1"
"""Version of what `request_digest` covers (the HTTP API's canonical request version)."""
SCHEMA = "invoice.v1"
"""Extraction schema of single documents (the one schema there is)."""
_OPEN_ATTEMPTS = 4
"""Rounds of "lock the open batch, else open one" before giving up as in progress: each lost
round means another transaction opened the group's batch, which the next round then finds."""
_KEY_RACE_TRIES = 4
"""Transactions a group is tried in while it loses a race for a document key to another's
commit (`_submit_group`), before its documents are answered as in progress."""
BATCH_KEY_CONSTRAINT = "extraction_jobs_batch_id_document_key_key"
"""The unique (batch, document key) of extraction_jobs: a batch holds a document key once."""


@dataclasses.dataclass(frozen=True)
class SubmittedDocument:
    """One document as a client sent it, field by field; `submit_document` validates it."""

    key: str
    text: str | None
    uri: str | None
    sha256: str | None
    bytes: int | None
    inference_pool_ref: str
    """`name` of an InferencePool in the document's namespace, or `namespace/name`."""
    delivery_endpoint_ref: str | None
    """`name` of a DeliveryEndpoint in the document's namespace; None: results are only stored."""
    priority: str | None
    """high, normal or low; None: normal."""
    deadline_seconds: int | None
    """Seconds after acceptance by which the document must be done; None: the batch default."""


@dataclasses.dataclass(frozen=True)
class Submission:
    job_id: JobId
    batch_namespace: str
    batch_name: str
    replayed: bool
    """True when an earlier submission with the same key and digest made this job."""


class IdempotencyMismatch(errors.PermanentError):
    """The idempotency key was used before, in this namespace, for another request (digest)."""

    def __init__(self, *, namespace: str, idempotency_key: str) -> None:
        super().__init__(
            f"idempotency key {storable.escaped(idempotency_key)!r} was already used in namespace {namespace} for "
            "a different request; nothing was changed"
        )
        self.namespace = namespace
        self.idempotency_key = idempotency_key


class DocumentRequest(specs._Spec):
    """The fields of a single document, with the rules an inline document (`key`, `text`) or a
    manifest line (`uri`, `sha256`, `bytes`) has; camelCase names, as clients send them."""

    key: str = pydantic.Field(min_length=1, max_length=manifest_lines.KEY_MAX, pattern=specs.DOCUMENT_KEY_PATTERN)
    text: str | None = pydantic.Field(
        default=None, min_length=1, max_length=specs.INLINE_TEXT_MAX_BYTES, pattern=specs.STORABLE_TEXT_PATTERN
    )
    uri: str | None = pydantic.Field(
        default=None, min_length=8, max_length=manifest_lines.URI_MAX, pattern=specs.MANIFEST_URI_PATTERN
    )
    sha256: str | None = pydantic.Field(default=None, pattern=manifest_lines.SHA256_PATTERN.pattern)
    bytes: int | None = pydantic.Field(default=None, gt=0, le=manifest_lines.DOCUMENT_MAX_BYTES)
    inference_pool_ref: str = pydantic.Field(min_length=1, max_length=317, pattern=POOL_REF_PATTERN)
    delivery_endpoint_ref: str | None = pydantic.Field(
        default=None, min_length=1, max_length=253, pattern=specs.DNS_SUBDOMAIN_PATTERN
    )
    priority: specs.Priority = "normal"
    deadline_seconds: int = pydantic.Field(default=specs.DEADLINE_S_DEFAULT, ge=60, le=specs.DEADLINE_S_MAX)

    @pydantic.field_validator("key")
    @classmethod
    def _key_segments(cls, value: str) -> str:
        return specs._check_document_key(value)

    @pydantic.field_validator("text")
    @classmethod
    def _text_size(cls, value: str | None) -> str | None:
        return None if value is None else specs._check_text_size(value)

    @pydantic.field_validator("uri")
    @classmethod
    def _uri(cls, value: str | None) -> str | None:
        return None if value is None else specs._check_manifest_uri(value)

    @pydantic.model_validator(mode="after")
    def _one_source(self) -> DocumentRequest:
        by_reference = (self.uri, self.sha256, self.bytes)
        if self.text is not None and any(v is not None for v in by_reference):
            raise ValueError("give either text, or uri with sha256 and bytes, not both")
        if self.text is None and any(v is None for v in by_reference):
            missing = [name for name, v in zip(("uri", "sha256", "bytes"), by_reference, strict=True) if v is None]
            raise ValueError(
                "text is required" if len(missing) == 3 else f"a document by reference needs {', '.join(missing)}"
            )
        return self

    @property
    def document_bytes(self) -> int:
        return len(self.text.encode("utf-8")) if self.text is not None else (self.bytes or 0)

    @property
    def content_sha256(self) -> str:
        return hashing.content_digest(self.text) if self.text is not None else str(self.sha256)

    def pool_name(self, *, namespace: str) -> PoolName:
        pool_namespace, _, name = self.inference_pool_ref.rpartition("/")
        return applying.pool_key(pool_namespace or namespace, name)


def validated(
        document: SubmittedDocument,
        *,
        namespace: str,
        idempotency_key: str,
) -> DocumentRequest:
    """The document's fields checked all at once; InvalidDocument lists every field error (never
    a value: a text may be personal data)."""
    problems: list[applying.FieldError] = []
    if (reason := _key_problem(idempotency_key)) is not None:
        problems.append(applying.FieldError("idempotencyKey", reason))
    if (reason := _namespace_problem(namespace)) is not None:
        problems.append(applying.FieldError("namespace", reason))
    fields: Mapping[str, Any] = {
        "key": document.key, "text": document.text, "uri": document.uri, "sha256": document.sha256,
        "bytes": document.bytes, "inferencePoolRef": document.inference_pool_ref,
        "deliveryEndpointRef": document.delivery_endpoint_ref,
    }  # fmt: skip
    given = {name: value for name, value in fields.items() if value is not None}
    if document.priority is not None:
        given["priority"] = document.priority
    if document.deadline_seconds is not None:
        given["deadlineSeconds"] = document.deadline_seconds
    request: DocumentRequest | None = None
    try:
        request = DocumentRequest.model_validate(given)
    except pydantic.ValidationError as exc:
        problems.extend(_field_error(e) for e in exc.errors(include_input=False, include_url=False))
    if problems or request is None:
        raise applying.InvalidDocument(problems)
    return request


def _namespace_problem(namespace: object) -> str | None:
    if not isinstance(namespace, str) or len(namespace) > 63 or not re.match(specs.DNS_LABEL_PATTERN, namespace):
        return f"must be {specs.PATTERN_HINTS[specs.DNS_LABEL_PATTERN]}"
    return None


def _key_problem(idempotency_key: object) -> str | None:
    if not isinstance(idempotency_key, str) or not idempotency_key:
        return "is required"
    if len(idempotency_key) > IDEMPOTENCY_KEY_MAX:
        return f"must be at most {IDEMPOTENCY_KEY_MAX} characters"
    if (reason := storable.unstorable_reason(idempotency_key, where="")) is not None:
        return reason.removeprefix(": ")
    return None if idempotency_key.isprintable() else "must be printable text (no control characters)"


def _field_error(error: Mapping[str, Any]) -> applying.FieldError:
    loc = [str(part) for part in error.get("loc") or ()]
    field = loc[0] if loc else "document"
    kind = error["type"]
    ctx = error.get("ctx") or {}
    pattern_hints = {**specs.PATTERN_HINTS, POOL_REF_PATTERN: "'name' or 'namespace/name' of an InferencePool",
                     manifest_lines.SHA256_PATTERN.pattern: "64 lowercase hex characters"}
    if kind in ("value_error", "assertion_error") and "error" in ctx:
        message = str(ctx["error"])
    elif kind == "missing":
        message = "is required"
    elif kind == "extra_forbidden":
        message = "unknown field"
    elif kind == "string_pattern_mismatch" and ctx.get("pattern") in pattern_hints:
        message = f"must be {pattern_hints[ctx['pattern']]}"
    else:
        message = str(error["msg"])
    return applying.FieldError(field, message.removeprefix(": "))


async def submit_document(
        db: asyncpg.Pool,
        *,
        namespace: str,
        document: SubmittedDocument,
        idempotency_key: str,
        request_digest: str,
        settings: RollingBatchSettings | None = None,
) -> Submission:
    """Accept one document of `namespace` (trusted context) in one transaction (see the module).

    Raises applying.InvalidDocument (every field error) or another applying.AdmissionRejected
    (reason and field named), IdempotencyMismatch (same key, other digest), all permanent;
    errors.AcceptanceInProgress when the same key is being accepted right now (temporary);
    asyncpg/OSError errors when the database is unreachable (temporary: retry unchanged)."""
    request = validated(document, namespace=namespace, idempotency_key=idempotency_key)
    async with db.acquire() as conn:
        return await submit_validated(
            conn, namespace=namespace, request=request, idempotency_key=idempotency_key,
            request_digest=request_digest, settings=settings,
        )  # fmt: skip


async def submit_validated(
        conn: asyncpg.Connection,
        *,
        namespace: str,
        request: DocumentRequest,
        idempotency_key: str,
        request_digest: str,
        settings: RollingBatchSettings | None = None,
) -> Submission:
    """`submit_document` for a request `validated` already, on `conn`: inside a transaction of the
    caller (the queue intake records its inbox row in it) the acceptance is a savepoint, and a
    refusal rolls back the caller's transaction too once it propagates. Raises like
    `submit_document`."""
    if not request_digest or len(request_digest) > REQUEST_DIGEST_MAX or storable.unstorable_reason(request_digest):
        raise ValueError(f"request_digest must be 1 to {REQUEST_DIGEST_MAX} storable characters")
    rolling = settings or RollingBatchSettings()
    try:
        return await _submit(
            conn, namespace=namespace, request=request, idempotency_key=idempotency_key,
            request_digest=request_digest, settings=rolling,
        )  # fmt: skip
    except asyncpg.PostgresError as exc:
        raise _refusal(exc, namespace=namespace, idempotency_key=idempotency_key) from None


def _refusal(exc: asyncpg.PostgresError, *, namespace: str, idempotency_key: str) -> Exception:
    """What a submission that failed with `exc` raises: AcceptanceInProgress for a lock wait that
    timed out, InvalidDocument for a value PostgreSQL refused, `exc` itself otherwise."""
    if isinstance(exc, asyncpg.LockNotAvailableError):
        return errors.AcceptanceInProgress(
            f"idempotency key {storable.escaped(idempotency_key)!r} of namespace {namespace} is being accepted "
            "by another transaction; retry shortly"
        )
    if not storable.is_data_error(exc):
        return typing.cast(Exception, exc)
    # Validation should have refused it; the kind of error, never its text (it may quote the document).
    return applying.InvalidDocument([applying.FieldError(
        "document", f"PostgreSQL refused a value of the request ({type(exc).__name__}, SQLSTATE "
        f"{exc.sqlstate}); nothing was accepted",
    )])  # fmt: skip


def request_digest(request: DocumentRequest) -> str:
    """The canonical digest of a document request: its validated fields with defaults filled, keys
    sorted, so field order, whitespace and an omitted default never make two requests differ.
    The HTTP API's digest of `POST .../documents` is the same, so a document sent once over HTTP
    and once over the queue under one idempotency key is the same request."""
    canonical = request.model_dump(mode="json", by_alias=True)
    data = orjson.dumps([DIGEST_VERSION, "documents", canonical], option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(data).hexdigest()


async def _submit(
        conn: asyncpg.Connection,
        *,
        namespace: str,
        request: DocumentRequest,
        idempotency_key: str,
        request_digest: str,
        settings: RollingBatchSettings,
) -> Submission:
    """One document, as a group of one (`_submit_group`): the same statements and answers."""
    (outcome,) = await _submit_group(
        conn, [_Pending(namespace, request, idempotency_key, request_digest)], settings=settings,
        waits=GroupSettings(),
    )  # fmt: skip
    if isinstance(outcome, Exception):
        raise outcome
    assert isinstance(outcome, Submission), "only a POST has a record to replay"
    return outcome


@dataclasses.dataclass(frozen=True)
class _Group:
    """What a rolling batch's documents share (the batch row's columns); `new_row` is the row of a
    batch to open for them, built only when one is opened (most documents join an open one)."""

    namespace: str
    tenant: TenantName
    pool: PoolName
    endpoint: str | None
    priority: int
    deadline_s: int
    group: str
    """The shared columns as one text (`_group_key`): the rolling group, its slots' prefix."""
    model_policy: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    validation_policy: str = specs.VALIDATION_POLICY_DEFAULT

    def new_row(self) -> batches.NewBatch:
        """A batch row of this group under a new name and uid (each batch opened has its own)."""
        name = f"documents-{uuid.uuid4().hex[:12]}"
        uid = str(uuid.uuid4())
        return batches.NewBatch(
            tenant=self.tenant, namespace=self.namespace, name=name, uid=uid,
            idempotency_key=accepting.idempotency_key(namespace=self.namespace, name=name, uid=uid),
            # A rolling batch is never re-accepted by key: its hash names the group (its documents grow).
            request_hash=hashing.batch_request_hash(
                schema=SCHEMA, model_policy=self.model_policy, validation_policy=self.validation_policy,
                documents=[("group", self.group)],
            ),
            hash_version=hashing.HASH_VERSION, schema=SCHEMA, pool=self.pool, validation_policy=self.validation_policy,
            priority=self.priority, deadline_s=self.deadline_s, endpoint=self.endpoint, suspended=False, total_jobs=0,
        )  # fmt: skip

    def job_request_hash(self) -> Callable[[str], str]:
        """The job request hash of this group's documents, by content digest."""
        return _job_request_hasher(self.pool, self.model_policy["provider"], self.model_policy["model"],
                                   self.validation_policy)


def _rolling_batch(
        *,
        namespace: str,
        tenant: TenantName,
        pool: registry.Pool,
        endpoint: str | None,
        request: DocumentRequest,
) -> _Group:
    return _Group(
        namespace=namespace, tenant=tenant, pool=pool.name, endpoint=endpoint,
        priority=accepting.PRIORITIES[request.priority], deadline_s=request.deadline_seconds,
        group=_group_key(tenant, namespace, pool.name, endpoint, request.priority, request.deadline_seconds),
        model_policy={"pool": pool.name, "provider": pool.provider, "model": pool.model},
    )  # fmt: skip


@functools.lru_cache(maxsize=4096)
def _group_key(tenant: TenantName, namespace: str, pool: PoolName, endpoint: str | None, priority: str,
               deadline_seconds: int) -> str:
    """What a rolling batch's documents share, as one text (the batch row's columns). Kept per
    combination: a document's group is computed for every document, from a handful of values."""
    shared = [tenant, namespace, pool, endpoint, priority, deadline_seconds, SCHEMA, specs.VALIDATION_POLICY_DEFAULT]
    return hashing.canonical_json(shared).decode()


@functools.lru_cache(maxsize=1024)
def _job_request_hasher(pool: PoolName, provider: str, model: str | None,
                        validation_policy: str) -> Callable[[str], str]:
    """`hashing.job_request_hasher` of a pool's documents, made once per pool (its template is JSON
    serialised once, not once per transaction)."""
    return hashing.job_request_hasher(
        schema=SCHEMA, model_policy={"pool": pool, "provider": provider, "model": model},
        validation_policy=validation_policy,
    )  # fmt: skip


def _slots(group: str, settings: RollingBatchSettings) -> list[str]:
    """The rolling groups of `group`'s slots (one open batch each)."""
    return [f"{group}#{slot}" for slot in range(settings.open_batches)]


async def _open_batch_for(
        conn: asyncpg.Connection,
        batch: _Group,
        *,
        key: str,
        settings: RollingBatchSettings,
        first_pick: tuple[batches.OpenRolling | None] | None = None,
) -> tuple[BatchId, str, bool, int]:
    """An open batch of the group that takes document `key`, locked: (id, name, opened by us, the
    documents it holds).

    In order: an open batch no one else holds (closing on the way any that is full, past its time
    or holds the key); else a new batch in a slot with none open; else, every slot's batch being
    held, a wait for the one of the key's slot. Only a holder of a closed batch ever waits, and
    only for a batch whose holder waits for none: no cycle. `first_pick`: the answer of a pick this
    transaction made for the group and `key` already (`submissions.claim_group`), used as the first."""
    slots = _slots(batch.group, settings)
    row: batches.NewBatch | None = None
    mine = slots[int(hashlib.sha256(key.encode("utf-8", "replace")).hexdigest(), 16) % len(slots)]
    for _ in range(_OPEN_ATTEMPTS):
        while True:
            if first_pick is not None:
                (free,), first_pick = first_pick, None
            else:
                free = await batches.pick_open_rolling(conn, groups=slots, document_key=key)
            if free is None:
                break
            if _takes(free, settings):
                return free.id, free.name, False, free.total_jobs
            await batches.close_rolling(conn, batch_id=free.id)
        row = row or batch.new_row()
        for slot in slots:
            opened = await batches.open_rolling(conn, row, group=slot, open_s=settings.open_s)
            if opened is not None:
                return opened, row.name, True, 0
        held = await batches.lock_open_rolling(conn, group=mine, document_key=key)
        if held is not None:
            if _takes(held, settings):
                return held.id, held.name, False, held.total_jobs
            await batches.close_rolling(conn, batch_id=held.id)
    raise errors.AcceptanceInProgress(
        f"the rolling batch of namespace {batch.namespace} is being opened by other transactions; retry shortly"
    )


def _takes(batch: batches.OpenRolling, settings: RollingBatchSettings) -> bool:
    return batch.taking and not batch.key_taken and batch.total_jobs < settings.max_documents


# --- Group commit: documents that arrive together are accepted in one transaction.


@dataclasses.dataclass(frozen=True)
class GroupSettings:
    """How `GroupSubmitter` groups concurrent documents (docs/api.md, "Throughput")."""

    max_documents: int = 256
    """Most documents one transaction accepts."""
    flushers: int = 2
    """Transactions in flight at once: while one waits for its commit's WAL flush, the next group
    is being written, so a document never waits for more than the group before it."""
    in_progress_wait_s: float = 0.2
    """How long a POST's Idempotency-Key claim waits for another transaction holding the key
    before the POST is answered as in progress (`lading_api.settings.ApiSettings`, same name)."""

    def __post_init__(self) -> None:
        if self.max_documents < 1 or self.flushers < 1:
            raise ValueError(f"a group needs room for a document and a flusher, got max_documents="
                             f"{self.max_documents}, flushers={self.flushers}")
        if self.in_progress_wait_s <= 0:
            raise ValueError(f"in-progress wait must be positive, got {self.in_progress_wait_s}")


AnswerOf = Callable[[Submission], tuple[str, dict[str, Any]]]
"""The Location and body of the 202 an HTTP POST gets for its document's submission."""


@dataclasses.dataclass(frozen=True)
class Recorded:
    """A POST whose Idempotency-Key was answered before (`lading.db.api_requests`): the stored
    answer, which the caller replays, or refuses when `answered.request_sha256` is not its digest.
    Nothing was accepted."""

    answered: api_requests.Answered


@dataclasses.dataclass(frozen=True)
class _Pending:
    namespace: str
    request: DocumentRequest
    idempotency_key: str
    request_digest: str
    answer: AnswerOf | None = None
    """For an HTTP POST: its answer, recorded under its Idempotency-Key in the same transaction."""

    @property
    def identity(self) -> tuple[str, str]:
        return (self.namespace, self.idempotency_key)


class GroupSubmitter:
    """`submit_validated` for many concurrent callers, with group commit (`lading.grouping`):
    documents that arrive while a transaction is being written or committed are accepted together
    in the next one, with set-based statements, and each caller is answered only after the commit
    that holds its document. Nothing waits on a timer: an idle submitter starts a document's
    transaction at once, and a group grows only with the documents that arrived during the one
    before (up to `GroupSettings.max_documents`, `flushers` transactions in flight).

    The answers are exactly `submit_document`'s, per document: a replay, IdempotencyMismatch,
    AdmissionRejected or InvalidDocument for that document alone while the rest of its group is
    accepted. Documents of one (namespace, idempotency key) never share a transaction: the later
    one goes into a later group and is answered as a repeat. When a group's transaction fails (a
    value PostgreSQL refuses, a lock wait that timed out, a deadlock), each of its documents is
    accepted again alone, so one bad document is refused on its own; when the database is
    unreachable every document of the group gets that error (temporary: retry unchanged).

    `submit_post` does the same for a document an HTTP POST sent, and keeps the POST's
    Idempotency-Key record (`lading.db.api_requests`) in the very transaction that accepts the
    document: claimed first (keys in one order, so concurrent groups never wait in a cycle; a key
    another transaction holds is waited for `in_progress_wait_s`, then the POST is in progress),
    released when the document is refused, answered before the commit. A POST waits for one
    commit, and a crash leaves both the document and its record, or neither."""

    def __init__(
            self,
            db: asyncpg.Pool,
            *,
            settings: GroupSettings | None = None,
            rolling: RollingBatchSettings | None = None,
    ) -> None:
        self.db = db
        self.settings = settings or GroupSettings()
        self.rolling = rolling or RollingBatchSettings()
        self.hints = _GroupHints()
        self._releases: set[asyncio.Task[None]] = set()
        """Connections being handed back to the pool (`_release_later`)."""
        self.groups: grouping.Groups[_Pending, Submission | Recorded] = grouping.Groups(
            self._apply, identity=lambda pending: pending.identity, max_items=self.settings.max_documents,
            concurrency=self.settings.flushers,
        )  # fmt: skip

    async def submit(
            self,
            *,
            namespace: str,
            request: DocumentRequest,
            idempotency_key: str,
            request_digest: str,
    ) -> Submission:
        """Accept one document `validated` already (namespace from trusted context); raises like
        `submit_document`. Cancelling the caller does not cancel the document's transaction."""
        outcome = await self.groups.run(_checked(_Pending(namespace, request, idempotency_key, request_digest)))
        assert isinstance(outcome, Submission), "only a POST has a record to replay"
        return outcome

    async def submit_post(
            self,
            *,
            namespace: str,
            request: DocumentRequest,
            idempotency_key: str,
            request_digest: str,
            answer: AnswerOf,
    ) -> Submission | Recorded:
        """`submit` for a document an HTTP POST sent, with its Idempotency-Key record: Recorded when
        the key was answered before (nothing accepted); else the Submission, whose `answer` is
        recorded in the transaction that accepted it. Raises like `submit`; AcceptanceInProgress
        also when another transaction held the key for longer than `in_progress_wait_s`."""
        return await self.groups.run(
            _checked(_Pending(namespace, request, idempotency_key, request_digest, answer=answer))
        )

    async def _apply(self, group: Sequence[_Pending]) -> list[Submission | Recorded | Exception]:
        conn = await self.db.acquire()
        try:
            if len(group) == 1:
                return [await self._alone(conn, group[0])]
            try:
                return await _submit_group(conn, group, settings=self.rolling, waits=self.settings, hints=self.hints)
            except (asyncpg.PostgresError, errors.AcceptanceInProgress) as exc:
                if isinstance(exc, asyncpg.PostgresConnectionError):
                    raise
                logger.info("a group of %d documents failed (%s); accepting each alone", len(group),
                            type(exc).__name__)
            return [await self._alone(conn, pending) for pending in group]
        finally:
            self._release_later(conn)

    def _release_later(self, conn: asyncpg.Connection) -> None:
        """Hand `conn` back to the pool without the group's callers waiting for it: a pool that
        resets the connections it gets back (asyncpg's default) spends a round trip on it, and the
        answers need nothing more from the connection."""
        release = asyncio.create_task(self.db.release(conn))
        self._releases.add(release)
        release.add_done_callback(self._released)

    def _released(self, release: asyncio.Task[None]) -> None:
        self._releases.discard(release)
        if not release.cancelled() and (exc := release.exception()) is not None:
            # The pool terminated the connection (it opens another when needed); nothing was lost.
            logger.info("a connection could not be reset for reuse (%s)", type(exc).__name__)

    async def _alone(self, conn: asyncpg.Connection, pending: _Pending) -> Submission | Recorded | Exception:
        """One document in its own transaction; a failure is its outcome."""
        if pending.answer is None:
            return await _alone(conn, pending, settings=self.rolling)
        try:
            (outcome,) = await _submit_group(conn, [pending], settings=self.rolling, waits=self.settings,
                                             hints=self.hints)
        except asyncpg.PostgresError as exc:
            return _refusal(exc, namespace=pending.namespace, idempotency_key=pending.idempotency_key)
        except Exception as exc:
            return exc
        return outcome


def _checked(pending: _Pending) -> _Pending:
    """`pending`, once its namespace, idempotency key and digest are known to be storable."""
    problems: list[applying.FieldError] = []
    if (reason := _key_problem(pending.idempotency_key)) is not None:
        problems.append(applying.FieldError("idempotencyKey", reason))
    if (reason := _namespace_problem(pending.namespace)) is not None:
        problems.append(applying.FieldError("namespace", reason))
    if problems:
        raise applying.InvalidDocument(problems)
    digest = pending.request_digest
    if not digest or len(digest) > REQUEST_DIGEST_MAX or storable.unstorable_reason(digest):
        raise ValueError(f"request_digest must be 1 to {REQUEST_DIGEST_MAX} storable characters")
    return pending


async def _alone(
        conn: asyncpg.Connection,
        pending: _Pending,
        *,
        settings: RollingBatchSettings,
) -> Submission | Exception:
    """`submit_validated` for one document, in its own transaction; a failure is its outcome."""
    try:
        return await submit_validated(
            conn, namespace=pending.namespace, request=pending.request, idempotency_key=pending.idempotency_key,
            request_digest=pending.request_digest, settings=settings,
        )  # fmt: skip
    except Exception as exc:
        return exc


class _GroupHints:
    """The rolling group each document's fields (namespace, pool, endpoint, priority, deadline) went
    to last, so that a lone document's batch is picked in the statement that claims its key and
    reads its rules, before the rules tell its tenant (which the group names). A hint only: its
    pick is used when the group decided after the rules is the hinted one, and a wrong hint costs
    one more round trip (the batch it locked, if any, is left alone until the commit)."""

    MAX = 4096
    """Distinct field combinations remembered; beyond it, the memory starts over."""

    def __init__(self) -> None:
        self._groups: dict[tuple[str, str, str | None, str, int], str] = {}

    @staticmethod
    def _fields(pending: _Pending) -> tuple[str, str, str | None, str, int]:
        request = pending.request
        return (pending.namespace, request.inference_pool_ref, request.delivery_endpoint_ref, request.priority,
                request.deadline_seconds)

    def group_of(self, group: Sequence[_Pending]) -> str | None:
        """The rolling group the documents of `group` went to last, when they all share their fields
        (then they all go to one rolling group, whose batches no other lock precedes)."""
        fields = self._fields(group[0])
        if any(self._fields(pending) != fields for pending in group[1:]):
            return None
        return self._groups.get(fields)

    def remember(self, pending: _Pending, group: str) -> None:
        if len(self._groups) >= self.MAX:
            self._groups.clear()
        self._groups[self._fields(pending)] = group


_HINTS = _GroupHints()
"""The hints of `submit_document` and `submit_validated` (a GroupSubmitter keeps its own)."""


async def _submit_group(
        conn: asyncpg.Connection,
        group: Sequence[_Pending],
        *,
        settings: RollingBatchSettings,
        waits: GroupSettings,
        hints: _GroupHints | None = None,
) -> list[Submission | Recorded | Exception]:
    """`_submit_group_once`, in a new transaction while the group lost a race for a document key.

    Whether an open batch holds a document key already is read in the statement that locks the
    batch, under that statement's snapshot: when another transaction appended the key to the batch
    and committed between the snapshot and the lock, the look-up misses it and the append breaks
    the batch's unique (batch, document key). Nothing is wrong with the documents: the next
    transaction's statements see that commit and place the key elsewhere. Retried a few times (each
    lost race means another document of the same key was accepted meanwhile), then answered as in
    progress (temporary: the client retries)."""
    for _ in range(_KEY_RACE_TRIES):
        try:
            return await _submit_group_once(conn, group, settings=settings, waits=waits, hints=hints)
        except asyncpg.UniqueViolationError as exc:
            if exc.constraint_name != BATCH_KEY_CONSTRAINT:
                raise
            logger.debug("a group of %d documents lost a document key's race", len(group))
    raise errors.AcceptanceInProgress(
        "documents of the same key are being accepted by other transactions; retry shortly"
    )


async def _submit_group_once(
        conn: asyncpg.Connection,
        group: Sequence[_Pending],
        *,
        settings: RollingBatchSettings,
        waits: GroupSettings,
        hints: _GroupHints | None = None,
) -> list[Submission | Recorded | Exception]:
    """Accept `group` (one document per idempotency key) in one transaction: the POSTs' records and
    every document's key claimed and the group's admission context read in one statement (POSTs
    answered before are Recorded and go no further; repeats are answered from their records), each
    document checked against its tenant's rules, the admitted ones appended to their rolling
    batches a batch at a time, and in the statement of the last append, the tenants' queues
    registered, their claimers woken, a refused document's keys released and the POSTs' answers
    recorded. A group takes four round trips: BEGIN, the claim (which also picks the open batch of
    the rolling group documents with its fields went to last time, `_GroupHints`, and finds which
    of the group's keys that batch holds), the append, COMMIT; more when that guess was wrong, its
    documents have different fields or fill more than one batch. One outcome per document, in
    order.

    Lock order, the same in every transaction: records' keys (sorted), documents' keys (sorted),
    rolling batches (by group); a record's claim is the only wait before the first lock of the
    next kind, so two groups sharing a key wait for one another at most once, never in a cycle."""
    outcomes: list[Submission | Recorded | Exception | None] = [None] * len(group)
    checks = [_check_of(pending) for pending in group]
    namespaces, pools, endpoints = applying.context_asked(checks)
    hints = hints or _HINTS
    guess = hints.group_of(group)
    async with conn.transaction():
        posts = [i for i, p in enumerate(group) if p.answer is not None]
        claimed = await submissions.claim_group(
            conn,
            [submissions.GroupClaim(p.namespace, p.idempotency_key, p.request_digest, recorded=p.answer is not None)
             for p in group],
            namespaces=namespaces, pools=pools, endpoints=endpoints,
            wait_s=waits.in_progress_wait_s if posts else settings.lock_timeout_s, then_wait_s=settings.lock_timeout_s,
            pick_slots=[] if guess is None else _slots(guess, settings), pick_key=group[0].request.key,
            pick_keys=[] if guess is None else [p.request.key for p in group[1:]],
        )  # fmt: skip
        answered = [i for i in posts if group[i].identity not in claimed.recorded]
        if answered:
            stored = await api_requests.get_many(conn, [group[i].identity for i in answered])
            for i in answered:
                found = stored.get(group[i].identity)
                assert found is not None, "the claim found the key taken, so its row exists"
                outcomes[i] = Recorded(found)
        todo = [i for i in range(len(group)) if outcomes[i] is None]
        repeats = [i for i in todo if group[i].identity not in claimed.job_ids]
        if repeats:
            taken = await submissions.get_many(conn, [group[i].identity for i in repeats])
            for i in repeats:
                outcomes[i] = _repeat(group[i], taken.get(group[i].identity))
        fresh = [i for i in todo if group[i].identity in claimed.job_ids]
        job_ids = {i: claimed.job_ids[group[i].identity] for i in fresh}
        verdicts = await applying.check_documents(conn, [checks[i] for i in fresh], context=claimed.context)
        unclaimed: list[tuple[str, str]] = []
        by_batch: dict[str, tuple[_Group, list[tuple[int, applying.Admissible]]]] = {}
        for i, verdict in zip(fresh, verdicts, strict=True):
            if isinstance(verdict, applying.AdmissionRejected):
                outcomes[i] = verdict
                unclaimed.append(group[i].identity)
                continue
            pool = verdict.pool
            endpoint = checks[i].endpoint
            request = group[i].request
            key = _group_key(verdict.tenant, group[i].namespace, pool.name, endpoint, request.priority,
                             request.deadline_seconds)
            hints.remember(group[i], key)
            if key not in by_batch:
                by_batch[key] = (_rolling_batch(namespace=group[i].namespace, tenant=verdict.tenant, pool=pool,
                                                endpoint=endpoint, request=request), [])
            by_batch[key][1].append((i, verdict))
        queues: set[tuple[PoolName, TenantName]] = set()
        last: submissions.Appending | None = None
        for name in sorted(by_batch):  # one order of rolling groups: concurrent groups lock batches alike
            if last is not None:
                await submissions.append_jobs(conn, batch_id=last.batch_id, shared=last.shared,
                                              documents=last.documents)
            shape, members = by_batch[name]
            placed, last = await _append_to_rolling(
                conn, shape, [(group[i], job_ids[i]) for i, _ in members], settings=settings,
                # The claim's pick was made for the first document's key: it serves the group that
                # document is the first of.
                first_pick=(claimed.picked, claimed.picked_holds) if guess == shape.group and members[0][0] == 0
                else None,
            )  # fmt: skip
            for (i, verdict), (namespace, batch_name) in zip(members, placed, strict=True):
                outcomes[i] = Submission(job_id=job_ids[i], batch_namespace=namespace, batch_name=batch_name,
                                         replayed=False)
                queues.add((verdict.pool.name, verdict.tenant))
        await submissions.append_and_finish(conn, last, _finish(group, outcomes, claimed.recorded, queues=queues,
                                                                unclaimed=unclaimed))
        await failpoints.ahit("intake.before_commit")
    assert all(outcome is not None for outcome in outcomes), "every document has an outcome"
    return [outcome for outcome in outcomes if outcome is not None]


def _check_of(pending: _Pending) -> applying.DocumentCheck:
    """What admission checks of `pending`'s document."""
    return applying.DocumentCheck(
        namespace=pending.namespace, key=pending.request.key, priority=pending.request.priority,
        pool_name=pending.request.pool_name(namespace=pending.namespace), endpoint=_endpoint(pending),
        document_bytes=pending.request.document_bytes,
    )  # fmt: skip


def _finish(
        group: Sequence[_Pending],
        outcomes: Sequence[Submission | Recorded | Exception | None],
        recorded: set[tuple[str, str]],
        *,
        queues: set[tuple[PoolName, TenantName]],
        unclaimed: Sequence[tuple[str, str]],
) -> submissions.Finish:
    """What the group's last statement writes: the queues of the accepted documents, the keys of the
    refused ones released, and the answers of the POSTs whose records this transaction claimed: a
    submission's 202 written, a refusal's key released (a refusal is not kept: the key can be
    retried once the cause is fixed)."""
    answers: list[submissions.Answer] = []
    released: list[tuple[str, str]] = []
    for pending, outcome in zip(group, outcomes, strict=True):
        if pending.identity not in recorded:
            continue
        if isinstance(outcome, Submission):
            assert pending.answer is not None, "only a POST has a record"
            location, body = pending.answer(outcome)
            answers.append(submissions.Answer(pending.namespace, pending.idempotency_key, 202, location, body,
                                              pending.request_digest))
        else:
            released.append(pending.identity)
    return submissions.Finish(queues=sorted(queues), unclaimed=unclaimed, released=released, answers=answers)


def _endpoint(pending: _Pending) -> str | None:
    ref = pending.request.delivery_endpoint_ref
    return None if ref is None else f"{pending.namespace}/{ref}"


def _repeat(pending: _Pending, stored: submissions.Stored | None) -> Submission | Exception:
    assert stored is not None, "the claim found the key taken, so its row exists"
    if stored.request_digest != pending.request_digest:
        return IdempotencyMismatch(namespace=pending.namespace, idempotency_key=pending.idempotency_key)
    return Submission(job_id=stored.job_id, batch_namespace=stored.batch_namespace, batch_name=stored.batch_name,
                      replayed=True)


async def _append_to_rolling(
        conn: asyncpg.Connection,
        shape: _Group,
        documents: Sequence[tuple[_Pending, JobId]],
        *,
        settings: RollingBatchSettings,
        first_pick: tuple[batches.OpenRolling | None, frozenset[str]] | None = None,
) -> tuple[list[tuple[str, str]], submissions.Appending]:
    """Append `documents` (one rolling group's) to open batches of the group, as many to one batch
    as it takes (room, and keys it does not hold yet): (namespace, name) of each one's batch, and
    the last append, not sent yet (the caller sends it with what its transaction writes last),
    its batch locked. `first_pick`: see `_open_batch_for` (for the first document's key), with
    which of the other documents' keys that batch holds (`submissions.claim_group`)."""
    placed: dict[int, tuple[str, str]] = {}
    remaining = list(range(len(documents)))
    while True:
        first = documents[remaining[0]][0].request.key
        picked, known = (None, frozenset[str]()) if first_pick is None else first_pick
        batch_id, name, opened, holds = await _open_batch_for(
            conn, shape, key=first, settings=settings, first_pick=None if first_pick is None else (picked,)
        )  # fmt: skip
        first_pick = None
        room = settings.max_documents - holds
        # The batch takes `first` (_open_batch_for saw to it): only the other keys need a look,
        # which the claim took already when this is the batch it picked.
        others = [documents[i][0].request.key for i in remaining if documents[i][0].request.key != first]
        taken: set[str] = set()
        if holds and others:
            if picked is not None and picked.id == batch_id:
                taken = set(known)
            else:
                taken = await submissions.keys_taken(conn, batch_id=batch_id, document_keys=others)
        now: list[int] = []
        later: list[int] = []
        for i in remaining:
            key = documents[i][0].request.key
            if len(now) < room and key not in taken:
                taken.add(key)
                now.append(i)
            else:
                later.append(i)
        assert now, "the batch _open_batch_for gave takes the first document"
        pool = shape.pool
        request_hash = shape.job_request_hash()
        appending = submissions.Appending(
            batch_id=batch_id,
            shared=submissions.AppendedJobs(
                tenant=shape.tenant, pool=pool, schema=SCHEMA, validation_policy=shape.validation_policy,
                priority=shape.priority, max_attempts=accepting.BatchRequest.max_attempts,
                deadline_s=shape.deadline_s,
            ),
            documents=[
                submissions.AppendedDocument(
                    job_id=documents[i][1], document_key=documents[i][0].request.key,
                    request_hash=request_hash(documents[i][0].request.content_sha256),
                    content_sha256=documents[i][0].request.content_sha256, text=documents[i][0].request.text,
                    uri=documents[i][0].request.uri, document_bytes=documents[i][0].request.document_bytes,
                )
                for i in now
            ],
        )  # fmt: skip
        if opened:
            await outbox.insert_batch_accepted(conn, batch_id=batch_id, payload={
                "batch_id": batch_id, "tenant": shape.tenant,
                "batch": {"namespace": shape.namespace, "name": name}, "pool": pool, "jobs": len(now),
                "rolling": True,
            })  # fmt: skip
        for i in now:
            placed[i] = (shape.namespace, name)
        if not later:
            return [placed[i] for i in range(len(documents))], appending
        await submissions.append_jobs(conn, batch_id=batch_id, shared=appending.shared,
                                      documents=appending.documents)
        remaining = later
