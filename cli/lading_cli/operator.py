"""
`lading operator`: run the Kubernetes operator.

    lading operator [--kubeconfig FILE] [--database-url URL] [--namespace NS ...] [--http HOST:PORT]
                    [--pool-namespaces NS[,NS...]] [--worker-image IMAGE] [--db-secret NAME:KEY]
                    [--amqp-secret NAME:KEY] [--worker-egress-allow CIDR ...] [--worker-* ...]
                    [--keda-db-secret NAME:KEY] [--keda-prometheus-url URL]
                    [--standalone | --peering [--peering-name NAME]]

The `--worker-*` flags shape every worker Deployment the operator renders (resources, processes, pull
secrets, env, volumes and mounts, document roots, labels, annotations, node selector, tolerations, the
cleaner's retentions); Kubernetes objects (resources, env, volumes, mounts, tolerations) are given
as JSON, as the chart passes its values.

InferencePools are served only in the platform namespaces of `--pool-namespaces` (or
`$LADING_POOL_NAMESPACES`; default `lading-system`): their workers hold every DeliveryEndpoint's
signing secret, so no tenant may own one of them (docs/security.md).

The cluster is found the standard way: `--kubeconfig`, else the in-cluster service account, else
`$KUBECONFIG` / `~/.kube/config`. The database comes from `--database-url` or `$DATABASE_URL`; its
migrations are applied by `lading migrate` only: while some are pending it waits (log, /readyz).
SIGINT/SIGTERM stop it gracefully.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
from collections.abc import Callable
from typing import Any

import kopf
from lading_operator import app, rendering, settings
from lading_worker.main import positive_int

from lading import health
from lading.delivery import egress

POOL_NAMESPACES_ENV = "LADING_POOL_NAMESPACES"


def _secret_key(value: str) -> rendering.SecretKeySelector:
    name, sep, key = value.partition(":")
    if not sep or not name or not key:
        raise argparse.ArgumentTypeError(f"expected NAME:KEY (a Secret and a key in it), got {value!r}")
    return rendering.SecretKeySelector(name=name, key=key)


_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def _namespaces(value: str) -> tuple[str, ...]:
    names = tuple(part.strip() for part in value.split(","))
    for name in names:
        if not _DNS_LABEL.fullmatch(name):
            raise argparse.ArgumentTypeError(
                f"{name!r} is not a namespace name (lowercase letters, digits and '-', at most 63), in {value!r}"
            )
    return tuple(dict.fromkeys(names))


def _key_value(value: str) -> tuple[str, str]:
    key, sep, item = value.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {value!r}")
    return key, item


def _json_of(kind: type, what: str) -> Callable[[str], Any]:
    def parse(value: str) -> Any:
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError as exc:
            raise argparse.ArgumentTypeError(f"{what} must be JSON: {exc.msg} at {exc.pos} in {value!r}") from None
        if not isinstance(parsed, kind):
            raise argparse.ArgumentTypeError(f"{what} must be a JSON {kind.__name__}, got {value!r}")
        if isinstance(parsed, list) and not all(isinstance(item, dict) for item in parsed):
            raise argparse.ArgumentTypeError(f"{what} must be a JSON list of objects, got {value!r}")
        return parsed

    return parse


def _listen(value: str) -> tuple[str, int]:
    try:
        return health.parse_listen(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = rendering.OperatorConfig()
    parser.add_argument("--kubeconfig", help="kubeconfig file; default: in-cluster, else $KUBECONFIG / ~/.kube/config")
    parser.add_argument("--database-url", default=os.environ.get("DATABASE_URL"), help="default: $DATABASE_URL")
    parser.add_argument(
        "--namespace",
        dest="namespaces",
        action="append",
        default=[],
        metavar="NS",
        help="serve only this namespace (repeatable); default: cluster-wide",
    )
    parser.add_argument(
        "--pool-namespaces",
        type=_namespaces,
        default=os.environ.get(POOL_NAMESPACES_ENV) or settings.POOL_NAMESPACE_DEFAULT,
        metavar="NS[,NS...]",
        help="the platform namespaces where InferencePools may live; a pool elsewhere is refused "
        f"(default: ${POOL_NAMESPACES_ENV}, else {settings.POOL_NAMESPACE_DEFAULT})",
    )
    parser.add_argument(
        "--http", type=_listen, metavar="HOST:PORT", help="serve /metrics, /healthz and /readyz here; off by default"
    )
    parser.add_argument(
        "--worker-image",
        default=defaults.worker_image,
        help=f"image of worker Deployments (default {defaults.worker_image})",
    )
    parser.add_argument(
        "--db-secret",
        type=_secret_key,
        default=defaults.database_secret,
        metavar="NAME:KEY",
        help="Secret key with the PostgreSQL URL, in each pool's namespace, for workers "
        f"(default {defaults.database_secret.name}:{defaults.database_secret.key})",
    )
    parser.add_argument(
        "--allow-vllm-metrics-override",
        dest="vllm_metrics_override",
        action="store_true",
        help="honour a pool's lading.dev/vllm-metrics-url annotation (an operator outside the cluster); "
        "the URL still passes the egress policy ($LADING_EGRESS_ALLOW). Default: the pool's Service only",
    )
    parser.add_argument(
        "--max-concurrent-manifests",
        type=positive_int,
        default=settings.MAX_CONCURRENT_MANIFESTS_DEFAULT,
        metavar="N",
        help="document manifests of large batches read at once; others wait, Pending "
        f"(default {settings.MAX_CONCURRENT_MANIFESTS_DEFAULT})",
    )
    parser.add_argument(
        "--amqp-secret",
        type=_secret_key,
        metavar="NAME:KEY",
        help="Secret key with the RabbitMQ URL, in each pool's namespace, for workers (LADING_AMQP_URL); "
        "default: workers run without a broker",
    )
    _add_worker_arguments(parser, defaults)
    keda = parser.add_argument_group("KEDA (pools with workers.scaling: keda)")
    keda.add_argument(
        "--keda-db-secret",
        type=_secret_key,
        metavar="NAME:KEY",
        help="Secret key with the PostgreSQL connection string KEDA's postgresql triggers use, in each "
        "pool's namespace (a read-only role is enough); default: --db-secret",
    )
    keda.add_argument(
        "--keda-prometheus-url",
        metavar="URL",
        help="Prometheus that scrapes the vLLM pods: adds KEDA's vLLM queue trigger; default: none",
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--standalone", dest="standalone", action="store_true", default=True, help="one replica (default)"
    )
    mode.add_argument(
        "--peering",
        dest="standalone",
        action="store_false",
        help="several replicas, one active (the one with the highest priority, drawn at random at start): they "
        "coordinate through a ClusterKopfPeering, which must exist (the chart creates it)",
    )
    parser.add_argument(
        "--peering-name",
        default=settings.PEERING_NAME_DEFAULT,
        metavar="NAME",
        help=f"name of the ClusterKopfPeering with --peering (default {settings.PEERING_NAME_DEFAULT})",
    )
    parser.add_argument(
        "--peering-lifetime",
        type=positive_int,
        default=settings.OperatorSettings.peering_lifetime_s,
        metavar="SECONDS",
        help="with --peering: a standby takes over this long after the active replica stopped answering "
        f"(default {settings.OperatorSettings.peering_lifetime_s})",
    )
    parser.add_argument("--log-level", default=argparse.SUPPRESS, help="overrides the global --log-level")


def _add_worker_arguments(parser: argparse.ArgumentParser, defaults: rendering.OperatorConfig) -> None:
    group = parser.add_argument_group("worker Deployments (every pool's)")
    group.add_argument(
        "--worker-egress-allow",
        action="append",
        default=[],
        metavar="CIDR",
        help="a private range workers' deliveries and document fetches may reach (LADING_EGRESS_ALLOW), e.g. "
        "an in-cluster ERP's Service range (repeatable)",
    )
    group.add_argument(
        "--worker-resources",
        type=_json_of(dict, "--worker-resources"),
        default=defaults.worker_resources,
        metavar="JSON",
        help=f"worker container resources (default {json.dumps(defaults.worker_resources)})",
    )
    group.add_argument(
        "--worker-processes", type=positive_int, metavar="N",
        help="worker processes per worker pod (`lading worker --processes`), sharing the pool's concurrency "
        "(default: the whole CPUs of the --worker-resources CPU limit, else of its request, at least 1)",
    )  # fmt: skip
    group.add_argument(
        "--worker-log-level", choices=rendering.WORKER_LOG_LEVELS, default=defaults.worker_log_level, metavar="LEVEL",
        help=f"log level of the workers (LADING_LOG_LEVEL): {', '.join(rendering.WORKER_LOG_LEVELS)} "
        f"(default {defaults.worker_log_level}: a line per commit group and per attempt that did not end well)",
    )  # fmt: skip
    group.add_argument("--worker-image-pull-secret", action="append", default=[], metavar="NAME",
                       help="Secret to pull the worker image with, in each pool's namespace (repeatable)")
    group.add_argument("--worker-env", type=_json_of(list, "--worker-env"), default=[], metavar="JSON",
                       help="more env variables of the worker container, a JSON list of EnvVar objects")
    group.add_argument("--worker-volumes", type=_json_of(list, "--worker-volumes"), default=[], metavar="JSON",
                       help="more volumes of the worker pod, a JSON list of Volume objects")
    group.add_argument("--worker-volume-mounts", type=_json_of(list, "--worker-volume-mounts"), default=[],
                       metavar="JSON", help="their mounts in the worker container, a JSON list of VolumeMount objects")
    group.add_argument("--worker-document-root", action="append", default=[], metavar="DIR",
                       help="workers read file:// documents of namespace NS beneath DIR/NS/ (`lading worker "
                       "--document-root`; usually a mount of --worker-volumes; repeatable)")
    group.add_argument("--worker-label", type=_key_value, action="append", default=[], metavar="KEY=VALUE",
                       help="label on every rendered object and worker pod (repeatable)")
    group.add_argument("--worker-annotation", type=_key_value, action="append", default=[], metavar="KEY=VALUE",
                       help="annotation on the worker Deployment and its pods (repeatable)")
    group.add_argument("--worker-node-selector", type=_key_value, action="append", default=[], metavar="KEY=VALUE",
                       help="node label worker pods must run on (repeatable)")
    group.add_argument("--worker-tolerations", type=_json_of(list, "--worker-tolerations"), default=[],
                       metavar="JSON", help="tolerations of the worker pods, a JSON list of Toleration objects")
    retention = parser.add_argument_group(
        "workers' cleaner: passed on as `lading worker FLAG N` (default: the worker's own; docs/operations.md)"
    )
    for flag in rendering.WORKER_CLEANER_FLAGS:
        retention.add_argument(f"--worker-{flag.removeprefix('--')}", type=float, metavar="N", default=None,
                               help=f"`lading worker {flag}` of every worker")


def _cleaner_from(args: argparse.Namespace) -> dict[str, float]:
    given = {flag: getattr(args, f"worker_{flag.removeprefix('--')}".replace("-", "_"))
             for flag in rendering.WORKER_CLEANER_FLAGS}  # fmt: skip
    return {flag: value for flag, value in given.items() if value is not None}


def render_config(args: argparse.Namespace) -> rendering.OperatorConfig:
    """What the operator renders into pools' objects, from the flags; a ValueError names what is wrong."""
    return rendering.OperatorConfig(
        worker_image=args.worker_image,
        database_secret=args.db_secret,
        amqp_url_secret=args.amqp_secret,
        egress_allow=tuple(args.worker_egress_allow),
        worker_resources=args.worker_resources,
        worker_processes=args.worker_processes,
        worker_log_level=args.worker_log_level,
        image_pull_secrets=tuple(args.worker_image_pull_secret),
        extra_env=tuple(args.worker_env),
        volumes=tuple(args.worker_volumes),
        volume_mounts=tuple(args.worker_volume_mounts),
        document_roots=tuple(args.worker_document_root),
        labels=dict(args.worker_label),
        annotations=dict(args.worker_annotation),
        node_selector=dict(args.worker_node_selector),
        tolerations=tuple(args.worker_tolerations),
        keda_database_secret=args.keda_db_secret,
        keda_prometheus_url=args.keda_prometheus_url,
        worker_cleaner=_cleaner_from(args),
    )


