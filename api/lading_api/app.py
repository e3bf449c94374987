"""
The intake's HTTP face (aiohttp): the routes of `routes.ROUTES`, each served by a method of
`Intake`.

A request is checked cheapest first, and nothing is read past the first failure:

    no or unknown bearer token          401 unauthorized    (revoked and expired tokens too; with
                                                             --kubernetes-auth a ServiceAccount token
                                                             the API server authenticates is known)
    namespace not one of the token's    404 not-found       (as for what does not exist: a token never
                                                             learns whether another namespace's objects exist;
                                                             a ServiceAccount's: where a SubjectAccessReview
                                                             denies `create extractionbatches`)
    Content-Length over the limit       413 too-large       (before a byte of the body is read)
    POST without Idempotency-Key        400 idempotency-key-missing
    not application/json                415 unsupported-media-type
    not JSON                            400 bad-request
    invalid                             422 invalid-request (every field error, as JSON pointers)
    the key answered before             the first answer again, `Idempotency-Replayed: true`
                                        (422 idempotency-key-reused when the request differs)
    the key in progress                 409 request-in-progress
    not admitted                        422 not-admitted    (pool unknown or not allowed, priority, endpoint)
    the tenant's queue full             429 quota-exceeded  + Retry-After from the tenant's drain rate
    database unreachable, saturated     503 unavailable     + Retry-After
    accepted                            202 + Location

The Idempotency-Key record (`lading.db.api_requests`) of a document POST is claimed and answered
in the transaction that accepts the document (`intake.GroupSubmitter.submit_post`): documents
POSTed at the same time share that transaction (group commit), and a POST waits for one commit.
A crash before it leaves neither the document nor its record, so the retry is accepted afresh; a
crash after it leaves both, so the retry is the replay. A batch POST's record is taken in a
transaction held open while the batch is accepted (on another connection, from another pool) and
answered before it commits: a crash in between leaves no record, and the retry is accepted again,
which the batch's own identity (its name) answers with the same batch. Failpoints
`api.after_accept_before_record` (batches) and `api.after_commit_before_answer` let tests kill the
process at those points. For the same reason that record's commit does not wait for the WAL flush
(`synchronous_commit = off` for that transaction alone): the acceptance it records was flushed
before the record was written, so a record lost in a database crash only makes a retry go through
the core's idempotency again, and each POST costs one flush, not two.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import math
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, TypeVar

import aiohttp.web
import asyncpg
import orjson
import prometheus_client
import pydantic

from lading import access, applying, errors, failpoints, health, intake, metrics, reasons, storable
from lading.db import api_requests, api_tokens, api_views, batches, deliveries, jobs, locks, queue, registry
from lading.documents import manifest_lines
from lading.ids import JobId, PoolName
from lading.jobs.states import SETTLED
from lading.models import specs
from lading.settings import DocumentSettings
from lading_api import batch_status, kube_auth, models, problems, routes
from lading_api.settings import ApiSettings

logger = logging.getLogger("lading.api")

IDEMPOTENCY_KEY = "Idempotency-Key"
REPLAYED = "Idempotency-Replayed"
IDEMPOTENCY_KEY_MAX = intake.IDEMPOTENCY_KEY_MAX
BIGINT_MAX = 2**63 - 1
TOKEN_CACHE_MAX = 10_000
"""Most token lookups kept (`ApiSettings.token_cache_s`); all are dropped when it is reached."""
_M = TypeVar("_M", bound=pydantic.BaseModel)
_T = TypeVar("_T")

UNAVAILABLE: tuple[type[BaseException], ...] = (
    OSError,
    TimeoutError,
    asyncpg.InterfaceError,
    asyncpg.exceptions.PostgresConnectionError,
    asyncpg.exceptions.InsufficientResourcesError,
    asyncpg.exceptions.OperatorInterventionError,
    asyncpg.exceptions.UndefinedTableError,  # migrations pending: /readyz says which
    aiohttp.ClientError,  # the Kubernetes API server, for a ServiceAccount token's review
)
"""Errors after which nothing is known to be committed: 503, the client retries with the same key."""


class _Answer(Exception):
    """Leave a handler with this response; raised inside the idempotency transaction, it rolls back."""

    def __init__(self, response: aiohttp.web.Response) -> None:
        super().__init__(response.status)
        self.response = response


@dataclasses.dataclass(frozen=True)
class _Caller:
    """Who sent a request: a Lading token's namespaces, or a Kubernetes user asked about each one."""

    token: str
    namespaces: frozenset[str] | None
    """A Lading token's namespaces; None for a Kubernetes user (`user`)."""
    user: kube_auth.User | None = None


