"""
Applying resources to the data plane: the functions the operator's handlers and
`lading run` share, so both admit work the same way.

    TenantQuota       -> tenants row
    InferencePool     -> pools row       (`namespace/name`)
    DeliveryEndpoint  -> endpoints row   (URL only; secrets stay in Secrets, never in the database)
    ExtractionBatch   -> admission: tenant from the namespace (trusted context), every rule
                         of its TenantQuota (`check_batch`), then `accepting.accept_batch`

Every TenantQuota rule is enforced here and only here, for the operator, `lading run` and any
other intake alike, each with its condition reason:

    no quota covers the namespace              NoTenantQuota
    priority not in allowedPriorities          PriorityNotAllowed
    pool not in allowedPools                   PoolNotAllowed
    the pool does not exist                    PoolNotFound
    maxQueuedJobs / maxQueuedBytes exceeded    QuotaExceeded    (a re-admission takes no room)

`apply_manifests` applies a whole validated manifest set in one transaction: either all
of it is applied or none of it.

A batch with `spec.manifestUri` is admitted in three steps, so that a slow or huge manifest
holds nothing anyone else needs (`admit_batch_via_pool`):

    1. the rules, from the database (short): refused here, nothing is downloaded; a queue
       with no room at all is refused too (the manifest's size is not known yet)
    2. read and validate the manifest into a local spool (`lading.documents.manifest_lines.spool`),
       holding no database connection and no lock; callers bound how many run at once
    3. the rules again, now with the manifest's documents and bytes, and acceptance: one short
       transaction that bulk-loads the spool

An invalid manifest is `InvalidManifest` (reason `InvalidManifest`: nothing admitted, fix the
manifest); one that cannot be read now is `lading.documents.manifest_lines.ManifestUnavailable` (a
TemporaryError, reason `ManifestUnavailable`: retry admission unchanged).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Iterator, Sequence

import asyncpg

from lading import accepting, costing, errors, metrics, reasons, tracing
from lading.db import registry
from lading.documents import manifest_lines
from lading.ids import PoolName, TenantName
from lading.models import manifests, specs
from lading.settings import DocumentSettings


@dataclasses.dataclass(frozen=True)
class FieldError:
    """One field of a request that broke a rule: `field` as the request spells it (`text`,
    `inferencePoolRef`, `spec.priority`), `message` what is wrong, never the value."""

    field: str
    message: str


class AdmissionRejected(errors.PermanentError):
    """A batch or document was not admitted; `reason` is the condition reason (CamelCase), `fields`
    the fields to fix when the rule is about one (empty when it is about the tenant or queue)."""

    def __init__(self, *, reason: str, message: str, fields: Sequence[FieldError] = ()) -> None:
        super().__init__(message)
        self.reason = reason
        self.fields = tuple(fields)
        self.source: str | None = None
        """Where the refused resource was read (`FILE: document N (Kind namespace/name)`), when
        `apply_manifests` refused it."""


class PricingCurrencyChanged(errors.PermanentError):
    """An InferencePool's spec.pricing names another currency than the one it is priced in; not applied."""


class InvalidDocument(AdmissionRejected):
    """A single document's request breaks the field rules (reason InvalidSpec); `fields` lists
    every field error at once, and the message joins them. Nothing was admitted."""

    def __init__(self, fields: Sequence[FieldError]) -> None:
        super().__init__(
            reason=reasons.INVALID_SPEC,
            message="; ".join(f"{error.field}: {error.message}" for error in fields),
            fields=fields,
        )


class InvalidManifest(AdmissionRejected):
    """The batch's document manifest has an invalid line (or is empty, too large, refused):
    nothing was admitted. The message names the line and the field."""

    def __init__(self, *, message: str, line: int | None = None) -> None:
        super().__init__(reason=manifest_lines.ManifestInvalid.reason, message=message)
        self.line = line


@dataclasses.dataclass(frozen=True)
class AppliedBatch:
    namespace: str
    name: str
    tenant: TenantName
    pool: PoolName
    result: accepting.AcceptResult


@dataclasses.dataclass(frozen=True)
class Admissible:
    """What `check_batch` found: the batch passes every rule of its tenant's quota."""

    tenant: TenantName
    pool: registry.Pool
    existing: bool
    """Accepted before (a re-admission): it takes no more room in the queue."""