def settings_from(args: argparse.Namespace) -> settings.OperatorSettings:
    return settings.OperatorSettings(
        database_url=args.database_url,
        kubeconfig=args.kubeconfig,
        namespaces=tuple(args.namespaces),
        pool_namespaces=args.pool_namespaces,
        http=args.http,
        standalone=args.standalone,
        max_concurrent_manifests=args.max_concurrent_manifests,
        peering_name=args.peering_name,
        peering_lifetime_s=args.peering_lifetime,
        render=render_config(args),
        vllm_metrics_override=args.vllm_metrics_override,
        egress_allow=tuple(str(n) for n in egress.parse_cidrs([os.environ.get(egress.ENV_VAR, "")])),
    )


def run(args: argparse.Namespace) -> int:
    if not args.database_url:
        raise SystemExit("lading operator: --database-url or $DATABASE_URL is required")
    try:
        config = settings_from(args)
    except ValueError as exc:
        raise SystemExit(f"lading operator: {exc}") from None
    try:
        asyncio.run(_operate_until_signalled(config))
    except kopf.LoginError as exc:
        raise SystemExit(f"lading operator: {exc}") from None
    return 0


async def _operate_until_signalled(config: settings.OperatorSettings) -> None:
    """SIGINT/SIGTERM stop the operator gracefully in every phase: kopf installs its own handlers only
    once it runs, and /readyz (and the wait for migrations) come before that."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await app.operate(config, stop_flag=stop)