@dataclasses.dataclass(frozen=True)
class _Accepted:
    location: str
    body: dict[str, Any]
    replayed: bool
    """The core found the document or batch accepted before (a retry after a lost answer)."""


class Intake:
    """The handlers, bound to the database pools and the settings."""

    def __init__(
            self,
            *,
            db: asyncpg.Pool,
            guards: asyncpg.Pool,
            dsn: str,
            settings: ApiSettings,
            documents: DocumentSettings,
            openapi: Mapping[str, Any],
            kube: kube_auth.KubeReviewer | None = None,
    ) -> None:
        self.db = db
        self.guards = guards
        self.dsn = dsn
        self.settings = settings
        self.documents = documents
        self.kube = kube
        """Reviews Kubernetes ServiceAccount tokens; None: only Lading's tokens are accepted."""
        self.manifest_downloads = asyncio.Semaphore(4)
        self.submitter = intake.GroupSubmitter(
            db, settings=intake.GroupSettings(in_progress_wait_s=settings.in_progress_wait_s)
        )
        """Documents POSTed at the same time are accepted, with their Idempotency-Key records, in one
        transaction (group commit)."""
        self._principals: dict[str, tuple[float, api_tokens.Principal]] = {}
        """Lading tokens looked up lately, by digest, with when the lookup stops counting."""
        self._lookups: dict[str, asyncio.Future[api_tokens.Principal | None]] = {}
        """Lookups in flight, by token digest: requests whose cached lookup expired together wait for one."""
        self._openapi = orjson.dumps(openapi)

    # --- Public routes.

    async def healthz(self, _: aiohttp.web.Request) -> aiohttp.web.Response:
        return aiohttp.web.Response(text="ok\n")

    async def readyz(self, _: aiohttp.web.Request) -> aiohttp.web.Response:
        state = await health.readiness(self.dsn)
        return aiohttp.web.Response(text=state.reason + "\n", status=200 if state.ready else 503)

    async def metrics(self, _: aiohttp.web.Request) -> aiohttp.web.Response:
        body = prometheus_client.generate_latest(metrics.REGISTRY)
        return aiohttp.web.Response(body=body, headers={"Content-Type": prometheus_client.CONTENT_TYPE_LATEST})

    async def get_openapi(self, _: aiohttp.web.Request) -> aiohttp.web.Response:
        return aiohttp.web.Response(body=self._openapi, content_type="application/json")

    # --- Documents and batches.

    async def post_document(self, request: aiohttp.web.Request) -> aiohttp.web.Response:
        namespace = await self._namespace(request)
        key, body = await self._post_body(request)
        document = _parse(intake.DocumentRequest, body)
        digest = intake.request_digest(document)  # the queue intake's digest too
        outcome = await self._accepting(namespace, lambda: self.submitter.submit_post(
            namespace=namespace, request=document, idempotency_key=key, request_digest=digest,
            answer=_document_answer,
        ))  # fmt: skip
        if isinstance(outcome, intake.Recorded):
            return _replay(outcome.answered, digest=digest)
        await failpoints.ahit("api.after_commit_before_answer")
        location, answer = _document_answer(outcome)
        return _accepted_response(_Accepted(location, answer, outcome.replayed))

    async def post_batch(self, request: aiohttp.web.Request) -> aiohttp.web.Response:
        namespace = await self._namespace(request)
        key, body = await self._post_body(request)
        submitted = _parse(models.BatchSubmission, body)
        digest = models.request_digest("batches", submitted)
        batch = specs.ExtractionBatch(
            metadata=specs.Metadata(name=submitted.name, namespace=namespace), spec=submitted.spec
        )

        async def accept() -> _Accepted:
            applied = await applying.admit_batch_via_pool(
                self.db, batch, documents=self.documents, downloads=self.manifest_downloads
            )
            location = f"/v1/namespaces/{namespace}/batches/{submitted.name}"
            accepted = models.BatchAccepted(
                batch_id=applied.result.batch_id, namespace=namespace, name=submitted.name,
                jobs=len(applied.result.job_ids), status_url=location,
            )  # fmt: skip
            return _Accepted(location, accepted.model_dump(mode="json", by_alias=True), not applied.result.created)

        return await self._idempotent(namespace=namespace, key=key, digest=digest, accept=accept)

    async def get_batch(self, request: aiohttp.web.Request) -> aiohttp.web.Response:
        namespace = await self._namespace(request)
        async with self._connection() as conn:
            return _json(200, await self._batch_view(conn, namespace, request.match_info["name"]))

    async def delete_batch(self, request: aiohttp.web.Request) -> aiohttp.web.Response:
        namespace = await self._namespace(request)
        name = request.match_info["name"]
        async with self._connection() as conn:
            found = await api_views.batch(conn, namespace=namespace, name=name)
            if found is None:
                raise _not_found(f"batch {name} in namespace {namespace}")
            async with conn.transaction():
                cancelled = await jobs.cancel_batch(conn, batch_id=found.id, reason="batch cancelled through the API")
            if cancelled:
                logger.info("batch %s/%s cancelled: %d jobs", namespace, name, len(cancelled))
            return _json(200, await self._batch_view(conn, namespace, name))

    async def get_batch_results(self, request: aiohttp.web.Request) -> aiohttp.web.Response:
        namespace = await self._namespace(request)
        name = request.match_info["name"]
        after = request.query.get("after", "")
        if storable.unstorable_reason(after) is not None:  # a NUL or a lone surrogate: never a document key
            raise _Answer(problems.problem(400, "bad-request", "after must be a document key (from a Link header)"))
        limit = _page_size(request.query.get("limit"), self.settings)
        async with self._connection() as conn:
            found = await api_views.batch(conn, namespace=namespace, name=name)
            if found is None:
                raise _not_found(f"batch {name} in namespace {namespace}")
            lines = await api_views.batch_results(conn, batch_id=found.id, after=after, limit=limit)
        body = b"".join(
            orjson.dumps(models.ResultLine(
                job_id=line.job_id, key=line.key, state=line.state.value, result=line.result, verdict=line.verdict,
                result_deleted=line.result_deleted,
            ).model_dump(mode="json", by_alias=True)) + b"\n"
            for line in lines
        )  # fmt: skip
        headers = {}
        if len(lines) == limit:
            query = urllib.parse.urlencode({"after": lines[-1].key, "limit": limit})
            headers["Link"] = f'<{request.path}?{query}>; rel="next"'
        return aiohttp.web.Response(body=body, content_type=routes.NDJSON, headers=headers)

    async def get_job(self, request: aiohttp.web.Request) -> aiohttp.web.Response:
        caller = await self._caller(request)
        job_id = _job_id(request)
        async with self._connection() as conn:
            job = await api_views.job(conn, job_id=job_id, namespaces=await self._job_scope(conn, caller, job_id))
        if job is None:
            raise _not_found(f"job {job_id}")
        view = models.JobView(
            id=job.id, key=job.key, state=job.state.value,
            batch=models.BatchRef(namespace=job.namespace, name=job.batch_name), attempt=job.attempt,
            max_attempts=job.max_attempts, created_at=_time(job.created_at), updated_at=_time(job.updated_at),
            finished_at=batch_status.rfc3339(job.finished_at), deadline_at=_time(job.deadline_at),
            last_error_class=job.last_error_class,
        ).model_dump(mode="json", by_alias=True)  # fmt: skip
        if job.state in SETTLED:
            return _json(303, view, headers={"Location": f"/v1/jobs/{job.id}/result"})
        return _json(200, view, headers={"Retry-After": str(self.settings.running_retry_after_s)})

    async def get_job_result(self, request: aiohttp.web.Request) -> aiohttp.web.Response:
        caller = await self._caller(request)
        job_id = _job_id(request)
        async with self._connection() as conn:
            scope = await self._job_scope(conn, caller, job_id)
            found = await api_views.job_result(conn, job_id=job_id, namespaces=scope)
        if found is None:
            raise _not_found(f"job {job_id}")
        return _json(200, models.JobResultView(
            id=found.id, key=found.key, state=found.state.value, result=found.result, verdict=found.verdict,
            result_deleted=found.result_deleted,
        ).model_dump(mode="json", by_alias=True))  # fmt: skip

    # --- What the handlers share.

    async def _caller(self, request: aiohttp.web.Request) -> _Caller:
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise _Answer(_unauthorized("give a bearer token: Authorization: Bearer lading_..."))
        if access.well_formed(token):
            principal = await self._principal(access.digest(token))
            if principal is not None:
                return _Caller(token, principal.namespaces)
        elif self.kube is not None and len(token) <= 16384:
            user = await self.kube.user(token)
            if user is not None:
                return _Caller(token, None, user)
        raise _Answer(_unauthorized("the bearer token is unknown, revoked or expired"))

    async def _principal(self, token_sha256: str) -> api_tokens.Principal | None:
        """The token's principal; a valid one is looked up again after `token_cache_s` at the latest,
        so a token revoked or expired stops working within that time (an unknown one is never kept)."""
        now = asyncio.get_running_loop().time()
        cached = self._principals.get(token_sha256)
        if cached is not None and cached[0] > now:
            return cached[1]
        if self.settings.token_cache_s <= 0:
            return await self._look_up(token_sha256)
        lookup = self._lookups.get(token_sha256)
        if lookup is None:  # one lookup at a time per token: requests that miss together share it
            lookup = asyncio.ensure_future(self._look_up(token_sha256))
            self._lookups[token_sha256] = lookup
            lookup.add_done_callback(lambda _: self._lookups.pop(token_sha256, None))
        return await asyncio.shield(lookup)

    async def _look_up(self, token_sha256: str) -> api_tokens.Principal | None:
        now = asyncio.get_running_loop().time()
        async with self._connection() as conn:
            principal = await api_tokens.authenticate(conn, token_sha256=token_sha256)
        if principal is None:
            self._principals.pop(token_sha256, None)
        elif self.settings.token_cache_s > 0:
            if len(self._principals) >= TOKEN_CACHE_MAX:
                self._principals.clear()
            self._principals[token_sha256] = (now + self.settings.token_cache_s, principal)
        return principal

    async def _may(self, caller: _Caller, namespace: str) -> bool:
        if caller.namespaces is not None:
            return namespace in caller.namespaces
        assert self.kube is not None and caller.user is not None, "a Kubernetes user comes from the reviewer"
        return await self.kube.may_submit(caller.token, caller.user, namespace)

    async def _namespace(self, request: aiohttp.web.Request) -> str:
        """The route's namespace, when the caller may act in it; 404 otherwise (see the module)."""
        caller = await self._caller(request)
        namespace = request.match_info["namespace"]
        if not await self._may(caller, namespace):
            raise _not_found(f"namespace {namespace}")
        return namespace

    async def _job_scope(self, conn: asyncpg.Connection, caller: _Caller, job_id: JobId) -> frozenset[str]:
        """The namespaces a job is looked up in: a Lading token's, or, for a Kubernetes user, the job's
        own when the user may act there (none otherwise: not found, as for a job that does not exist)."""
        if caller.namespaces is not None:
            return caller.namespaces
        namespace = await api_views.job_namespace(conn, job_id=job_id)
        return frozenset() if namespace is None or not await self._may(caller, namespace) else frozenset({namespace})

    async def _post_body(self, request: aiohttp.web.Request) -> tuple[str, bytes]:
        """The Idempotency-Key and the raw body of a POST, with the cheap checks first."""
        limit = self.settings.max_body_bytes
        if request.content_length is not None and request.content_length > limit:
            raise _Answer(problems.problem(413, "too-large", f"the body is {request.content_length} bytes; "
                                                             f"at most {limit} are accepted"))
        key = request.headers.get(IDEMPOTENCY_KEY)
        if key is None or not key.strip():
            raise _Answer(problems.problem(400, "idempotency-key-missing",
                                           f"every POST needs an {IDEMPOTENCY_KEY} header (a unique value per "
                                           "intended request, reused only to retry it)"))
        if len(key) > IDEMPOTENCY_KEY_MAX or not key.isprintable() or not key.isascii():
            raise _Answer(problems.problem(400, "bad-request", f"the {IDEMPOTENCY_KEY} header must be 1 to "
                                           f"{IDEMPOTENCY_KEY_MAX} printable ASCII characters"))
        # The header as clients send it is compared first; aiohttp's parse of it only for other forms.
        if request.headers.get("Content-Type") != "application/json" and request.content_type != "application/json":
            raise _Answer(problems.problem(415, "unsupported-media-type", "send the body as application/json"))
        try:
            body = await request.read()
        except aiohttp.web.HTTPRequestEntityTooLarge:
            raise _Answer(problems.problem(413, "too-large", f"the body is larger than {limit} bytes")) from None
        return key, body

    async def _idempotent(
            self,
            *,
            namespace: str,
            key: str,
            digest: str,
            accept: Callable[[], Awaitable[_Accepted]],
    ) -> aiohttp.web.Response:
        """Answer a POST once per (namespace, key): see the module."""
        try:
            async with self.guards.acquire(timeout=self.settings.unavailable_retry_after_s) as guard:
                async with guard.transaction():
                    await locks.set_local_lock_timeout(guard, seconds=self.settings.in_progress_wait_s)
                    await api_requests.commit_lazily(guard)
                    try:
                        mine = await api_requests.claim(guard, namespace=namespace, key=key, request_sha256=digest)
                    except asyncpg.LockNotAvailableError:
                        raise _Answer(_in_progress(key)) from None
                    if not mine:
                        stored = await api_requests.get(guard, namespace=namespace, key=key)
                        assert stored is not None, "the claim found the key taken, so its row exists"
                        raise _Answer(_replay(stored, digest=digest))
                    accepted = await self._accepting(namespace, accept)
                    await failpoints.ahit("api.after_accept_before_record")
                    await api_requests.answer(guard, namespace=namespace, key=key, status=202,
                                              location=accepted.location, body=accepted.body)
        except _Answer as answer:
            return answer.response
        await failpoints.ahit("api.after_commit_before_answer")
        return _accepted_response(accepted)

    async def _accepting(self, namespace: str, accept: Callable[[], Awaitable[_T]]) -> _T:
        """`accept()`, with the core's refusals as problem answers."""
        try:
            return await accept()
        except applying.AdmissionRejected as exc:
            if exc.reason == reasons.QUOTA_EXCEEDED:
                raise _Answer(problems.problem(
                    429, "quota-exceeded", str(exc), headers={"Retry-After": str(await self._drain_wait(namespace))},
                    extra={"reason": exc.reason},
                )) from None  # fmt: skip
            raise _Answer(problems.problem(422, "not-admitted", str(exc), errors=_admission_errors(exc),
                                           extra={"reason": exc.reason})) from None
        except intake.IdempotencyMismatch as exc:
            raise _Answer(problems.problem(422, "idempotency-key-reused", str(exc))) from None
        except errors.IdempotencyConflict:
            raise _Answer(problems.problem(
                409, "batch-exists", "a batch of this name was accepted in this namespace with another spec; "
                "choose another name (nothing was changed)",
            )) from None  # fmt: skip
        except errors.AcceptanceInProgress as exc:
            raise _Answer(problems.problem(409, "request-in-progress", str(exc))) from None
        except manifest_lines.ManifestUnavailable as exc:
            raise _Answer(problems.problem(503, "unavailable", str(exc), headers=self._retry_after())) from None

    async def _drain_wait(self, namespace: str) -> int:
        """Seconds until the tenant's queue, at the rate it drained lately, has room again (bounded)."""
        ceiling = self.settings.retry_after_max_s
        try:
            async with self._connection() as conn:
                # The tenant, its rules and its queue in one read (the queue only where a limit bounds it).
                context = await registry.admission_context(conn, namespaces=[namespace], pools=[], endpoints=[])
                tenant = context.tenant(namespace)
                rules = None if tenant is None else context.rules.get(tenant)
                if tenant is None or rules is None:
                    return ceiling
                queued_jobs, queued_bytes = context.queued[tenant]
                rate = await api_views.drain_rate(conn, tenant=tenant, window_s=self.settings.drain_window_s)
                waits = [1.0]
                if rules.max_queued_jobs is not None:
                    waits.append(_wait(queued_jobs + 1 - rules.max_queued_jobs, rate.jobs_per_s, ceiling))
                if rules.max_queued_bytes is not None:
                    waits.append(_wait(max(queued_bytes - rules.max_queued_bytes, 1), rate.bytes_per_s, ceiling))
        except _Answer:
            return ceiling
        return min(ceiling, math.ceil(max(waits)))

    @contextlib.asynccontextmanager
    async def _connection(self) -> AsyncIterator[asyncpg.Connection]:
        """A connection of the work pool; 503 when none comes in time or the database fails under us."""
        try:
            async with self.db.acquire(timeout=self.settings.unavailable_retry_after_s) as conn:
                yield conn
        except UNAVAILABLE as exc:
            raise _Answer(_unavailable(exc, self._retry_after())) from None

    def _retry_after(self) -> dict[str, str]:
        return {"Retry-After": str(self.settings.unavailable_retry_after_s)}

    async def _batch_view(self, conn: asyncpg.Connection, namespace: str, name: str) -> dict[str, Any]:
        found = await api_views.batch(conn, namespace=namespace, name=name)
        current = None if found is None else await batches.get_observed(
            conn, tenant=found.tenant, idempotency_key=found.idempotency_key
        )
        if found is None or current is None:
            raise _not_found(f"batch {name} in namespace {namespace}")
        delivered = None
        if found.endpoint is not None:
            delivered = await deliveries.count_delivered_of_batch(conn, batch_id=found.id)
        failures = await jobs.failures_of_batch(conn, batch_id=found.id, limit=10)
        settled = sum(n for state, n in current.counts.items() if state in SETTLED) >= current.total
        where = None if settled else await queue.position(
            conn, pool=PoolName(found.pool), tenant=found.tenant, batch_id=found.id
        )
        return batch_status.view(found, current, delivered=delivered, failures=failures, where=where)