def pool_key(namespace: str, name: str) -> PoolName:
    return PoolName(f"{namespace}/{name}")


@contextlib.contextmanager
def _counted_rejections() -> Iterator[None]:
    try:
        yield
    except AdmissionRejected as exc:
        metrics.ADMISSION_REJECTIONS.labels(exc.reason).inc()  # reasons are a closed CamelCase set
        raise


async def apply_tenant_quota(conn: asyncpg.Connection, quota: specs.TenantQuota) -> None:
    spec = quota.spec
    await registry.upsert_tenant(
        conn,
        name=TenantName(quota.metadata.name),
        namespaces=spec.namespaces,
        weight=spec.weight,
        max_queued_jobs=spec.max_queued_jobs,
        max_in_flight=spec.max_in_flight,
        spec=spec.model_dump(mode="json", by_alias=True),
    )


async def apply_inference_pool(conn: asyncpg.Connection, pool: specs.InferencePool) -> None:
    """Mirror the pool. A priced pool's currency is fixed: its jobs' and batches' costs are summed in
    it, so a change to another currency raises PricingCurrencyChanged and nothing is applied."""
    spec = pool.spec
    name = pool_key(pool.metadata.namespace or "default", pool.metadata.name)
    if spec.pricing is not None:
        stored = await registry.get_pool(conn, name=name)
        before = None if stored is None else costing.Pricing.from_stored(stored.spec)
        if before is not None and before.currency != spec.pricing.currency:
            raise PricingCurrencyChanged(
                f"InferencePool {name}: spec.pricing.currency: the pool is priced in {before.currency}; a priced "
                f"pool's currency cannot change to {spec.pricing.currency} (its costs are summed in it): create "
                "another InferencePool"
            )
    await registry.upsert_pool(
        conn,
        name=name,
        provider=spec.provider,
        model=spec.model,
        spec=spec.model_dump(mode="json", by_alias=True),
        paused=spec.paused,
    )


async def apply_delivery_endpoint(conn: asyncpg.Connection, endpoint: specs.DeliveryEndpoint) -> None:
    await registry.upsert_endpoint(
        conn,
        name=f"{endpoint.metadata.namespace or 'default'}/{endpoint.metadata.name}",
        url=endpoint.spec.url,
        spec=endpoint.spec.model_dump(mode="json", by_alias=True),
    )


@contextlib.asynccontextmanager
async def spool_manifest(
        batch: specs.ExtractionBatch,
        *,
        documents: DocumentSettings,
) -> AsyncIterator[manifest_lines.Spooled]:
    """Read and validate the batch's manifest into a local spool, for `admit_batch(manifest=...)`.

    Call it outside any transaction (an http(s) manifest is read over the network). Raises
    InvalidManifest, or ManifestUnavailable (temporary)."""
    where = f"ExtractionBatch {batch.metadata.namespace or 'default'}/{batch.metadata.name}: spec.manifestUri"
    uri = batch.spec.manifest_uri
    if uri is None:
        raise ValueError(f"{where} is not set")
    try:
        namespace = batch.metadata.namespace or "default"  # trusted: the resource's, never the manifest's
        async with manifest_lines.spool(uri, settings=documents, namespace=namespace) as spooled:
            yield spooled
    except manifest_lines.ManifestInvalid as exc:
        raise InvalidManifest(message=f"{where}: {exc}", line=exc.line) from None
    except manifest_lines.ManifestUnavailable as exc:
        raise manifest_lines.ManifestUnavailable(f"{where}: {exc}") from None


async def check_batch(
        conn: asyncpg.Connection,
        batch: specs.ExtractionBatch,
        *,
        jobs: int | None = None,
        document_bytes: int | None = None,
) -> Admissible:
    """Every rule of the tenant's quota for this batch; raises AdmissionRejected naming the tenant,
    the field and the values. `jobs` and `document_bytes` are the batch's size; None while it is not
    known (a manifest not read yet): then only a queue with no room at all is refused."""
    with _counted_rejections():
        return await _check_batch(conn, batch, jobs=jobs, document_bytes=document_bytes)


