"""
Delivery in `lading run`: the dispatcher runs in-process, signing with the Secrets of the
manifests, and the reference receiver (`lading receiver`) is started in-process for every
DeliveryEndpoint whose URL is on this machine (127.0.0.1, localhost, ::1), so the quickstart
shows the whole path: extraction, signed delivery, the ERP's inbox and ledger.

Egress: loopback is allowed for exactly those local endpoints (their URLs are on this machine
by the manifests' own word); every other endpoint gets the default policy plus `--egress-allow`.
`--no-receiver` starts no receiver (point the endpoints at one you run yourself).

`lading run` waits until every batch is settled AND no delivery of its batches is still due or
in flight: the summary's `delivered` counts DELIVERED deliveries per batch.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import urllib.parse
from collections.abc import AsyncIterator, Sequence

import asyncpg
from lading_webhook_receiver import serving
from lading_worker import dispatching

from lading.db import deliveries
from lading.delivery import egress
from lading.delivery import secrets as delivery_secrets
from lading.ids import BatchId
from lading.models import manifests
from lading.settings import DeliverySettings

LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
LOOPBACK = egress.parse_cidrs(["127.0.0.0/8", "::1/128"])
SETTINGS = DeliverySettings(poll_interval_s=0.1, backoff_base_s=0.5, backoff_cap_s=10.0, reap_interval_s=1.0,
                            health_interval_s=2.0)  # fmt: skip
"""Faster polling and shorter backoffs than a cluster's: a local run should finish promptly."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--egress-allow",
        action="append",
        default=[],
        metavar="CIDR",
        help=f"let deliveries (and document fetches) connect to this otherwise refused range (repeatable; "
        f"added to ${egress.ENV_VAR}); loopback is always allowed for endpoints on this machine",
    )
    parser.add_argument(
        "--no-receiver",
        action="store_true",
        help="do not start the reference receiver for DeliveryEndpoints on 127.0.0.1/localhost",
    )


def egress_allow(args: argparse.Namespace) -> tuple[egress.IPNetwork, ...]:
    return egress.parse_cidrs([*args.egress_allow, os.environ.get(egress.ENV_VAR, "")])


@dataclasses.dataclass(frozen=True)
class LocalEndpoint:
    name: str
    host: str
    port: int
    secret: str = dataclasses.field(repr=False)


@dataclasses.dataclass(frozen=True)
class Plan:
    secrets: dict[str, list[str]] = dataclasses.field(repr=False)
    local: tuple[LocalEndpoint, ...]
    policy: egress.EgressPolicy


def plan(loaded: manifests.Manifests, args: argparse.Namespace) -> Plan:
    """Secrets per endpoint, the endpoints on this machine, and the egress policy."""
    secrets: dict[str, list[str]] = {}
    local: list[LocalEndpoint] = []
    for item in loaded.delivery_endpoints:
        endpoint = item.resource
        namespace = endpoint.metadata.namespace or "default"
        name = f"{namespace}/{endpoint.metadata.name}"
        secret = loaded.secret_value(namespace=namespace, ref=endpoint.spec.secret_ref)
        secrets[name] = [secret]
        url = urllib.parse.urlsplit(str(endpoint.spec.url))
        host = (url.hostname or "").lower()
        if host in LOCAL_HOSTS:
            port = url.port or (443 if url.scheme == "https" else 80)
            local.append(LocalEndpoint(name=name, host=host, port=port, secret=secret))
    return Plan(
        secrets=secrets,
        local=tuple(local),
        policy=egress.EgressPolicy(allow=egress_allow(args), endpoint_allow={e.name: LOOPBACK for e in local}),
    )


class Delivering:
    """The dispatcher task and the receivers of one `lading run`."""

    def __init__(self, db: asyncpg.Pool, the_plan: Plan) -> None:
        self.db = db
        self.plan = the_plan
        self.receivers: list[serving.RunningReceiver] = []
        self.task: asyncio.Task[None] | None = None

    async def open_deliveries(self, batch_ids: Sequence[BatchId]) -> int:
        async with self.db.acquire() as conn:
            return await deliveries.count_open_of_batches(conn, batch_ids=batch_ids)


class ReceiverUnavailable(OSError):
    """A local endpoint's receiver cannot listen where the endpoint's URL says (port taken)."""


@contextlib.asynccontextmanager
async def delivering(
        *, dsn: str, db: asyncpg.Pool, the_plan: Plan, stop: asyncio.Event, receiver: bool
) -> AsyncIterator[Delivering]:
    """Start the receivers (unless `receiver` is False) and the dispatcher; on exit wait for the
    dispatcher (the caller sets `stop` first), then stop the receivers."""
    state = Delivering(db, the_plan)
    async with contextlib.AsyncExitStack() as stack:
        if receiver and the_plan.local:
            # `lading run` migrates the database it runs on, the in-process receiver's set included
            # (the receiver itself never migrates).
            await serving.migrate(dsn)
        if receiver:
            groups: dict[tuple[str, int], list[str]] = {}
            for endpoint in the_plan.local:
                secrets = groups.setdefault((endpoint.host, endpoint.port), [])
                if endpoint.secret not in secrets:
                    secrets.append(endpoint.secret)
            for (host, port), secrets in groups.items():
                bind = "127.0.0.1" if host == "localhost" else host
                try:
                    running = await stack.enter_async_context(
                        serving.receiving(database_url=dsn, secrets=secrets, host=bind, port=port)
                    )
                except OSError as exc:
                    raise ReceiverUnavailable(
                        f"cannot start the receiver for {host}:{port} ({exc.strerror or exc}); free the port, "
                        "or run your own receiver there and pass --no-receiver"
                    ) from None
                state.receivers.append(running)
        dispatcher = dispatching.Dispatcher(
            db, secrets=delivery_secrets.StaticSecrets(the_plan.secrets), policy=the_plan.policy, settings=SETTINGS,
            owner=f"lading-run-{os.getpid()}",
        )  # fmt: skip
        state.task = asyncio.create_task(dispatcher.run_forever(stop), name="delivery dispatcher")
        try:
            yield state
        finally:
            stop.set()
            await asyncio.gather(state.task, return_exceptions=True)
