"""
Applying resources to the data plane: the functions the operator's handlers and
`lading run` share, so both admit work the same way.

    TenantQuota       -> tenants row
    InferencePool     -> pools row       (`namespace/name`)
    DeliveryEndpoint  -> endpoints row   (URL only; secrets stay in Secrets, never in the database)
    ExtractionBatch   -> admission: tenant from the namespace (trusted context), quota
                         and policy checks, then `accepting.accept_batch`

`apply_manifests` applies a whole validated manifest set in one transaction: either all
of it is applied or none of it.

A batch with `spec.manifestUri` has its document manifest read and validated first, into a
local spool, outside any transaction (`lading.documents.manifests.spool`); acceptance then
bulk-loads it. An invalid manifest is `InvalidManifest` (reason `InvalidManifest`: nothing
admitted, fix the manifest); one that cannot be read now is
`lading.documents.manifests.ManifestUnavailable` (a TemporaryError, reason
`ManifestUnavailable`: retry admission unchanged).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator, Sequence

import asyncpg

from lading import accepting, errors, metrics, tracing
from lading.db import registry
from lading.documents import manifests as document_manifests
from lading.ids import PoolName, TenantName
from lading.models import manifests, specs
from lading.settings import DocumentSettings


class AdmissionRejected(errors.PermanentError):
    """A batch was not admitted; `reason` is the condition reason (CamelCase)."""

    def __init__(self, *, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class InvalidManifest(AdmissionRejected):
    """The batch's document manifest has an invalid line (or is empty, too large, refused):
    nothing was admitted. The message names the line and the field."""

    def __init__(self, *, message: str, line: int | None = None) -> None:
        super().__init__(reason=document_manifests.ManifestInvalid.reason, message=message)
        self.line = line


@dataclasses.dataclass(frozen=True)
class AppliedBatch:
    namespace: str
    name: str
    tenant: TenantName
    pool: PoolName
    result: accepting.AcceptResult


def pool_key(namespace: str, name: str) -> PoolName:
    return PoolName(f"{namespace}/{name}")


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
    spec = pool.spec
    await registry.upsert_pool(
        conn,
        name=pool_key(pool.metadata.namespace or "default", pool.metadata.name),
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
) -> AsyncIterator[document_manifests.Spooled]:
    """Read and validate the batch's manifest into a local spool, for `admit_batch(manifest=...)`.

    Call it outside any transaction (an http(s) manifest is read over the network). Raises
    InvalidManifest, or ManifestUnavailable (temporary)."""
    where = f"ExtractionBatch {batch.metadata.namespace or 'default'}/{batch.metadata.name}: spec.manifestUri"
    uri = batch.spec.manifest_uri
    if uri is None:
        raise ValueError(f"{where} is not set")
    try:
        async with document_manifests.spool(uri, settings=documents) as spooled:
            yield spooled
    except document_manifests.ManifestInvalid as exc:
        raise InvalidManifest(message=f"{where}: {exc}", line=exc.line) from None
    except document_manifests.ManifestUnavailable as exc:
        raise document_manifests.ManifestUnavailable(f"{where}: {exc}") from None


async def admit_batch(
        conn: asyncpg.Connection,
        batch: specs.ExtractionBatch,
        *,
        manifest: document_manifests.Spooled | None = None,
        documents: DocumentSettings | None = None,
) -> AppliedBatch:
    """Resolve the tenant, check quota and policy, accept. Idempotent like acceptance.

    A batch with spec.manifestUri takes its manifest from `manifest` (see `spool_manifest`);
    without one, it is read here with `documents` settings, so callers that hold a
    transaction should spool first."""
    started_ns = tracing.now_ns()
    try:
        applied = await _admit_batch(conn, batch, manifest=manifest, documents=documents)
    except AdmissionRejected as exc:
        metrics.ADMISSION_REJECTIONS.labels(exc.reason).inc()  # reasons are a closed CamelCase set
        raise
    tracing.record("lading.admission", batch_id=applied.result.batch_id, started_ns=started_ns, attributes={
        "tenant": applied.tenant, "jobs": len(applied.result.job_ids), "created": applied.result.created,
    })
    return applied


async def _admit_batch(
        conn: asyncpg.Connection,
        batch: specs.ExtractionBatch,
        *,
        manifest: document_manifests.Spooled | None,
        documents: DocumentSettings | None,
) -> AppliedBatch:
    namespace = batch.metadata.namespace or "default"
    spec = batch.spec
    if spec.manifest_uri is not None and manifest is None:
        async with spool_manifest(batch, documents=documents or DocumentSettings()) as spooled:
            return await _admit_batch(conn, batch, manifest=spooled, documents=documents)
    tenant = await registry.tenant_for_namespace(conn, namespace=namespace)
    if tenant is None:
        claimants = await registry.tenants_for_namespace(conn, namespace=namespace)
        if len(claimants) > 1:  # a namespace listed by two quotas is admitted by neither
            raise AdmissionRejected(
                reason="NoTenantQuota",
                message=f"namespace {namespace} is listed by TenantQuotas {', '.join(claimants)}: a namespace "
                "listed by more than one quota belongs to none of them; remove it from all but one",
            )
        raise AdmissionRejected(
            reason="NoTenantQuota", message=f"namespace {namespace} is not covered by any TenantQuota"
        )
    pool_name = pool_key(spec.inference_pool_ref.namespace or namespace, spec.inference_pool_ref.name)
    pool = await registry.get_pool(conn, name=pool_name)
    if pool is None:
        raise AdmissionRejected(reason="PoolNotFound", message=f"InferencePool {pool_name} does not exist")
    if spec.manifest_uri is not None and (manifest is None or manifest.uri != spec.manifest_uri):
        raise ValueError(f"the spooled manifest is not the one ExtractionBatch {namespace}/{batch.metadata.name} names")
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
    )
    limit = await registry.tenant_max_queued_jobs(conn, tenant=tenant)
    existing = await registry.batch_exists(conn, tenant=tenant, idempotency_key=request.idempotency_key)
    if limit is not None and not existing:
        queued = await registry.tenant_queued_jobs(conn, tenant=tenant)
        if queued + request.document_count > limit:
            raise AdmissionRejected(
                reason="QuotaExceeded",
                message=f"tenant {tenant} has {queued} queued jobs; {request.document_count} more would exceed "
                f"maxQueuedJobs={limit}",
            )
    try:
        result = await accepting.accept_batch(conn, request)
    except document_manifests.ManifestInvalid as exc:  # rules over the whole manifest (unique keys)
        raise InvalidManifest(
            message=f"ExtractionBatch {namespace}/{batch.metadata.name}: spec.manifestUri: {exc}", line=exc.line
        ) from None
    return AppliedBatch(namespace=namespace, name=batch.metadata.name, tenant=tenant, pool=pool_name, result=result)


async def apply_manifests(
        conn: asyncpg.Connection,
        loaded: manifests.Manifests,
        *,
        documents: DocumentSettings | None = None,
) -> Sequence[AppliedBatch]:
    """Apply a validated manifest set in one transaction: all of it, or none of it.

    Document manifests (spec.manifestUri) are read and validated before the transaction opens."""
    settings = documents or DocumentSettings()
    async with contextlib.AsyncExitStack() as stack:
        spooled = [
            await stack.enter_async_context(spool_manifest(batch.resource, documents=settings))
            if batch.resource.spec.manifest_uri is not None
            else None
            for batch in loaded.extraction_batches
        ]
        async with conn.transaction():
            for quota in loaded.tenant_quotas:
                await apply_tenant_quota(conn, quota.resource)
            for pool in loaded.inference_pools:
                await apply_inference_pool(conn, pool.resource)
            for endpoint in loaded.delivery_endpoints:
                await apply_delivery_endpoint(conn, endpoint.resource)
            return [
                await admit_batch(conn, batch.resource, manifest=manifest, documents=settings)
                for batch, manifest in zip(loaded.extraction_batches, spooled, strict=True)
            ]