def _document_answer(submission: intake.Submission) -> tuple[str, dict[str, Any]]:
    """The Location and body of a document's 202 (`models.DocumentAccepted`), as recorded and sent."""
    location = f"/v1/jobs/{submission.job_id}"
    batch = {"namespace": submission.batch_namespace, "name": submission.batch_name}
    return location, {"jobId": submission.job_id, "statusUrl": location, "batch": batch}


def _accepted_response(accepted: _Accepted) -> aiohttp.web.Response:
    headers = {"Location": accepted.location}
    if accepted.replayed:
        headers[REPLAYED] = "true"
    return _json(202, accepted.body, headers=headers)


def _wait(over: int, rate: float, ceiling: int) -> float:
    """Seconds for `over` units to drain at `rate` per second; the ceiling when nothing drains."""
    if over <= 0:
        return 1.0
    return ceiling if rate <= 0 else over / rate


def _parse(model: type[_M], body: bytes) -> _M:
    try:
        return model.model_validate_json(body)
    except pydantic.ValidationError as exc:
        if any(e["type"] == "json_invalid" for e in exc.errors()):
            raise _Answer(problems.problem(400, "bad-request", "the body is not valid JSON")) from None
        found = problems.field_errors(exc)
        raise _Answer(problems.problem(422, "invalid-request", f"{len(found)} field error(s); see errors",
                                       errors=found)) from None


