"""
`lading receiver`: the reference ERP webhook receiver, deployable as is.

Signing secrets come from `--secret` (repeatable), `--secret-file` (one per line, `#`
comments), and `$LADING_RECEIVER_SECRETS` (comma or space separated), all together; during
a rotation give both the old and the new one. Prefer the file or the variable in production:
command-line flags are visible to every user of the host in `ps`. The receiver refuses to
start without a secret, and never prints one.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pathlib
import re

from lading_webhook_receiver import adapters, main, settings

from lading.webhooks import signing

SECRETS_ENV = "LADING_RECEIVER_SECRETS"
DATABASE_ENV = "LADING_RECEIVER_DATABASE_URL"
_DEFAULTS = settings.ReceiverSettings()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8080, help="port to listen on (default 8080; 0: any free port)")
    parser.add_argument(
        "--database-url",
        default=os.environ.get(DATABASE_ENV) or os.environ.get("DATABASE_URL"),
        help=f"the receiver's (ERP's) PostgreSQL; default ${DATABASE_ENV}, else $DATABASE_URL",
    )
    parser.add_argument(
        "--secret", action="append", default=[], metavar="WHSEC",
        help=f"a signing secret whsec_...; repeatable (visible in ps: prefer --secret-file or ${SECRETS_ENV})",
    )  # fmt: skip
    parser.add_argument(
        "--secret-file", action="append", default=[], type=pathlib.Path, metavar="FILE",
        help="a file of signing secrets, one per line; repeatable",
    )  # fmt: skip
    parser.add_argument(
        "--tolerance-seconds", type=int, default=_DEFAULTS.tolerance_s,
        help=f"allowed webhook-timestamp skew either way (default {_DEFAULTS.tolerance_s})",
    )  # fmt: skip
    parser.add_argument(
        "--max-body-bytes", type=int, default=_DEFAULTS.max_body_bytes,
        help=f"largest body accepted, 413 above (default {_DEFAULTS.max_body_bytes})",
    )  # fmt: skip
    parser.add_argument("--adapter", choices=adapters.NAMES, default=_DEFAULTS.adapter, help="ERP adapter")
    parser.add_argument(
        "--pool-size", type=int, default=_DEFAULTS.pool_max_size,
        help=f"database connections, the group transactions among them (default {_DEFAULTS.pool_max_size})",
    )  # fmt: skip
    parser.add_argument(
        "--grace", type=float, default=_DEFAULTS.shutdown_grace_s,
        help=f"seconds deliveries in flight get to finish on SIGTERM (default {_DEFAULTS.shutdown_grace_s:g})",
    )  # fmt: skip
    window_h = settings.dedup_window_s(_DEFAULTS.tolerance_s) / settings.HOUR_S
    retention_h = _DEFAULTS.inbox_retention_s / settings.HOUR_S
    parser.add_argument(
        "--retain-inbox-hours", type=float, default=retention_h,
        help=f"inbox rows are deleted this long after receipt (default {retention_h:g}; at least the dedup "
             f"window, {window_h:g} with the default tolerance: 30 days + the tolerance)",
    )  # fmt: skip
    parser.add_argument(
        "--cleaner-interval", type=float, default=_DEFAULTS.cleaner_interval_s,
        help=f"seconds between inbox cleaning rounds (default {_DEFAULTS.cleaner_interval_s:g})",
    )  # fmt: skip
    parser.add_argument(
        "--cleaner-batch", type=int, default=_DEFAULTS.cleaner_batch_size,
        help=f"inbox rows per DELETE statement (default {_DEFAULTS.cleaner_batch_size})",
    )  # fmt: skip


def collect_secrets(args: argparse.Namespace, environ: dict[str, str] | os._Environ[str]) -> list[str]:
    """Every secret given, validated; a SystemExit that names where a bad one came from (never its value)."""
    found: list[tuple[str, str]] = [(s, f"--secret #{i + 1}") for i, s in enumerate(args.secret)]
    for path in args.secret_file:
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise SystemExit(f"lading receiver: cannot read --secret-file {path}: {exc.strerror}") from None
        found += [
            (line.strip(), f"{path} line {n}")
            for n, line in enumerate(lines, 1)
            if line.strip() and not line.lstrip().startswith("#")
        ]
    from_env = [s for s in re.split(r"[\s,]+", environ.get(SECRETS_ENV, "")) if s]
    found += [(s, f"${SECRETS_ENV} item {i + 1}") for i, s in enumerate(from_env)]
    if not found:
        raise SystemExit(
            f"lading receiver: no signing secret; give --secret, --secret-file or ${SECRETS_ENV} "
            "(the whsec_... secret of the DeliveryEndpoint)"
        )
    for secret, origin in found:
        try:
            signing.SigningKey.parse(secret)
        except signing.SecretFormatError as exc:
            raise SystemExit(f"lading receiver: bad signing secret ({origin}): {exc}") from None
    return [secret for secret, _ in found]


def run(args: argparse.Namespace) -> int:
    secrets = collect_secrets(args, os.environ)
    if not args.database_url:
        raise SystemExit(f"lading receiver: --database-url, ${DATABASE_ENV} or $DATABASE_URL is required")
    if not 0 <= args.port <= 65535:
        raise SystemExit(f"lading receiver: --port must be 0 to 65535, got {args.port}")
    try:
        config = settings.ReceiverSettings(
            tolerance_s=args.tolerance_seconds,
            max_body_bytes=args.max_body_bytes,
            pool_min_size=min(2, args.pool_size),
            pool_max_size=args.pool_size,
            shutdown_grace_s=args.grace,
            adapter=args.adapter,
            inbox_retention_s=args.retain_inbox_hours * settings.HOUR_S,
            cleaner_interval_s=args.cleaner_interval,
            cleaner_batch_size=args.cleaner_batch,
        )
    except ValueError as exc:
        raise SystemExit(f"lading receiver: {exc}") from None
    asyncio.run(
        main.serve(database_url=args.database_url, secrets=secrets, host=args.host, port=args.port, config=config)
    )
    return 0