async def _check_batch(
        conn: asyncpg.Connection,
        batch: specs.ExtractionBatch,
        *,
        jobs: int | None,
        document_bytes: int | None,
) -> Admissible:
    namespace = batch.metadata.namespace or "default"
    spec = batch.spec
    pool_name = pool_key(spec.inference_pool_ref.namespace or namespace, spec.inference_pool_ref.name)
    context = await registry.admission_context(conn, namespaces=[namespace], pools=[pool_name], endpoints=[])
    tenant, rules, pool = _rules(
        context,
        namespace=namespace,
        subject=f"ExtractionBatch {namespace}/{batch.metadata.name}",
        field_prefix="spec.",
        priority=spec.priority,
        pool_name=pool_name,
    )
    idempotency_key = accepting.idempotency_key(
        namespace=namespace, name=batch.metadata.name, uid=batch.metadata.uid or ""
    )
    existing = await registry.batch_exists(conn, tenant=tenant, idempotency_key=idempotency_key)
    if not existing:
        _check_room(rules, context.queued[tenant], jobs=jobs, document_bytes=document_bytes)
    return Admissible(tenant=tenant, pool=pool, existing=existing)


async def check_document(
        conn: asyncpg.Connection,
        *,
        namespace: str,
        key: str,
        priority: str,
        pool_name: PoolName,
        endpoint: str | None,
        document_bytes: int,
) -> Admissible:
    """Every rule of the tenant's quota for one more document of `namespace` (the trusted
    context: the caller's authenticated namespace, never the request body), and that its
    DeliveryEndpoint (`namespace/name`) exists. Raises AdmissionRejected naming the field."""
    (verdict,) = await check_documents(conn, [DocumentCheck(
        namespace=namespace, key=key, priority=priority, pool_name=pool_name, endpoint=endpoint,
        document_bytes=document_bytes,
    )])  # fmt: skip
    if isinstance(verdict, AdmissionRejected):
        raise verdict
    return verdict


@dataclasses.dataclass(frozen=True)
class DocumentCheck:
    """One document of `check_documents`: what `check_document` takes for it."""

    namespace: str
    key: str
    priority: str
    pool_name: PoolName
    endpoint: str | None
    document_bytes: int


def context_asked(documents: Sequence[DocumentCheck]) -> tuple[list[str], list[str], list[str]]:
    """The namespaces, pools and endpoints the admission context of `documents` covers (each once):
    what `registry.admission_context` (or a statement including it) is asked for."""
    namespaces = sorted({d.namespace for d in documents})
    pools = sorted({str(d.pool_name) for d in documents})
    endpoints = sorted({d.endpoint for d in documents if d.endpoint is not None})
    return namespaces, pools, endpoints


async def check_documents(
        conn: asyncpg.Connection,
        documents: Sequence[DocumentCheck],
        *,
        context: registry.AdmissionContext | None = None,
) -> list[Admissible | AdmissionRejected]:
    """`check_document` for many documents at once, one verdict each, in order: the same rules and
    messages, over one admission context read for them all (`context`, when the caller read it in a
    statement of its own: `context_asked` says what it must cover), each document counted against its
    tenant's queue after the ones before it in the list that were admitted (as if they had been
    checked and accepted one after another)."""
    if context is None:
        namespaces, pools, endpoints = context_asked(documents)
        context = await registry.admission_context(conn, namespaces=namespaces, pools=pools, endpoints=endpoints)
    queued = dict(context.queued)
    verdicts: list[Admissible | AdmissionRejected] = []
    for document in documents:
        subject = f"document {document.key!r} in namespace {document.namespace}"
        try:
            with _counted_rejections():
                tenant, rules, pool = _rules(
                    context, namespace=document.namespace, subject=subject, field_prefix="",
                    priority=document.priority, pool_name=document.pool_name,
                )  # fmt: skip
                if document.endpoint is not None and document.endpoint not in context.endpoints:
                    message = f"DeliveryEndpoint {document.endpoint} does not exist"
                    raise AdmissionRejected(
                        reason=reasons.INVALID_SPEC, message=f"{subject}: deliveryEndpointRef: {message}",
                        fields=[FieldError("deliveryEndpointRef", message)],
                    )  # fmt: skip
                jobs_now, bytes_now = queued[tenant]
                _check_room(rules, (jobs_now, bytes_now), jobs=1, document_bytes=document.document_bytes)
        except AdmissionRejected as exc:
            verdicts.append(exc)
            continue
        queued[tenant] = (jobs_now + 1, bytes_now + document.document_bytes)
        verdicts.append(Admissible(tenant=tenant, pool=pool, existing=False))
    return verdicts