def _admission_errors(exc: applying.AdmissionRejected) -> list[dict[str, str]]:
    fields = getattr(exc, "fields", ())
    if not fields:
        return [{"pointer": "/", "detail": str(exc)}]
    return [{"pointer": "/" + "/".join(f.field.split(".")), "detail": f.message} for f in fields]


def _replay(stored: api_requests.Answered, *, digest: str) -> aiohttp.web.Response:
    if stored.request_sha256 != digest:
        return problems.problem(
            422, "idempotency-key-reused",
            f"this {IDEMPOTENCY_KEY} was used at {batch_status.rfc3339(stored.created_at)} for a different request; "
            "send a new key for a new request (nothing was changed)",
        )  # fmt: skip
    return _json(stored.status, stored.body, headers={"Location": stored.location, REPLAYED: "true"})


def _in_progress(key: str) -> aiohttp.web.Response:
    return problems.problem(409, "request-in-progress",
                            f"a request with this {IDEMPOTENCY_KEY} is still being processed; retry it shortly")


def _unauthorized(detail: str) -> aiohttp.web.Response:
    return problems.problem(401, "unauthorized", detail, headers={"WWW-Authenticate": 'Bearer realm="lading"'})


def _unavailable(exc: BaseException, headers: Mapping[str, str]) -> aiohttp.web.Response:
    # The error's type only: its text may carry the database URL.
    return problems.problem(503, "unavailable", f"the database is unavailable ({type(exc).__name__}); retry later",
                            headers=headers)


