"""
The worker process: `python -m lading_worker` or `lading worker`.

Waits until the database's schema is current (only `lading migrate` applies migrations; until
then /readyz says which are pending and the log says what to run), then runs one Worker for one
pool until SIGTERM/SIGINT, draining in-flight attempts within the grace period.

With `--processes N` above 1 (the default: the CPUs available), the command is a supervisor of N
such worker processes instead (docs/operations.md); --concurrency, --prefetch and --delivery-concurrency
are then totals, split evenly across them. `--processes 1` runs the worker in this process.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import os
import signal
from collections.abc import Sequence

from lading import health, logs, schema
from lading.delivery import egress
from lading.delivery import secrets as delivery_secrets
from lading.documents import fetching
from lading.settings import (
    AttemptSettings,
    BrokerTopology,
    ClaimerSettings,
    DeliverySettings,
    DocumentSettings,
    EventSettings,
    LeaseSettings,
    ReaperSettings,
    WorkerProcessSettings,
)
from lading_worker import broker, cleaning, dispatching, running, supervising

DOCUMENT_ROOTS_ENV = "LADING_DOCUMENT_ROOTS"
"""Document roots, ':'-separated (e.g. the shared volume's mount); a batch reads beneath `<root>/<namespace>/`."""

API_KEY_ENV = "LADING_PROVIDER_API_KEY"
PROVIDER_URL_ENV = "LADING_PROVIDER_URL"
"""Base URL of a vLLM pool's Service (…/v1); set by the operator in the worker Deployment."""
"""The model endpoint's API key, injected from the pool's Secret (never a flag: flags show in `ps`)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--database-url", default=os.environ.get("DATABASE_URL"), help="default: $DATABASE_URL")
    parser.add_argument("--pool", required=True, help="InferencePool as namespace/name")
    parser.add_argument(
        "--processes", type=positive_int, metavar="N",
        help="worker processes: above 1, this command supervises N of them (restarts one that dies, passes "
        "SIGTERM on, serves --http for all) and --concurrency, --prefetch and --delivery-concurrency are "
        "totals split evenly across them; 1: the worker runs in this process (default: the CPUs this process "
        "may use, bounded by the cgroup's CPU quota, at most --concurrency)",
    )  # fmt: skip
    parser.add_argument("--supervised-by", type=int, metavar="PID", help=argparse.SUPPRESS)
    parser.add_argument(
        "--concurrency", type=int, default=ClaimerSettings.concurrency,
        help=f"attempts in flight (default {ClaimerSettings.concurrency})",
    )  # fmt: skip
    parser.add_argument("--claim-batch", type=int, default=ClaimerSettings.batch_size)
    parser.add_argument(
        "--commit-batch", type=int, default=ClaimerSettings.commit_batch_size,
        help=f"completions committed in one transaction, at most (default {ClaimerSettings.commit_batch_size})",
    )  # fmt: skip
    parser.add_argument(
        "--prefetch", type=int, default=ClaimerSettings.prefetch, help="jobs claimed ahead of free slots"
    )
    parser.add_argument("--poll-interval", type=float, default=ClaimerSettings.poll_interval_s)
    parser.add_argument("--lease-ttl", type=float, default=LeaseSettings.ttl_s)
    parser.add_argument("--heartbeat-interval", type=float, default=LeaseSettings.heartbeat_interval_s)
    parser.add_argument("--reaper-interval", type=float, default=ReaperSettings.interval_s)
    parser.add_argument("--attempt-timeout", type=float, default=AttemptSettings.timeout_s)
    parser.add_argument(
        "--backoff-base", type=float, default=AttemptSettings.backoff_base_s,
        help="seconds a failed attempt's first retry waits at most (full jitter, doubling per attempt); an invalid "
             "answer is retried at once",
    )
    parser.add_argument("--grace", type=float, default=WorkerProcessSettings.shutdown_grace_s)
    parser.add_argument(
        "--document-root",
        dest="document_roots",
        action="append",
        metavar="DIR",
        help="document root: a batch of namespace NS reads file:// documents beneath DIR/NS/ (repeatable; default: "
        f"${DOCUMENT_ROOTS_ENV}, ':'-separated; none: file:// documents are refused)",
    )
    parser.add_argument(
        "--egress-allow",
        action="append",
        metavar="CIDR",
        help="let deliveries (and document fetches) connect to this otherwise refused range, e.g. 10.20.0.0/16 "
        f"(repeatable; added to ${egress.ENV_VAR}, comma-separated)",
    )
    parser.add_argument(
        "--endpoint-secrets-dir",
        default=os.environ.get(delivery_secrets.ENV_VAR),
        metavar="DIR",
        help="signing secrets of DeliveryEndpoints, one file <namespace>.<name> each, a secret per line "
        f"(default: ${delivery_secrets.ENV_VAR}; none: deliveries wait, counted)",
    )
    parser.add_argument(
        "--no-dispatcher", action="store_true", help="do not send deliveries from this process"
    )
    parser.add_argument("--delivery-concurrency", type=int, default=DeliverySettings.concurrency)
    parser.add_argument(
        "--delivery-lease-ttl", type=float, default=DeliverySettings.lease_ttl_s,
        help="seconds a claimed delivery is owned; a dead dispatcher's deliveries are retried after this",
    )
    parser.add_argument(
        "--amqp-url",
        default=os.environ.get(broker.AMQP_URL_ENV),
        help=f"RabbitMQ: also run the outbox relay and the ingress consumer (default: ${broker.AMQP_URL_ENV}, "
        "which is better: a flag shows in `ps`; none: no broker, claimers wake by LISTEN/NOTIFY and polling)",
    )
    parser.add_argument("--topology-prefix", default="", help="put in front of every RabbitMQ name (docs/events.md)")
    parser.add_argument(
        "--http",
        metavar="HOST:PORT",
        help="serve /metrics, /healthz and /readyz here (e.g. 0.0.0.0:9464 in a pod); off by default",
    )
    _add_cleaner_arguments(parser)


_RETENTION_FLAGS = (
    ("--retain-published-events-hours", "outbox_published_s", "published outbox events, after publication"),
    ("--retain-inbox-hours", "inbox_s", "ingress inbox rows: the dedup window (at least 24)"),
    ("--retain-quarantine-hours", "quarantine_s", "quarantined inbox redeliveries"),
    ("--retain-delivered-hours", "delivered_s", "DELIVERED deliveries and their attempts, after delivery"),
    ("--retain-stale-completions-hours", "stale_completions_s", "stale-completion records"),
    ("--retain-limiter-hours", "limiter_s", "limiter permits holding no slot, and per-second sums"),
    ("--retain-gpu-intervals-hours", "gpu_intervals_s",
     "closed GPU-time intervals of pools priced by the GPU hour, after the interval started"),
    ("--retain-idempotency-keys-hours", "api_requests_s",
     "Idempotency-Key records of the HTTP intake and of single documents (HTTP and queue), after the answer "
     "(at least 24)"),
)
"""`lading worker` retention flags, in hours, and the CleanerSettings field (seconds) each sets."""


def _add_cleaner_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("retention (the cleaner runs in one elected worker; docs/operations.md)")
    group.add_argument("--cleaner-interval", type=float, default=cleaning.CleanerSettings.interval_s,
                       help="seconds between cleaning rounds")
    group.add_argument("--cleaner-batch", type=int, default=cleaning.CleanerSettings.batch_size,
                       help="rows per DELETE statement")
    group.add_argument("--cleaner-max-batches", type=int, default=cleaning.CleanerSettings.max_batches,
                       help="DELETE statements per table per round")
    for flag, field, what in _RETENTION_FLAGS:
        default_h = getattr(cleaning.CleanerSettings, field) / cleaning.HOUR_S
        group.add_argument(flag, type=float, default=default_h, help=f"keep {what} this long (default {default_h:g})")


def cleaner_from(args: argparse.Namespace) -> cleaning.CleanerSettings:
    """The cleaner's settings from the flags; a ValueError names the flag's field that is wrong."""
    retentions = {
        field: getattr(args, flag.removeprefix("--").replace("-", "_")) * cleaning.HOUR_S
        for flag, field, _ in _RETENTION_FLAGS
    }
    return cleaning.CleanerSettings(
        interval_s=args.cleaner_interval, batch_size=args.cleaner_batch, max_batches=args.cleaner_max_batches,
        **retentions,
    )


def settings_from(args: argparse.Namespace) -> WorkerProcessSettings:
    return WorkerProcessSettings(
        pool=args.pool,
        lease=LeaseSettings(ttl_s=args.lease_ttl, heartbeat_interval_s=args.heartbeat_interval),
        claimer=ClaimerSettings(
            concurrency=args.concurrency,
            batch_size=args.claim_batch,
            prefetch=args.prefetch,
            poll_interval_s=args.poll_interval,
            commit_batch_size=args.commit_batch,
        ),
        reaper=ReaperSettings(interval_s=args.reaper_interval),
        attempt=AttemptSettings(
            timeout_s=args.attempt_timeout, backoff_base_s=args.backoff_base
        ),
        documents=DocumentSettings(
            roots=tuple(args.document_roots or fetching.roots_from_env(os.environ.get(DOCUMENT_ROOTS_ENV))),
            egress_allow=tuple(str(network) for network in _egress_allow(args)),
        ),
        shutdown_grace_s=args.grace,
    )


def _egress_allow(args: argparse.Namespace) -> tuple[egress.IPNetwork, ...]:
    """`--egress-allow` flags and `$LADING_EGRESS_ALLOW`, together."""
    return egress.parse_cidrs([*(args.egress_allow or ()), os.environ.get(egress.ENV_VAR, "")])


def delivery_from(args: argparse.Namespace) -> dispatching.DeliveryConfig | None:
    """The dispatcher's configuration, or None with `--no-dispatcher`."""
    if args.no_dispatcher:
        return None
    source: delivery_secrets.SecretSource = (
        delivery_secrets.DirectorySecrets(args.endpoint_secrets_dir)
        if args.endpoint_secrets_dir else delivery_secrets.StaticSecrets({})
    )
    return dispatching.DeliveryConfig(
        secrets=source,
        policy=egress.EgressPolicy(allow=_egress_allow(args)),
        settings=DeliverySettings(
            concurrency=args.delivery_concurrency,
            lease_ttl_s=args.delivery_lease_ttl,
            total_timeout_s=min(DeliverySettings.total_timeout_s, args.delivery_lease_ttl / 2),
            reap_interval_s=min(DeliverySettings.reap_interval_s, args.delivery_lease_ttl / 2),
        ),
    )


def events_from(args: argparse.Namespace) -> broker.BrokerConfig | None:
    """The relay and consumer configuration, or None without a broker URL."""
    if not args.amqp_url:
        return None
    return broker.BrokerConfig(
        amqp_url=args.amqp_url, settings=EventSettings(topology=BrokerTopology(prefix=args.topology_prefix))
    )


async def serve(
        dsn: str,
        settings: WorkerProcessSettings,
        *,
        http: str | None = None,
        delivery: dispatching.DeliveryConfig | None = None,
        events: broker.BrokerConfig | None = None,
        cleaner: cleaning.CleanerSettings | None = None,
        supervisor_pid: int | None = None,
) -> None:
    """One worker in this process. `supervisor_pid`: a worker process of `--processes N`, which leaves
    the elected jobs to its supervisor and stops when the supervisor is gone."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with contextlib.AsyncExitStack() as stack:
        if http is not None:
            host, port = health.parse_listen(http)
            await stack.enter_async_context(health.serving(dsn, host=host, port=port))
        if supervisor_pid is not None:
            watcher = asyncio.create_task(supervising.watch_parent(supervisor_pid, stop), name="supervisor watch")
            stack.push_async_callback(_cancelled, watcher)
        if not await schema.wait_until_current(dsn, stop=stop, what="worker"):
            return  # stopped while waiting
        await running.run_worker(
            dsn, settings, stop, api_key=os.environ.get(API_KEY_ENV) or None,
            provider_url=os.environ.get(PROVIDER_URL_ENV) or None, delivery=delivery, events=events,
            cleaner=cleaner, elected=supervisor_pid is None,
        )


async def _cancelled(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def positive_int(value: str) -> int:
    """argparse type: a whole number of at least 1. The `lading operator` command's counts use it
    too (its --worker-processes is this command's --processes): the CLI imports the components,
    never the other way round."""
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 1, got {value!r}")
    return number


SPLIT_FLAGS = ("concurrency", "prefetch", "delivery_concurrency")
"""Totals of the command that a supervisor splits across its worker processes (the rest apply to each)."""
_NOT_PASSED_ON = frozenset({*SPLIT_FLAGS, "help", "database_url", "amqp_url", "http", "processes", "supervised_by",
                            "no_dispatcher"})  # fmt: skip
"""What a worker process is not given as a flag: the URLs go in its environment (a flag shows in `ps`),
--http is the supervisor's, and the rest is given per process."""


def process_count(args: argparse.Namespace) -> int:
    """How many worker processes `args` asks for: --processes (default: the CPUs available), at most one
    per attempt of --concurrency."""
    wanted: int = args.processes or supervising.available_cpus()
    return max(1, min(wanted, int(args.concurrency)))


def child_commands(args: argparse.Namespace, count: int, *, supervisor_pid: int) -> list[list[str]]:
    """The command line of each of `count` worker processes: this command's flags, the totals split."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    common = ["--pool", args.pool]
    for action in parser._actions:
        if action.dest in _NOT_PASSED_ON or action.dest == "pool" or not action.option_strings:
            continue
        flag, value = action.option_strings[0], getattr(args, action.dest)
        if isinstance(action, argparse._StoreTrueAction):
            common += [flag] if value else []
        elif isinstance(action, argparse._AppendAction):
            for item in value or ():
                common += [flag, str(item)]
        elif value is not None:
            common += [flag, str(value)]
    split = zip(supervising.shares(args.concurrency, count), supervising.shares(args.prefetch, count),
                supervising.shares(args.delivery_concurrency, count), strict=True)  # fmt: skip
    commands = []
    for concurrency, prefetch, delivery_concurrency in split:
        own = ["--processes", "1", "--supervised-by", str(supervisor_pid),
               "--concurrency", str(concurrency), "--prefetch", str(prefetch)]  # fmt: skip
        if args.no_dispatcher or delivery_concurrency < 1:
            own += ["--no-dispatcher"]
        else:
            own += ["--delivery-concurrency", str(delivery_concurrency)]
        commands.append([*supervising.CHILD_COMMAND, *common, *own])
    return commands


def child_environment(args: argparse.Namespace) -> dict[str, str]:
    """This process's environment with the database and broker URLs of the flags (never on a command line)."""
    env = dict(os.environ)
    env["DATABASE_URL"] = args.database_url
    env.pop(broker.AMQP_URL_ENV, None)
    if args.amqp_url:
        env[broker.AMQP_URL_ENV] = args.amqp_url
    return env


GC_YOUNG_THRESHOLD = 20_000
"""Allocations between two collections of the collector's youngest generation (CPython's default:
700). An attempt allocates a few hundred tracked objects, nearly all freed at once by reference
counting: at 700 the collector ran every two or three attempts and took about 15 % of a worker
process's CPU on the SUCCEEDED path with an instant provider (`hack/bench.py compare`), about 3 % at
20,000. Reference cycles are still collected, only later (at most a few megabytes of them wait)."""


def tune_collector() -> None:
    """Make the cyclic garbage collector cheap for a long-running worker process: what start-up
    created (modules, models, compiled schemas and validators: most of the heap, and none of it
    garbage) is frozen out of every later collection, and the youngest generation is collected
    every GC_YOUNG_THRESHOLD allocations instead of every 700. Called once, before the event loop."""
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, older, oldest)


def run(args: argparse.Namespace) -> int:
    if not args.database_url:
        raise SystemExit("lading worker: --database-url or $DATABASE_URL is required")
    if args.http is not None:
        try:
            health.parse_listen(args.http)
        except ValueError as exc:
            raise SystemExit(f"lading worker: --http: {exc}") from None
    try:
        delivery = delivery_from(args)
        settings = settings_from(args)
        cleaner = cleaner_from(args)
    except ValueError as exc:
        raise SystemExit(f"lading worker: {exc}") from None
    count = 1 if args.supervised_by is not None else process_count(args)
    if count > 1:
        return asyncio.run(supervising.supervise(
            args.database_url, commands=child_commands(args, count, supervisor_pid=os.getpid()),
            env=child_environment(args), settings=supervising.SupervisorSettings(grace_s=args.grace),
            http=args.http, cleaner=cleaner,
        ))  # fmt: skip
    tune_collector()
    asyncio.run(serve(args.database_url, settings, http=args.http, delivery=delivery, events=events_from(args),
                      cleaner=cleaner, supervisor_pid=args.supervised_by))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    logs.configure(level="INFO", fmt="json" if os.environ.get("LADING_LOG_FORMAT") == "json" else "text")
    parser = argparse.ArgumentParser(prog="lading_worker", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))