def _rules(
        context: registry.AdmissionContext,
        *,
        namespace: str,
        subject: str,
        field_prefix: str,
        priority: str,
        pool_name: PoolName,
) -> tuple[TenantName, registry.TenantRules, registry.Pool]:
    """The rules every admission shares: a tenant for the namespace, its allowed priorities and
    pools, and the pool's existence, decided on `context` (which covers `namespace` and
    `pool_name`). `subject` and `field_prefix` say what the messages name."""
    tenant = context.tenant(namespace)
    rules = None if tenant is None else context.rules.get(tenant)
    if tenant is None or rules is None:
        claimants = context.claimants.get(namespace, ())
        if len(claimants) > 1:  # a namespace listed by two quotas is admitted by neither
            raise AdmissionRejected(
                reason=reasons.NO_TENANT_QUOTA,
                message=f"namespace {namespace} is listed by TenantQuotas {', '.join(claimants)}: a namespace "
                "listed by more than one quota belongs to none of them; remove it from all but one",
            )
        raise AdmissionRejected(
            reason=reasons.NO_TENANT_QUOTA, message=f"namespace {namespace} is not covered by any TenantQuota"
        )
    if rules.allowed_priorities is not None and priority not in rules.allowed_priorities:
        message = (
            f"TenantQuota {tenant} does not allow priority {priority} "
            f"(allowedPriorities: {', '.join(rules.allowed_priorities) or 'none'})"
        )
        raise AdmissionRejected(
            reason=reasons.PRIORITY_NOT_ALLOWED,
            message=f"{subject}: {field_prefix}priority: {message}",
            fields=[FieldError(f"{field_prefix}priority", message)],
        )
    if rules.allowed_pools is not None and pool_name not in rules.allowed_pools:
        # Checked before existence: a tenant learns nothing about pools it may not use.
        message = (
            f"TenantQuota {tenant} does not allow InferencePool {pool_name} "
            f"(allowedPools: {', '.join(rules.allowed_pools) or 'none'})"
        )
        raise AdmissionRejected(
            reason=reasons.POOL_NOT_ALLOWED,
            message=f"{subject}: {field_prefix}inferencePoolRef: {message}",
            fields=[FieldError(f"{field_prefix}inferencePoolRef", message)],
        )
    pool = context.pools.get(pool_name)
    if pool is None:
        raise AdmissionRejected(
            reason=reasons.POOL_NOT_FOUND, message=f"InferencePool {pool_name} does not exist",
            fields=[FieldError(f"{field_prefix}inferencePoolRef", f"InferencePool {pool_name} does not exist")],
        )  # fmt: skip
    _require_budget_currency(rules, pool, subject=subject, field_prefix=field_prefix)
    return tenant, rules, pool


def _require_budget_currency(
        rules: registry.TenantRules, pool: registry.Pool, *, subject: str, field_prefix: str
) -> None:
    """A tenant with a money budget may use only pools priced in its currency (or unpriced ones): a
    budget never converts with an exchange rate, so a pool priced otherwise is refused, not ignored."""
    pricing = costing.Pricing.from_stored(pool.spec)
    if rules.budget_currency is None or pricing is None or pricing.currency == rules.budget_currency:
        return
    message = (
        f"InferencePool {pool.name} is priced in {pricing.currency} but TenantQuota {rules.tenant} budgets in "
        f"{rules.budget_currency}; a budget counts only pools priced in its own currency (no exchange rates): "
        f"use a pool priced in {rules.budget_currency}"
    )
    raise AdmissionRejected(
        reason=reasons.CURRENCY_MISMATCH,
        message=f"{subject}: {field_prefix}inferencePoolRef: {message}",
        fields=[FieldError(f"{field_prefix}inferencePoolRef", message)],
    )


def _check_room(
        rules: registry.TenantRules,
        queued: tuple[int, int],
        *,
        jobs: int | None,
        document_bytes: int | None,
) -> None:
    """maxQueuedJobs and maxQueuedBytes against what the tenant has `queued` now (jobs, bytes). A size
    of None (a manifest not read yet) is refused only when the queue is already full."""
    tenant = rules.tenant
    queued_jobs, queued_bytes = queued
    if rules.max_queued_jobs is not None:
        _require_room(tenant, queued=queued_jobs, more=jobs, limit=rules.max_queued_jobs, unit="queued jobs",
                      field="maxQueuedJobs")
    if rules.max_queued_bytes is not None:
        _require_room(tenant, queued=queued_bytes, more=document_bytes, limit=rules.max_queued_bytes,
                      unit="bytes queued", field="maxQueuedBytes")