def _not_found(what: str) -> _Answer:
    return _Answer(problems.problem(404, "not-found", f"{what} was not found"))


def _json(status: int, body: Mapping[str, Any], *, headers: Mapping[str, str] | None = None) -> aiohttp.web.Response:
    # The Content-Type as a header: aiohttp's content_type= parses and rebuilds it on every answer.
    return aiohttp.web.Response(status=status, body=orjson.dumps(body), headers={**(headers or {}), **_JSON_TYPE})


_JSON_TYPE = {"Content-Type": "application/json"}


def _time(moment: Any) -> str:
    text = batch_status.rfc3339(moment)
    assert text is not None
    return text


def _job_id(request: aiohttp.web.Request) -> JobId:
    text = request.match_info["id"]
    if not text.isdigit() or int(text) > BIGINT_MAX:
        raise _not_found(f"job {text[:32]!r}")
    return JobId(int(text))


def _page_size(text: str | None, settings: ApiSettings) -> int:
    if text is None:
        return settings.results_page_default
    if not text.isdigit() or not 1 <= int(text) <= settings.results_page_max:
        raise _Answer(problems.problem(400, "bad-request", f"limit must be 1 to {settings.results_page_max}"))
    return int(text)


@aiohttp.web.middleware
async def _answers(
        request: aiohttp.web.Request,
        handler: Callable[[aiohttp.web.Request], Awaitable[aiohttp.web.StreamResponse]],
) -> aiohttp.web.StreamResponse:
    """`_Answer` raised anywhere becomes its response; aiohttp's own errors and anything unexpected
    become problem details too (an unexpected error is logged by type, never with the body)."""
    route = request.match_info.route.resource.canonical if request.match_info.route.resource else "unmatched"
    started = asyncio.get_running_loop().time()
    try:
        response = await handler(request)
    except _Answer as answer:
        response = answer.response
    except aiohttp.web.HTTPNotFound:
        response = problems.problem(404, "not-found", f"no route {request.path}")
    except aiohttp.web.HTTPMethodNotAllowed as exc:
        response = problems.problem(405, "method-not-allowed", f"{request.method} is not allowed on {request.path}",
                                    headers={"Allow": ",".join(sorted(exc.allowed_methods))})
    except aiohttp.web.HTTPRequestEntityTooLarge:
        response = problems.problem(413, "too-large", "the body is larger than the limit")
    except UNAVAILABLE as exc:
        response = _unavailable(exc, {"Retry-After": "5"})
    except aiohttp.web.HTTPException:
        raise
    except Exception as exc:
        logger.exception("request %s %s failed: %s", request.method, route, type(exc).__name__)
        response = problems.problem(500, "internal-error", "an unexpected error; it was logged")
    _requests_counted(request.method, route, response.status).inc()
    _latency_observed(request.method, route).observe(asyncio.get_running_loop().time() - started)
    return response


# The metrics' children by label values, found once: `labels()` builds and looks up its key on every
# call, a few per cent of a POST's CPU. Bounded, as a client may send any method.
@functools.lru_cache(maxsize=1024)
def _requests_counted(method: str, route: str, status: int) -> Any:
    return metrics.API_REQUESTS.labels(method, route, str(status))


@functools.lru_cache(maxsize=1024)
def _latency_observed(method: str, route: str) -> Any:
    return metrics.API_LATENCY.labels(method, route)


def make_app(intake_handlers: Intake, *, max_body_bytes: int) -> aiohttp.web.Application:
    app = aiohttp.web.Application(middlewares=[_answers], client_max_size=max_body_bytes)
    for route in routes.ROUTES:
        app.router.add_route(route.method, route.path, getattr(intake_handlers, route.handler))
    return app
