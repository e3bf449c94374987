"""
`lading operator`: run the Kubernetes operator.

    lading operator [--kubeconfig FILE] [--database-url URL] [--namespace NS ...] [--http HOST:PORT]
                    [--pool-namespaces NS[,NS...]] [--worker-image IMAGE] [--db-secret NAME:KEY]
                    [--standalone | --peering]

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
import os
import re
import signal

import kopf
from lading_operator import app, rendering, settings

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


def _positive(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 1, got {value!r}")
    return number


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
        type=_positive,
        default=settings.MAX_CONCURRENT_MANIFESTS_DEFAULT,
        metavar="N",
        help="document manifests of large batches read at once; others wait, Pending "
        f"(default {settings.MAX_CONCURRENT_MANIFESTS_DEFAULT})",
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--standalone", dest="standalone", action="store_true", default=True, help="one replica (default)"
    )
    mode.add_argument("--peering", dest="standalone", action="store_false", help="coordinate replicas via kopf peering")
    parser.add_argument("--log-level", default=argparse.SUPPRESS, help="overrides the global --log-level")


def settings_from(args: argparse.Namespace) -> settings.OperatorSettings:
    return settings.OperatorSettings(
        database_url=args.database_url,
        kubeconfig=args.kubeconfig,
        namespaces=tuple(args.namespaces),
        pool_namespaces=args.pool_namespaces,
        http=args.http,
        standalone=args.standalone,
        max_concurrent_manifests=args.max_concurrent_manifests,
        render=rendering.OperatorConfig(worker_image=args.worker_image, database_secret=args.db_secret),
        vllm_metrics_override=args.vllm_metrics_override,
        egress_allow=tuple(str(n) for n in egress.parse_cidrs([os.environ.get(egress.ENV_VAR, "")])),
    )


def run(args: argparse.Namespace) -> int:
    if not args.database_url:
        raise SystemExit("lading operator: --database-url or $DATABASE_URL is required")
    try:
        asyncio.run(_operate_until_signalled(settings_from(args)))
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