def _require_room(tenant: TenantName, *, queued: int, more: int | None, limit: int, unit: str, field: str) -> None:
    if more is None and queued >= limit:
        raise AdmissionRejected(
            reason=reasons.QUOTA_EXCEEDED,
            message=f"tenant {tenant} has {queued} {unit}; {field}={limit} leaves no room",
        )
    if more is not None and queued + more > limit:
        raise AdmissionRejected(
            reason=reasons.QUOTA_EXCEEDED,
            message=f"tenant {tenant} has {queued} {unit}; {more} more would exceed {field}={limit}",
        )


@contextlib.asynccontextmanager
async def read_manifest_for_admission(
        db: asyncpg.Pool,
        batch: specs.ExtractionBatch,
        *,
        documents: DocumentSettings,
        downloads: asyncio.Semaphore | None = None,
) -> AsyncIterator[manifest_lines.Spooled]:
    """Steps 1 and 2 of a manifest batch's admission: the rules (a short use of one connection of
    `db`), then the manifest read into a spool holding no connection, one of `downloads` permits
    held while it is read. Raises AdmissionRejected before anything is downloaded, InvalidManifest,
    or ManifestUnavailable (temporary)."""
    async with db.acquire() as conn:
        await check_batch(conn, batch)
    async with contextlib.AsyncExitStack() as stack:
        async with downloads if downloads is not None else contextlib.nullcontext():
            with _counted_rejections():
                spooled = await stack.enter_async_context(spool_manifest(batch, documents=documents))
        yield spooled


async def admit_batch_via_pool(
        db: asyncpg.Pool,
        batch: specs.ExtractionBatch,
        *,
        documents: DocumentSettings,
        downloads: asyncio.Semaphore | None = None,
) -> AppliedBatch:
    """Admission taking connections from `db` only while it uses the database: a manifest is read
    with none held (see the module's docstring), so a slow manifest stalls no other admission."""
    if batch.spec.manifest_uri is None:
        async with db.acquire() as conn:
            return await admit_batch(conn, batch)
    async with read_manifest_for_admission(db, batch, documents=documents, downloads=downloads) as spooled:
        async with db.acquire() as conn:
            return await admit_batch(conn, batch, manifest=spooled)


async def admit_batch(
        conn: asyncpg.Connection,
        batch: specs.ExtractionBatch,
        *,
        manifest: manifest_lines.Spooled | None = None,
        documents: DocumentSettings | None = None,
) -> AppliedBatch:
    """Resolve the tenant, check every rule of its quota (`check_batch`), accept. Idempotent like
    acceptance.

    A batch with spec.manifestUri takes its manifest from `manifest` (see `spool_manifest`);
    without one, the rules are checked, then it is read here with `documents` settings while
    `conn` stays held: callers that share connections use `admit_batch_via_pool`."""
    started_ns = tracing.now_ns()
    with _counted_rejections():
        applied = await _admit_batch(conn, batch, manifest=manifest, documents=documents)
    tracing.record("lading.admission", batch_id=applied.result.batch_id, started_ns=started_ns, attributes={
        "tenant": applied.tenant, "jobs": len(applied.result.job_ids), "created": applied.result.created,
    })
    return applied


