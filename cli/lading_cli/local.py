"""
`lading run FILE...`: the whole system on one machine.

Reads the YAML a platform team would `kubectl apply` (TenantQuota, InferencePool,
DeliveryEndpoint, ExtractionBatch, Secret; several documents per file), validates all of
it before touching the database, applies it in one transaction through the same core
functions the operator uses, runs workers in-process until every batch is settled (each
job terminal or waiting for review), and prints a summary.

Batches with a DeliveryEndpoint are delivered by an in-process dispatcher, to the reference
receiver started in-process when the endpoint is on this machine (`lading_cli.local_delivery`);
the run waits for those deliveries too.

Without `--database-url`/`$DATABASE_URL` it starts an embedded PostgreSQL (a real server,
see `lading.db.embedded`) in `.lading/embedded/`, and stops and deletes it at exit unless
`--keep-data` is given.

An ExtractionBatch may give its documents by manifest (`spec.manifestUri`, JSON lines; see
docs/large-batches.md). A batch's file:// documents are read only beneath its namespace's
directories: `<root>/<namespace>/` of each `--document-root`, and the directory of a file://
manifest named by a batch of that namespace in the files given here (the person running
`lading run` wrote those files: their directory is trusted for that namespace, and only for it).
http(s) documents are read only from global addresses unless $LADING_EGRESS_ALLOW allows more.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import datetime as dt
import json
import os
import pathlib
import signal
import sys
import time
import urllib.parse
from collections.abc import Iterator, Sequence
from typing import Any

import asyncpg
import rich.console
import rich.table
from lading_worker import running

from lading import applying, errors
from lading.db import batches, deliveries, embedded, migrating, reuse, spend
from lading.db import pool as dbpool
from lading.documents import manifest_lines
from lading.jobs.states import JobState
from lading.models import manifests
from lading.settings import ClaimerSettings, DocumentSettings, ReaperSettings, WorkerProcessSettings
from lading_cli import local_delivery, progress

POLL_S = 0.25
"""How often progress is read from the database."""

SHUTDOWN_GRACE_S = 2.0
"""On timeout or Ctrl-C, attempts still running get this long; the rest stay leased and are
rescued by the next run's reaper (when the database persists)."""

EXIT_OK, EXIT_TIMEOUT, EXIT_INVALID = 0, 1, 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="+", type=pathlib.Path, help="YAML manifests (several documents per file)")
    parser.add_argument(
        "--database-url",
        default=os.environ.get("DATABASE_URL"),
        help="PostgreSQL URL (default: $DATABASE_URL, else an embedded server started for this run)",
    )
    parser.add_argument("--data-dir", type=pathlib.Path, help="data directory of the embedded server")
    parser.add_argument("--keep-data", action="store_true", help="keep the embedded server's data after the run")
    parser.add_argument("--workers", type=int, default=1, help="worker loops per InferencePool (default 1)")
    parser.add_argument("--concurrency", type=int, help="attempts in flight per worker (default: the pool's spec)")
    parser.add_argument("--timeout", type=float, help="exit 1 if batches are not settled after SECONDS")
    parser.add_argument("--json", action="store_true", help="print a machine-readable summary on stdout")
    parser.add_argument(
        "--document-root",
        dest="document_roots",
        action="append",
        type=pathlib.Path,
        default=[],
        metavar="DIR",
        help="a document root: a batch of namespace NS reads file:// documents beneath DIR/NS/ (repeatable; "
        "a file:// manifest's own directory is readable by the batches of its namespace)",
    )
    local_delivery.add_arguments(parser)


def run(args: argparse.Namespace) -> int:
    try:
        loaded = manifests.load_paths(args.files)
    except errors.ManifestError as exc:
        print(f"lading run: invalid manifests:\n{exc}", file=sys.stderr)
        return EXIT_INVALID
    if not loaded.extraction_batches:
        print("lading run: the manifests contain no ExtractionBatch; nothing to run", file=sys.stderr)
        return EXIT_INVALID
    with _database(args) as (dsn, kind):
        return asyncio.run(_run(dsn, kind, loaded, args))


@contextlib.contextmanager
def _database(args: argparse.Namespace) -> Iterator[tuple[str, str]]:
    if args.database_url:
        yield args.database_url, "external"
        return
    data_dir = args.data_dir or embedded.STATE_DIR / "embedded" / f"run-{os.getpid()}"
    with embedded.running(data_dir, delete_on_exit=not args.keep_data) as server:
        yield server.dsn, "embedded"


