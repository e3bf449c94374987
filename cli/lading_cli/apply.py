"""
`lading apply FILE...`: apply manifests to the database without a cluster, and exit.

What the operator mirrors from custom resources, written by the same core function
(`lading.applying.apply_manifests`): TenantQuotas, InferencePools and DeliveryEndpoints become
their rows, and ExtractionBatches are admitted (every rule of their tenant's quota) and accepted.
Secrets are checked (every secretRef in the files names a Secret and a key that exist) but never
written: secrets stay out of the database, and the processes that need them read them from their
own flags (`lading worker --endpoint-secrets-dir`, `$LADING_PROVIDER_API_KEY`).

All or nothing. The files are validated as a whole first (every problem listed, each naming the
file, the document and the field); then everything is applied in one transaction, and a refused
batch changes nothing. A file may refer to objects applied earlier: a batch's pool, quota or
endpoint missing from the files is looked up in the database (and refused when it is not there
either). `--dry-run` goes through all of it, the database's rules included, in a transaction that
is rolled back. Applying the same files again changes nothing: a batch is accepted once per
`namespace/name/uid`, and the same name with other documents is refused.

Nothing here migrates (`lading migrate` does): a database with pending migrations is refused.

    exit 0   applied (or, with --dry-run, would be)
    exit 2   invalid or refused: nothing was changed
    exit 3   the database cannot be reached or is not migrated: nothing was changed
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pathlib
import sys
from collections.abc import Sequence

import asyncpg

from lading import applying, errors, schema
from lading.db import pool as dbpool
from lading.db import registry
from lading.documents import manifest_lines
from lading.models import manifests
from lading.settings import DocumentSettings

EXIT_OK, EXIT_REFUSED, EXIT_DATABASE = 0, 2, 3


class _DryRun(Exception):
    """Rolls back the dry run's transaction after everything was applied and checked."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="+", type=pathlib.Path,
                        help="YAML manifests (several documents per file; a directory means its *.yaml files)")
    parser.add_argument(
        "--database-url", default=os.environ.get("DATABASE_URL"), help="PostgreSQL URL (default: $DATABASE_URL)"
    )
    parser.add_argument("--dry-run", action="store_true",
                        help="validate everything, the database's admission rules included, and change nothing")
    parser.add_argument(
        "--document-root", dest="document_roots", action="append", type=pathlib.Path, default=[], metavar="DIR",
        help="a document root: a batch of namespace NS reads its file:// manifest beneath DIR/NS/ (repeatable)",
    )  # fmt: skip


def run(args: argparse.Namespace) -> int:
    if not args.database_url:
        print("lading apply: --database-url or $DATABASE_URL is required", file=sys.stderr)
        return EXIT_REFUSED
    try:
        loaded = manifests.load_paths(args.files, standalone=False)
    except errors.ManifestError as exc:
        print(f"lading apply: invalid manifests (nothing was changed):\n{exc}", file=sys.stderr)
        return EXIT_REFUSED
    documents = DocumentSettings(roots=tuple(str(p.resolve()) for p in args.document_roots))
    try:
        lines = asyncio.run(_apply(args.database_url, loaded, documents=documents, dry_run=args.dry_run))
    except _Refused as exc:
        print(f"lading apply: not applied (nothing was changed):\n{exc}", file=sys.stderr)
        return EXIT_REFUSED
    except _DatabaseUnavailable as exc:
        print(f"lading apply: {exc}; nothing was changed", file=sys.stderr)
        return EXIT_DATABASE
    for line in lines:
        print(line)
    return EXIT_OK


class _Refused(Exception):
    """The set was refused (its message lists why, naming file, document and field)."""


class _DatabaseUnavailable(Exception):
    """The database cannot be reached or has migrations pending."""


async def _apply(
        dsn: str,
        loaded: manifests.Manifests,
        *,
        documents: DocumentSettings,
        dry_run: bool,
) -> list[str]:
    try:
        pending = await schema.pending_versions(dsn)
        conn = await dbpool.connect(dsn)
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        raise _DatabaseUnavailable(f"cannot use the database: {type(exc).__name__}: {exc}") from None
    try:
        if pending:
            raise _DatabaseUnavailable(
                f"the database is not migrated ({schema.describe(pending, migrator='`lading migrate`')})"
            )
        try:
            if dry_run:  # the same statements, rolled back (a manifest is then read inside the transaction)
                async with conn.transaction():
                    applied = await _apply_set(conn, loaded, documents=documents)
                    raise _DryRun
            applied = await _apply_set(conn, loaded, documents=documents)
        except _DryRun:
            pass
        except applying.AdmissionRejected as exc:
            raise _Refused(_describe(exc)) from None
        except (errors.IdempotencyConflict, manifest_lines.ManifestUnavailable) as exc:
            raise _Refused(str(exc)) from None
    finally:
        await conn.close()
    return _report(loaded, applied, dry_run=dry_run)


async def _apply_set(
        conn: asyncpg.Connection,
        loaded: manifests.Manifests,
        *,
        documents: DocumentSettings,
) -> Sequence[applying.AppliedBatch]:
    await _require_endpoints(conn, loaded)
    return await applying.apply_manifests(conn, loaded, documents=documents)


async def _require_endpoints(conn: asyncpg.Connection, loaded: manifests.Manifests) -> None:
    """A batch's DeliveryEndpoint is in the files or in the database (batch admission does not
    require one, as the operator may see the batch before its endpoint)."""
    in_files = {(e.resource.namespace, e.resource.name) for e in loaded.delivery_endpoints}
    problems = []
    for batch in loaded.extraction_batches:
        ref = batch.resource.spec.delivery_endpoint_ref
        namespace = batch.resource.namespace or manifests.DEFAULT_NAMESPACE
        if ref is None or (namespace, ref.name) in in_files:
            continue
        if not await registry.endpoint_exists(conn, name=f"{namespace}/{ref.name}"):
            problems.append(f"{batch.where}: spec.deliveryEndpointRef: DeliveryEndpoint {namespace}/{ref.name} is "
                            "neither in the files nor in the database")  # fmt: skip
    if problems:
        raise _Refused("\n".join(problems))


def _describe(exc: applying.AdmissionRejected) -> str:
    where = f"{exc.source}: " if exc.source else ""
    if exc.fields:
        return "\n".join(f"{where}{field.field}: {field.message} ({exc.reason})" for field in exc.fields)
    return f"{where}{exc} ({exc.reason})"


def _report(
        loaded: manifests.Manifests,
        applied: Sequence[applying.AppliedBatch],
        *,
        dry_run: bool,
) -> list[str]:
    suffix = " (dry run: nothing was changed)" if dry_run else ""
    lines = [f"tenantquota/{q.resource.name} configured{suffix}" for q in loaded.tenant_quotas]
    lines += [f"inferencepool {p.resource.display_name} configured{suffix}" for p in loaded.inference_pools]
    lines += [f"deliveryendpoint {e.resource.display_name} configured{suffix}" for e in loaded.delivery_endpoints]
    lines += [f"secret {s.resource.display_name} checked (never stored){suffix}" for s in loaded.secrets]
    for batch in applied:
        jobs = len(batch.result.job_ids)
        what = f"admitted: {jobs} jobs" if batch.result.created else f"unchanged: {jobs} jobs (accepted before)"
        lines.append(f"extractionbatch {batch.namespace}/{batch.name} {what}{suffix}")
    return lines
