"""
The operator process: database pool, API client, kopf's settings and handlers, health endpoints.

`operate(settings)` runs until `stop_flag` is set (or forever under `lading operator`). Everything
it shares lives in one `Runtime` created here and closed here, and the handlers are registered on
a registry of their own, so several operators can run in one process (tests do).

kopf settings, and why:
- progress and diff-base in annotations under `lading.dev`, never in `.status` (the CRDs' status
  schema is Lading's own; a `status.kopf` field would be pruned by the API server); no diff-base
  for ExtractionBatches, which have no create or update handlers (`DiffBaseStorage`);
- the finalizer `lading.dev/finalizer`: a batch's jobs are cancelled before the object goes;
- events: only those Lading posts on purpose (admission, completion, failures); kopf's own
  per-handler chatter is posted only from WARNING up, so a healthy steady state costs no API calls;
- watches end server-side after `watch_server_timeout_s` and are re-listed; Deployments and Services
  are watched with the label selector `app.kubernetes.io/managed-by=lading` (handlers/pools.py);
- standalone unless peering is asked for (one replica). With peering (HA: several replicas, one
  active), the replicas share one ClusterKopfPeering (`peering_name`), whatever namespaces they
  serve; each draws a random priority at start, and kopf pauses every replica that sees a live one
  of higher priority (equal priorities would pause both). A killed active replica is taken over
  once its record is `peering_lifetime_s` old; a stopped one hands over at once;
- with a fixed `--namespace` list, no namespace or CRD scanning: those namespaces are served as
  given, and the CRDs must exist when the operator starts.

The handlers of each kind are in `handlers/` (kopf decorators only); what they call lives in the
kind's module. InferencePools are served only in the platform namespaces of `--pool-namespaces` (pools.py); at
start, signing-secret mirrors found anywhere else are deleted (mirroring.py).

Once started, the garbage collector is tuned for many large objects (`tune_gc`: what exists after start
frozen, collections less often); that is process-wide.

Startup waits while the database has pending migrations (only `lading migrate` applies them; in
a cluster the chart's hook Job): admitting work into an older schema could lose it. Meanwhile
/readyz answers 503 with the pending versions and the log says what to run (`lading.schema`).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import random
from collections.abc import AsyncIterator
from typing import Any

import kopf

from lading import health, schema
from lading.db import catalog
from lading.db import pool as dbpool
from lading.models import specs
from lading_elected import gauges
from lading_operator import kopf_patching, kube, mirroring, runtime, settings
from lading_operator.handlers import batches, endpoints, pools, quotas

logger = logging.getLogger("lading.operator")

ANNOTATIONS_PREFIX = "lading.dev"
PEERING_PRIORITY_MAX = 2**31 - 1
"""Replicas draw their peering priority from 1..this: two equal draws are as good as impossible."""
FINALIZER = "lading.dev/finalizer"


class DiffBaseStorage(kopf.AnnotationsDiffBaseStorage):
    """kopf's diff-base in annotations, for the kinds whose create/update handlers need it; none for
    ExtractionBatches.

    kopf keeps a diff-base ("last-handled-configuration") only to tell creations and updates apart
    for `on.create`/`on.update`/`on.field` handlers. An ExtractionBatch has none (its loop wakes on
    a new generation, handlers/batches.py; its deletion is told by deletionTimestamp, not by a
    diff), yet storing it cost a patch of every new batch, one more watch event of the whole
    object, and a deep copy of the object on every event to compare. So a batch's essence is empty,
    as is its stored one: kopf sees no change, stores nothing, and reports no creation (an
    annotation an earlier version wrote stays unread).
    """

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        if body.get("kind") == specs.ExtractionBatch.KIND:
            return kopf.BodyEssence()
        return super().build(body=body, extra_fields=extra_fields)

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        if body.get("kind") == specs.ExtractionBatch.KIND:
            return kopf.BodyEssence()
        return super().fetch(body=body)


def kopf_settings(config: settings.OperatorSettings) -> kopf.OperatorSettings:
    result = kopf.OperatorSettings()
    result.persistence.finalizer = FINALIZER
    result.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=ANNOTATIONS_PREFIX)
    result.persistence.diffbase_storage = DiffBaseStorage(prefix=ANNOTATIONS_PREFIX, key="last-handled-configuration")
    result.posting.level = logging.WARNING
    result.watching.server_timeout = config.watch_server_timeout_s
    result.watching.client_timeout = config.watch_server_timeout_s + 60
    pools.select_owned(result)  # owned Deployments and Services only, not the cluster's
    if config.namespaces and not any(ch in ns for ns in config.namespaces for ch in "*?[]!"):
        # A fixed list of namespaces needs no namespace watch (and no RBAC to list namespaces);
        # CRDs are then discovered once at start: install them before the operator (the chart does).
        result.scanning.disabled = True
    result.peering.standalone = config.standalone
    result.peering.mandatory = not config.standalone
    result.peering.name = config.peering_name
    result.peering.clusterwide = True
    result.peering.lifetime = config.peering_lifetime_s
    result.peering.priority = random.randint(1, PEERING_PRIORITY_MAX)
    result.networking.request_timeout = kube.REQUEST_TIMEOUT_S
    # An object deleted while one of its timers runs waits for that run to end; kopf looks again
    # only after this many seconds (60 by default), which held deletions for a minute.
    result.background.cancellation_polling = CANCELLATION_POLLING_S
    return result


CANCELLATION_POLLING_S = 1.0
"""How often kopf looks whether a deleted object's timer or daemon has exited."""