async def _run(dsn: str, kind: str, loaded: manifests.Manifests, args: argparse.Namespace) -> int:
    started = time.monotonic()
    conn = await dbpool.connect(dsn)
    try:
        await migrating.migrate(conn)
        documents = _document_settings(loaded, args)
        try:
            applied = await applying.apply_manifests(conn, loaded, documents=documents)
        except (applying.AdmissionRejected, errors.IdempotencyConflict, manifest_lines.ManifestUnavailable) as exc:
            print(f"lading run: not applied (nothing was changed): {exc}", file=sys.stderr)
            return EXIT_INVALID
    finally:
        await conn.close()

    settings = [dataclasses.replace(s, documents=documents) for s in _worker_settings(loaded, applied, args)]
    db = await dbpool.create_pool(dsn, min_size=2, max_size=4 + 4 * len(settings))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    keys = _api_keys(loaded)
    workers = [
        asyncio.create_task(running.Worker(db, settings=s, api_key=keys.get(s.pool)).run(stop), name=f"worker {s.pool}")
        for s in settings
    ]
    outgoing = contextlib.AsyncExitStack()
    try:
        delivery = await outgoing.enter_async_context(local_delivery.delivering(
            dsn=dsn, db=db, the_plan=local_delivery.plan(loaded, args), stop=stop, receiver=not args.no_receiver,
        ))  # fmt: skip
    except local_delivery.ReceiverUnavailable as exc:
        stop.set()
        await asyncio.gather(*workers, return_exceptions=True)
        await db.close()
        print(f"lading run: {exc}", file=sys.stderr)
        return EXIT_INVALID
    batch_ids = [a.result.batch_id for a in applied]
    display = _display(args)
    timed_out = False
    try:
        while True:
            snapshot = await _snapshot(db, applied)
            display.update(snapshot)
            if all(p.done for _, p in snapshot) and not await delivery.open_deliveries(batch_ids):
                break
            if args.timeout is not None and time.monotonic() - started > args.timeout:
                timed_out = True
                break
            crashed = [t for t in [*workers, delivery.task] if t is not None and t.done()]
            if crashed or stop.is_set():
                for task in crashed:
                    task.result()
                break
            await asyncio.sleep(POLL_S)
    finally:
        display.close()
        stop.set()
        await asyncio.gather(*workers, return_exceptions=True)
        await outgoing.aclose()
    try:
        summary = await _summary(db, applied, database=kind, elapsed_s=time.monotonic() - started)
    finally:
        await db.close()
    _print_summary(summary, as_json=args.json)
    if timed_out:
        print(f"lading run: batches not settled within {args.timeout:g} s", file=sys.stderr)
        return EXIT_TIMEOUT
    return EXIT_OK if all(b["settled"] for b in summary["batches"]) else EXIT_TIMEOUT


def _worker_settings(
        loaded: manifests.Manifests, applied: Sequence[applying.AppliedBatch], args: argparse.Namespace
) -> list[WorkerProcessSettings]:
    specs_by_pool = {
        applying.pool_key(p.resource.metadata.namespace or "default", p.resource.metadata.name): p.resource.spec
        for p in loaded.inference_pools
    }
    result = []
    for pool in sorted({a.pool for a in applied}):
        concurrency = args.concurrency or specs_by_pool[pool].workers.concurrency
        for _ in range(args.workers):
            result.append(
                WorkerProcessSettings(
                    pool=pool,
                    claimer=ClaimerSettings(concurrency=concurrency, poll_interval_s=0.2),
                    reaper=ReaperSettings(interval_s=1.0),
                    shutdown_grace_s=SHUTDOWN_GRACE_S,
                )
            )
    return result


def _document_settings(loaded: manifests.Manifests, args: argparse.Namespace) -> DocumentSettings:
    """Document roots from --document-root (`<root>/<namespace>/` per batch), plus each file://
    manifest's directory for the batches of its namespace; egress as configured."""
    roots = [str(path.resolve()) for path in args.document_roots]
    directories: list[tuple[str, str]] = []
    for item in loaded.extraction_batches:
        batch = item.resource
        uri = batch.spec.manifest_uri
        if uri is not None and urllib.parse.urlsplit(uri).scheme == "file":
            directory = os.path.dirname(urllib.parse.unquote(urllib.parse.urlsplit(uri).path))
            directories.append((batch.metadata.namespace or "default", directory))
    allow = local_delivery.egress_allow(args)
    return DocumentSettings(
        roots=tuple(dict.fromkeys(roots)),
        namespace_directories=tuple(dict.fromkeys(directories)),
        egress_allow=tuple(str(n) for n in allow),
    )


