"""
`lading relay`: the outbox relay and the ingress consumer as one standalone process.

Workers run both loops themselves when given `--amqp-url`; this command is for running them
apart from the workers (one small Deployment), or for draining an outbox by hand. Waits until the
schema is current (only `lading migrate` applies migrations; /readyz and the log say which are
pending), then runs until SIGTERM/SIGINT.

    lading relay --amqp-url amqp://user:pass@rabbit:5672/ --database-url postgresql://...

The broker URL carries a password: prefer $LADING_AMQP_URL to the flag (flags show in `ps`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Sequence

from lading_worker import broker, relaying

from lading import health, looping, schema
from lading.db import pool as dbpool
from lading.settings import BrokerTopology, EventSettings, IngressSettings, RelaySettings

AMQP_URL_ENV = broker.AMQP_URL_ENV


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--database-url", default=os.environ.get("DATABASE_URL"), help="default: $DATABASE_URL")
    parser.add_argument("--amqp-url", default=os.environ.get(AMQP_URL_ENV), help=f"default: ${AMQP_URL_ENV}")
    parser.add_argument("--topology-prefix", default=BrokerTopology.prefix, help="put in front of every broker name")
    parser.add_argument("--batch-size", type=int, default=RelaySettings.batch_size, help="events per relay round")
    parser.add_argument("--claim-ttl", type=float, default=RelaySettings.claim_ttl_s, help="seconds a claim lasts")
    parser.add_argument("--publish-timeout", type=float, default=RelaySettings.publish_timeout_s,
                        help="seconds to wait for a batch's confirms")  # fmt: skip
    parser.add_argument("--poll-interval", type=float, default=RelaySettings.poll_interval_s)
    parser.add_argument("--prefetch", type=int, default=IngressSettings.prefetch, help="unacked messages per consumer")
    parser.add_argument("--no-relay", action="store_true", help="run only the ingress consumer")
    parser.add_argument("--no-ingress", action="store_true", help="run only the outbox relay")
    parser.add_argument(
        "--http", metavar="HOST:PORT", help="serve /metrics, /healthz and /readyz here (e.g. 0.0.0.0:9464)"
    )


def settings_from(args: argparse.Namespace) -> EventSettings:
    if args.batch_size < 1 or args.prefetch < 1:
        raise SystemExit("lading relay: --batch-size and --prefetch must be at least 1")
    if args.publish_timeout <= 0 or args.claim_ttl <= args.publish_timeout:
        raise SystemExit("lading relay: --claim-ttl must exceed --publish-timeout, which must be positive")
    return EventSettings(
        topology=BrokerTopology(prefix=args.topology_prefix),
        relay=RelaySettings(
            batch_size=args.batch_size,
            claim_ttl_s=args.claim_ttl,
            poll_interval_s=args.poll_interval,
            publish_timeout_s=args.publish_timeout,
        ),
        ingress=IngressSettings(prefetch=args.prefetch),
    )


async def serve(
        dsn: str,
        amqp_url: str,
        settings: EventSettings,
        *,
        with_relay: bool,
        with_ingress: bool,
        http: str | None = None,
) -> None:
    # The handlers come first: a SIGTERM once /readyz answers is a graceful stop, never the default kill.
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with contextlib.AsyncExitStack() as stack:
        if http is not None:
            host, port = health.parse_listen(http)
            await stack.enter_async_context(health.serving(dsn, host=host, port=port))
        await _serve(dsn, amqp_url, settings, stop, with_relay=with_relay, with_ingress=with_ingress)


async def _serve(
    dsn: str, amqp_url: str, settings: EventSettings, stop: asyncio.Event, *, with_relay: bool, with_ingress: bool
) -> None:
    if not await schema.wait_until_current(dsn, stop=stop, what="relay"):
        return  # stopped while waiting
    config = broker.BrokerConfig(amqp_url=amqp_url, settings=settings, relay=with_relay, ingress=with_ingress)
    db = await dbpool.create_pool(dsn, min_size=1, max_size=config.connections)
    try:
        loops = config.loops(db, owner=relaying.new_owner())
        # A loop that dies stops the other, and its error is re-raised once both have stopped.
        await looping.supervise(looping.spawn((name, loop(stop)) for name, loop in loops), stop=stop)
    finally:
        await db.close()


def run(args: argparse.Namespace) -> int:
    if not args.database_url:
        raise SystemExit("lading relay: --database-url or $DATABASE_URL is required")
    if not args.amqp_url:
        raise SystemExit(f"lading relay: --amqp-url or ${AMQP_URL_ENV} is required")
    if args.no_relay and args.no_ingress:
        raise SystemExit("lading relay: --no-relay and --no-ingress leave nothing to run")
    if args.http is not None:
        try:
            health.parse_listen(args.http)
        except ValueError as exc:
            raise SystemExit(f"lading relay: --http: {exc}") from None
    asyncio.run(
        serve(args.database_url, args.amqp_url, settings_from(args),
              with_relay=not args.no_relay, with_ingress=not args.no_ingress, http=args.http)
    )  # fmt: skip
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    parser = argparse.ArgumentParser(prog="lading relay", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