def build_registry(rt: runtime.Runtime) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()

    @kopf.on.login(registry=registry)
    async def login(**_: Any) -> kopf.ConnectionInfo:
        # The credentials the operator's own client uses, renewed where they expired (kube.py).
        return await rt.cluster.connection_info()

    @kopf.on.startup(registry=registry)
    async def sweep_mirrors(**_: Any) -> None:
        try:
            await mirroring.sweep_outside_pool_namespaces(rt)
        except (OSError, kube.KubeError) as exc:  # refused pools' loops still sweep their own namespaces
            logger.warning("signing-secret mirrors outside the pool namespaces not swept: %s", exc)

    batches.register(registry, rt)
    quotas.register(registry, rt)
    endpoints.register(registry, rt)
    pools.register(registry, rt)
    return registry


@contextlib.asynccontextmanager
async def started(config: settings.OperatorSettings) -> AsyncIterator[runtime.Runtime]:
    """The runtime: a checked database pool and an API client, closed on exit."""
    cluster = await kube.load(config.kubeconfig)
    db = await dbpool.create_pool(config.database_url, min_size=1, max_size=config.db_pool_max)
    try:
        async with db.acquire() as conn:
            has_deliveries = await catalog.has_table(conn, name="deliveries")
        async with kube.Client(cluster) as api:
            yield runtime.Runtime(settings=config, db=db, api=api, cluster=cluster, has_deliveries=has_deliveries)
    finally:
        await db.close()


async def operate(
    config: settings.OperatorSettings,
    *,
    stop_flag: asyncio.Event | Any | None = None,
    ready_flag: asyncio.Event | Any | None = None,
) -> None:
    """Run the operator until `stop_flag` is set (an asyncio or threading Event), or forever."""
    async with contextlib.AsyncExitStack() as stack:
        if config.http is not None:  # first: /readyz explains a wait for migrations
            host, port = config.http
            await stack.enter_async_context(health.serving(config.database_url, host=host, port=port))
        stopping = asyncio.Event()
        follower = asyncio.create_task(_follow(stop_flag, stopping), name="stop flag")
        stack.callback(follower.cancel)
        if not await schema.wait_until_current(config.database_url, stop=stopping, what="operator"):
            return  # stopped while waiting
        rt = await stack.enter_async_context(started(config))
        # The operator stands for the gauge election too, so the gauges exist with workers scaled to zero.
        background = asyncio.Event()
        await stack.enter_async_context(gauges.refreshing(config.database_url, stop=background))
        tune_gc()
        kopf_patching.install()  # kopf's finalizer patch without deep-copying and diffing whole objects
        registry = build_registry(rt)
        _stopped_with_kopf(registry, background)
        await kopf.operator(
            registry=registry,
            settings=kopf_settings(config),
            clusterwide=not config.namespaces,
            namespaces=list(config.namespaces),
            standalone=config.standalone,
            stop_flag=stop_flag,
            ready_flag=ready_flag,
            memo=kopf.Memo(),
        )


def _stopped_with_kopf(registry: kopf.OperatorRegistry, background: asyncio.Event) -> None:
    """Set `background` (the gauge refresher's stop) when kopf stops, in its cleanup activity.

    At shutdown kopf waits up to 5 s for every task created since it started to end on its own,
    then cancels them. The refresher's loop started before kopf, but each of its waits between
    refreshes is such a task: left running, every stop (a SIGTERM, a rollout) took 5 s longer and
    the refresher went on while kopf was gone. kopf runs its cleanup handlers before that wait."""

    @kopf.on.cleanup(registry=registry)
    async def stop_background(**_: Any) -> None:
        background.set()


GC_THRESHOLDS = (50_000, 20, 20)
"""The garbage collector's thresholds while the operator runs (Python's defaults: 700, 10, 10). A batch
brings tens of thousands of objects (its object as kopf holds it, as decoded from each watch event, its
parsed spec); with the defaults a burst of 100 new batches of 1,000 documents ran over 1,400 young and 8
full collections, a sixth of the operator's CPU. Almost all of it is freed by reference counting, not by
the collector, so collecting less often costs little memory: 300 young and 3 full collections then."""


def tune_gc() -> None:
    """Collect once, move what exists after start (modules, classes, the clients) out of the collector's
    sight for good (`gc.freeze`: every full collection walked it), and set GC_THRESHOLDS. Process-wide."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


async def _follow(flag: asyncio.Event | Any | None, stopping: asyncio.Event) -> None:
    """Set `stopping` once `flag` is set: an asyncio Event is awaited; a threading Event (an operator
    run in a thread, as tests do) is looked at every STOP_FLAG_POLL_S; None never stops."""
    if flag is None:
        return
    if isinstance(flag, asyncio.Event):
        await flag.wait()
    else:
        while not flag.is_set():  # noqa: ASYNC110 (a threading.Event cannot wake a coroutine)
            await asyncio.sleep(STOP_FLAG_POLL_S)
    stopping.set()


STOP_FLAG_POLL_S = 0.1
"""How often a threading stop flag is looked at while waiting for migrations."""