def _api_keys(loaded: manifests.Manifests) -> dict[str, str]:
    """Each pool's API key, from the Secret its endpoint references (validated at load time)."""
    keys: dict[str, str] = {}
    for item in loaded.inference_pools:
        pool = item.resource
        endpoint = pool.spec.endpoint
        if endpoint is not None and endpoint.api_key_secret_ref is not None:
            namespace = pool.metadata.namespace or "default"
            keys[applying.pool_key(namespace, pool.metadata.name)] = loaded.secret_value(
                namespace=namespace, ref=endpoint.api_key_secret_ref
            )
    return keys


def _display(args: argparse.Namespace) -> progress.Display:
    if not args.json and sys.stdout.isatty():
        return progress.LiveDisplay(rich.console.Console())
    return progress.PlainDisplay(sys.stderr if args.json else sys.stdout)


async def _snapshot(
        db: asyncpg.Pool, applied: Sequence[applying.AppliedBatch]
) -> list[tuple[str, batches.Progress]]:
    async with db.acquire() as conn:
        return [
            (
                f"{a.namespace}/{a.name}",
                await batches.progress(conn, batch_id=a.result.batch_id, total=len(a.result.job_ids)),
            )
            for a in applied
        ]


def _rfc3339(value: dt.datetime | None) -> str | None:
    return None if value is None else value.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")


async def _summary(
        db: asyncpg.Pool, applied: Sequence[applying.AppliedBatch], *, database: str, elapsed_s: float
) -> dict[str, Any]:
    out = []
    async with db.acquire() as conn:
        for a in applied:
            snapshot = await batches.progress(conn, batch_id=a.result.batch_id, total=len(a.result.job_ids))
            started_at, last_change_at = await batches.timing(conn, batch_id=a.result.batch_id)
            cost = await spend.batch_cost(conn, batch_id=a.result.batch_id)
            out.append(
                {
                    "namespace": a.namespace,
                    "name": a.name,
                    "tenant": a.tenant,
                    "pool": a.pool,
                    "total": snapshot.total,
                    "counts": {state.value: snapshot.counts[state] for state in JobState},
                    "delivered": await deliveries.count_delivered_of_batch(conn, batch_id=a.result.batch_id),
                    "reused": await reuse.count_reused_of_batch(conn, batch_id=a.result.batch_id),
                    "settled": snapshot.done,
                    "cost": None if cost is None else cost.to_json(),
                    "started_at": _rfc3339(started_at),
                    "completed_at": _rfc3339(last_change_at) if snapshot.done else None,
                }
            )
    return {"batches": out, "database": database, "elapsed_s": round(elapsed_s, 3)}


def _print_summary(summary: dict[str, Any], *, as_json: bool) -> None:
    if as_json:
        print(json.dumps(summary, indent=2))
        return
    table = rich.table.Table(title=f"Lading run ({summary['database']} database, {summary['elapsed_s']:.1f} s)")
    priced = any(b.get("cost") for b in summary["batches"])
    columns = ("batch", "total", "succeeded", "delivered", "review", "failed", "cancelled", "other", "settled")
    for column in (*columns, "cost") if priced else columns:
        table.add_column(column, justify="left" if column == "batch" else "right", overflow="fold", no_wrap=True)
    for b in summary["batches"]:
        counts = b["counts"]
        other = counts["READY"] + counts["RUNNING"] + counts["RETRY_SCHEDULED"]
        cost = [f"{b['cost']['amount']} {b['cost']['currency']}" if b.get("cost") else "-"] if priced else []
        table.add_row(
            f"{b['namespace']}/{b['name']}",
            str(b["total"]),
            str(counts["SUCCEEDED"]),
            str(b["delivered"]),
            str(counts["REVIEW_REQUIRED"]),
            str(counts["FAILED_TERMINAL"]),
            str(counts["CANCELLED"]),
            str(other),
            "yes" if b["settled"] else "no",
            *cost,
        )
    # A terminal gets its own width; logs and pipes get room for whole batch names.
    rich.console.Console(width=None if sys.stdout.isatty() else 120).print(table)