async def _admit_batch(
        conn: asyncpg.Connection,
        batch: specs.ExtractionBatch,
        *,
        manifest: manifest_lines.Spooled | None,
        documents: DocumentSettings | None,
) -> AppliedBatch:
    namespace = batch.metadata.namespace or "default"
    spec = batch.spec
    if spec.manifest_uri is not None and manifest is None:
        await _check_batch(conn, batch, jobs=None, document_bytes=None)  # refused: nothing is read
        async with spool_manifest(batch, documents=documents or DocumentSettings()) as spooled:
            return await _admit_batch(conn, batch, manifest=spooled, documents=documents)
    if spec.manifest_uri is not None and (manifest is None or manifest.uri != spec.manifest_uri):
        raise ValueError(f"the spooled manifest is not the one ExtractionBatch {namespace}/{batch.metadata.name} names")
    if manifest is not None:
        jobs, document_bytes = manifest.documents, manifest.total_bytes
    else:
        inline = spec.documents or ()
        jobs, document_bytes = len(inline), sum(len(d.text.encode("utf-8")) for d in inline)
    admissible = await _check_batch(conn, batch, jobs=jobs, document_bytes=document_bytes)
    tenant, pool, pool_name = admissible.tenant, admissible.pool, admissible.pool.name
    request = accepting.BatchRequest(
        tenant=tenant,
        namespace=namespace,
        name=batch.metadata.name,
        uid=batch.metadata.uid or "",
        schema=spec.extraction_schema,
        pool=pool_name,
        model_policy={"pool": pool_name, "provider": pool.provider, "model": pool.model},
        validation_policy=spec.validation_policy,
        priority=spec.priority,
        deadline_s=spec.deadline_seconds,
        documents=[accepting.DocumentInput(key=d.key, text=d.text) for d in spec.documents or ()],
        manifest=manifest,
        endpoint=(
            f"{namespace}/{spec.delivery_endpoint_ref.name}" if spec.delivery_endpoint_ref is not None else None
        ),
        suspended=spec.suspend,
        reuse=spec.reuse,
    )
    try:
        result = await accepting.accept_batch(conn, request)
    except manifest_lines.ManifestInvalid as exc:  # rules over the whole manifest (unique keys)
        raise InvalidManifest(
            message=f"ExtractionBatch {namespace}/{batch.metadata.name}: spec.manifestUri: {exc}", line=exc.line
        ) from None
    except accepting.UnstorableRequest as exc:  # a value PostgreSQL refused: the spec must change
        raise AdmissionRejected(
            reason=reasons.INVALID_SPEC, message=f"ExtractionBatch {namespace}/{batch.metadata.name}: {exc}"
        ) from None
    return AppliedBatch(namespace=namespace, name=batch.metadata.name, tenant=tenant, pool=pool_name, result=result)


class _RulesChecked(Exception):
    """Rolls back the trial application of `apply_manifests` (the rules checked before downloads)."""


async def apply_manifests(
        conn: asyncpg.Connection,
        loaded: manifests.Manifests,
        *,
        documents: DocumentSettings | None = None,
) -> Sequence[AppliedBatch]:
    """Apply a validated manifest set in one transaction: all of it, or none of it.

    Batches with a document manifest (spec.manifestUri) are first checked against the rules in a
    trial transaction that is rolled back (the set's own quotas and pools applied), so a refused
    batch downloads nothing; their manifests are then read and validated before the transaction
    opens, which checks every batch again with its size."""
    settings = documents or DocumentSettings()
    by_manifest = [batch for batch in loaded.extraction_batches if batch.resource.spec.manifest_uri is not None]
    if by_manifest:
        with contextlib.suppress(_RulesChecked):
            async with conn.transaction():
                await _apply_definitions(conn, loaded)
                for batch in by_manifest:
                    with _sourced(batch):
                        await check_batch(conn, batch.resource)
                raise _RulesChecked
    async with contextlib.AsyncExitStack() as stack:
        spooled: list[manifest_lines.Spooled | None] = []
        for batch in loaded.extraction_batches:
            with _sourced(batch):
                spooled.append(
                    await stack.enter_async_context(spool_manifest(batch.resource, documents=settings))
                    if batch.resource.spec.manifest_uri is not None
                    else None
                )
        async with conn.transaction():
            await _apply_definitions(conn, loaded)
            applied = []
            for batch, manifest in zip(loaded.extraction_batches, spooled, strict=True):
                with _sourced(batch):
                    applied.append(await admit_batch(conn, batch.resource, manifest=manifest, documents=settings))
            return applied


@contextlib.contextmanager
def _sourced(batch: manifests.Loaded[specs.ExtractionBatch]) -> Iterator[None]:
    """A refusal of `batch` says where it was read."""
    try:
        yield
    except AdmissionRejected as exc:
        exc.source = batch.where
        raise


async def _apply_definitions(conn: asyncpg.Connection, loaded: manifests.Manifests) -> None:
    """The set's TenantQuotas, InferencePools and DeliveryEndpoints (inside the caller's transaction)."""
    for quota in loaded.tenant_quotas:
        await apply_tenant_quota(conn, quota.resource)
    for pool in loaded.inference_pools:
        await apply_inference_pool(conn, pool.resource)
    for endpoint in loaded.delivery_endpoints:
        await apply_delivery_endpoint(conn, endpoint.resource)
