"""
The intake process: `python -m lading_api` or `lading api`.

Serves `serving.serving` until SIGTERM or SIGINT, then shuts down gracefully: stops accepting
connections, lets requests in flight finish (up to the grace), closes the pools. It never migrates
the database (`lading migrate` does): until the schema is current, /readyz says what is pending
and requests answer 503.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pathlib
import signal
from collections.abc import Sequence

from lading import logs
from lading_api import kube_auth, serving
from lading_api.settings import ApiSettings

_DEFAULTS = ApiSettings()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000; 0: any free port)")
    parser.add_argument("--database-url", default=os.environ.get("DATABASE_URL"), help="default: $DATABASE_URL")
    parser.add_argument(
        "--max-body-bytes", type=int, default=_DEFAULTS.max_body_bytes,
        help=f"largest request body, 413 above (default {_DEFAULTS.max_body_bytes})",
    )  # fmt: skip
    parser.add_argument(
        "--pool-size", type=int, default=_DEFAULTS.pool_max_size,
        help=f"database connections for the work of requests (default {_DEFAULTS.pool_max_size}); as many again "
        "hold the Idempotency-Keys of batch POSTs in flight",
    )  # fmt: skip
    parser.add_argument(
        "--in-progress-wait", type=float, default=_DEFAULTS.in_progress_wait_s, metavar="SECONDS",
        help="how long a POST waits for an earlier request with the same Idempotency-Key before answering 409 "
        f"(default {_DEFAULTS.in_progress_wait_s:g})",
    )  # fmt: skip
    parser.add_argument(
        "--token-cache", type=float, default=_DEFAULTS.token_cache_s, metavar="SECONDS",
        help="how long a valid token's lookup is reused: a revoked or expired token stops working within this "
        f"time (default {_DEFAULTS.token_cache_s:g}; 0 looks every token up on every request)",
    )  # fmt: skip
    kube = parser.add_argument_group("Kubernetes ServiceAccount tokens (TokenReview + SubjectAccessReview)")
    kube.add_argument(
        "--kubernetes-auth", action="store_true",
        help="also accept Kubernetes ServiceAccount tokens: a token the API server authenticates may act in a "
        "namespace where it may `create extractionbatches.lading.dev` (in-cluster defaults below)",
    )  # fmt: skip
    kube.add_argument("--kubernetes-api", metavar="URL", help="the API server (default: in-cluster)")
    kube.add_argument("--kubernetes-token-file", type=pathlib.Path, metavar="FILE",
                      help="the intake's own token for the reviews (default: the pod's ServiceAccount token)")
    kube.add_argument("--kubernetes-ca-file", type=pathlib.Path, metavar="FILE",
                      help="CA of the API server (default: the pod's ServiceAccount ca.crt)")
    parser.add_argument(
        "--grace", type=float, default=_DEFAULTS.shutdown_grace_s,
        help=f"seconds requests in flight get to finish on SIGTERM (default {_DEFAULTS.shutdown_grace_s:g})",
    )  # fmt: skip


def settings_from(args: argparse.Namespace) -> ApiSettings:
    return ApiSettings(
        max_body_bytes=args.max_body_bytes, pool_max_size=args.pool_size,
        in_progress_wait_s=args.in_progress_wait, shutdown_grace_s=args.grace, token_cache_s=args.token_cache,
    )  # fmt: skip


def kube_from(args: argparse.Namespace) -> kube_auth.KubeSettings | None:
    """The Kubernetes review settings from the flags; None without --kubernetes-auth."""
    if not args.kubernetes_auth:
        return None
    if args.kubernetes_api is None:
        found = kube_auth.KubeSettings.in_cluster()
    else:
        found = kube_auth.KubeSettings(args.kubernetes_api, kube_auth.SERVICE_ACCOUNT_DIR / "token", None)
    token_file = args.kubernetes_token_file or found.token_file
    ca_file = args.kubernetes_ca_file or found.ca_file
    if not token_file.is_file():
        raise ValueError(f"--kubernetes-token-file {token_file} does not exist")
    return kube_auth.KubeSettings(found.api_url, token_file, ca_file)


async def serve(
        *,
        database_url: str,
        host: str,
        port: int,
        settings: ApiSettings,
        kube: kube_auth.KubeSettings | None = None,
) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        async with serving.serving(
            database_url=database_url, host=host, port=port, settings=settings, kube=kube
        ) as server:
            # One line an operator (or a test) can wait for; never the database URL.
            print(f"lading api: listening on {server.base_url}", flush=True)
            await stop.wait()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


def run(args: argparse.Namespace) -> int:
    if not args.database_url:
        raise SystemExit("lading api: --database-url or $DATABASE_URL is required")
    if not 0 <= args.port <= 65535:
        raise SystemExit(f"lading api: --port must be 0 to 65535, got {args.port}")
    try:
        settings = settings_from(args)
        kube = kube_from(args)
    except ValueError as exc:
        raise SystemExit(f"lading api: {exc}") from None
    asyncio.run(serve(database_url=args.database_url, host=args.host, port=args.port, settings=settings, kube=kube))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="lading api", description="The HTTP intake of Lading.")
    parser.add_argument("--log-level", default=os.environ.get("LADING_LOG_LEVEL", "WARNING"))
    add_arguments(parser)
    args = parser.parse_args(argv)
    logs.configure(level=args.log_level, fmt="json" if os.environ.get("LADING_LOG_FORMAT") == "json" else "text")
    return run(args)
