"""
The receiver's HTTP face (aiohttp):

    POST /webhooks/lading           a delivery (Standard Webhooks headers, JSON body)
    GET  /webhooks/lading/healthz   liveness: 200 while the event loop answers (not tied to the
                                    database, so an outage never gets a healthy receiver killed)
    GET  /webhooks/lading/readyz    readiness: 200 when the database answers and no receiver
                                    migration is pending, else 503 with the reason (the receiver
                                    never migrates: `lading migrate --receiver` does)
    GET  /metrics                   Prometheus text format (metrics.ReceiverMetrics)

A POST is checked cheapest first, and nothing is read past the first failure:

    schema not yet current       503 migrations-pending + Retry-After (until `lading migrate
                                 --receiver` has applied the receiver's migrations)
    Content-Length > limit       413 too-large         (before reading a byte of the body)
    Content-Type not JSON        415 unsupported-media-type
    body grows past the limit    413 too-large         (chunked bodies, while reading)
    signature / timestamp        401 <signing reason>  (constant time; tolerance both ways)
    JSON / envelope / schema     400 bad-json | bad-schema | unsupported-event | unsupported-schema
                                 (bad-json also covers lone surrogates, NaN and nesting past 1024)
    not storable                 400 unstorable        (U+0000 in a string or key, an integer past
                                 64 bits: named by field; also a data error PostgreSQL raises
                                 while recording, rolled back: the same body fails every time)
    same id, different body      409 delivery-conflict (alarm metric; the first body stands)
    database unavailable         503 database-unavailable + Retry-After (the sender retries);
                                 a 5xx means only this, or a bug (500 internal-error)
    committed                    200 {"status": "accepted" | "duplicate", "reference": "..."}

A delivery that passes the checks is recorded by the group committer (inbox.GroupCommitter):
concurrent deliveries share one transaction, and each is answered only after that commit.

Bodies and secrets are never logged: a log line names the delivery id, the reason and digests.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import re
from typing import Any

import aiohttp.web
import asyncpg
import orjson
import prometheus_client
import pydantic

from lading import failpoints, schema, storable
from lading.db import migrating
from lading.webhooks import payload, signing
from lading_webhook_receiver import adapters, inbox, metrics, settings

logger = logging.getLogger(__name__)

MIGRATIONS = migrating.MigrationSet(
    package="lading_webhook_receiver", table="lading_receiver.schema_migrations", lock_key=0x1AD1_0002
)
"""The receiver's own migrations, bookkept apart from Lading's (it may share a database with it)."""
MIGRATOR = "`lading migrate --receiver` (the chart's migration Job)"
"""What applies the receiver's migrations, as the waiting receiver names it in its log and on /readyz."""

_UNAVAILABLE: tuple[type[BaseException], ...] = (
    OSError,
    TimeoutError,
    asyncpg.InterfaceError,  # includes a connection that died under us
    asyncpg.exceptions.PostgresConnectionError,
    asyncpg.exceptions.InsufficientResourcesError,
    asyncpg.exceptions.OperatorInterventionError,  # shutdown, cannot connect now
    asyncpg.exceptions.TransactionRollbackError,  # serialization failure, deadlock: try again
)
"""Errors after which nothing is known to be committed: 503, the sender retries, the inbox dedups."""

_JSON_TYPES = ("application/json",)


class Receiver:
    """The handlers, bound to a pool, the keys, an adapter and the metrics."""

    def __init__(
            self,
            *,
            pool: asyncpg.Pool,
            keys: tuple[signing.SigningKey, ...],
            adapter: adapters.ErpAdapter[Any],
            config: settings.ReceiverSettings,
            observe: metrics.ReceiverMetrics,
    ) -> None:
        self.pool = pool
        self.keys = keys
        self.adapter = adapter
        self.config = config
        self.metrics = observe
        self.committer = inbox.GroupCommitter(
            pool, adapter=adapter, timeout_s=config.database_timeout_s,
            groups=min(config.commit_groups, config.pool_max_size), group_max=config.commit_group_max,
            observe=observe,
        )  # fmt: skip
        self.waiting_for: str | None = None
        """Why deliveries are refused for now (migrations pending), or None once the schema is current."""

    def _refuse(self, status: int, reason: str, message: str, **headers: str) -> aiohttp.web.Response:
        self.metrics.reject(reason)
        return aiohttp.web.json_response({"error": reason, "message": message}, status=status, headers=headers)

    async def deliver(self, request: aiohttp.web.Request) -> aiohttp.web.Response:
        if self.waiting_for is not None:
            return self._refuse(
                503, "migrations-pending", self.waiting_for, **{"Retry-After": str(self.config.retry_after_s)}
            )
        limit = self.config.max_body_bytes
        if request.content_length is not None and request.content_length > limit:
            return self._refuse(413, "too-large", f"body is larger than {limit} bytes")
        if request.content_type not in _JSON_TYPES:
            return self._refuse(415, "unsupported-media-type", "Content-Type must be application/json")
        try:
            body = await request.read()  # the Application's client_max_size bounds this
        except aiohttp.web.HTTPRequestEntityTooLarge:
            return self._refuse(413, "too-large", f"body is larger than {limit} bytes")
        try:
            delivery_id = signing.verify(self.keys, request.headers, body, tolerance_s=self.config.tolerance_s)
        except signing.VerificationError as exc:
            logger.info("Refused a delivery: %s", exc.reason)
            return self._refuse(401, exc.reason, str(exc))

        storable_as_parsed = _storable_as_parsed(body)
        try:
            envelope = orjson.loads(body) if storable_as_parsed else _loads(body)
        except (ValueError, RecursionError):  # orjson.JSONDecodeError and json's are ValueErrors
            return self._refuse(400, "bad-json", "body is not valid JSON")
        if not isinstance(envelope, dict):
            return self._refuse(400, "bad-schema", "body must be a JSON object")
        if not storable_as_parsed and (unstorable := storable.unstorable_reason(envelope, where="body")) is not None:
            return self._refuse(400, "unstorable", unstorable)
        if envelope.get("type") != payload.COMPLETED_V1:
            return self._refuse(400, "unsupported-event", f"type must be {payload.COMPLETED_V1!r}")
        try:
            event = payload.CompletedEvent.model_validate(envelope)
            operation = self.adapter.prepare(event)
        except pydantic.ValidationError as exc:
            return self._refuse(400, "bad-schema", adapters.describe(exc))
        except adapters.PayloadRejected as exc:
            return self._refuse(400, exc.reason, str(exc))

        sha256 = hashlib.sha256(body).digest()
        try:
            answer = await self.committer.receive(
                delivery_id=delivery_id, sha256=sha256, event_type=event.type, operation=operation
            )
        except inbox.DeliveryConflict as exc:
            self.metrics.conflicts.inc()
            logger.error("ALARM: %s", exc)
            return self._refuse(409, "delivery-conflict", str(exc))
        except _UNAVAILABLE as exc:
            logger.warning("Delivery %r not recorded, database unavailable: %s", delivery_id, type(exc).__name__)
            return self._refuse(
                503, "database-unavailable", "the receiver's database is unavailable; retry later",
                **{"Retry-After": str(self.config.retry_after_s)},
            )  # fmt: skip
        except Exception as exc:
            if isinstance(exc, asyncpg.PostgresError) and storable.is_data_error(exc):
                # Rolled back, nothing recorded. Names the kind of error, never its text (asyncpg's
                # repeats the value, which is document data).
                logger.warning("Delivery %r refused by the database: %s (SQLSTATE %s)", delivery_id,
                               type(exc).__name__, exc.sqlstate)  # fmt: skip
                return self._refuse(
                    400, "unstorable", f"the database cannot store a value of this delivery ({type(exc).__name__}, "
                    f"SQLSTATE {exc.sqlstate}); it was not recorded and would fail the same way again",
                )  # fmt: skip
            logger.exception("Delivery %r not recorded: unexpected error (rolled back)", delivery_id)
            return self._refuse(500, "internal-error", "the delivery was not recorded; retry later")
        self.metrics.deliveries.labels(answer.outcome).inc()
        await failpoints.ahit("receiver.after_commit_before_response")
        return aiohttp.web.json_response(answer.body())

    async def healthz(self, _: aiohttp.web.Request) -> aiohttp.web.Response:
        return aiohttp.web.Response(text="ok\n")

    async def readyz(self, _: aiohttp.web.Request) -> aiohttp.web.Response:
        try:
            async with asyncio.timeout(self.config.database_timeout_s), self.pool.acquire() as conn:
                pending = await migrating.pending(conn, MIGRATIONS)
        except _UNAVAILABLE as exc:
            return aiohttp.web.Response(text=f"database unavailable: {type(exc).__name__}\n", status=503)
        if pending:
            return aiohttp.web.Response(text=schema.describe(pending, migrator=MIGRATOR) + "\n", status=503)
        return aiohttp.web.Response(text="ok\n")

    async def serve_metrics(self, _: aiohttp.web.Request) -> aiohttp.web.Response:
        body = prometheus_client.generate_latest(self.metrics.registry)
        return aiohttp.web.Response(body=body, headers={"Content-Type": prometheus_client.CONTENT_TYPE_LATEST})


def make_app(receiver: Receiver) -> aiohttp.web.Application:
    # client_max_size makes aiohttp stop reading a body (chunked or lying) at the limit.
    app = aiohttp.web.Application(client_max_size=receiver.config.max_body_bytes)
    app.router.add_post(settings.PATH, receiver.deliver)
    app.router.add_get(settings.PATH + "/healthz", receiver.healthz)
    app.router.add_get(settings.PATH + "/readyz", receiver.readyz)
    app.router.add_get("/metrics", receiver.serve_metrics)
    return app


_NUL_ESCAPE = b"\\u0000"
_LONG_DIGITS = re.compile(rb"[0-9]{19}")


def _storable_as_parsed(body: bytes) -> bool:
    """True when whatever orjson parses `body` into is storable as it is, so the walk over every
    value (`storable.unstorable_reason`, and `_loads`'s look for floats) can be skipped.

    orjson itself refuses raw control characters, lone surrogates and numbers that overflow to
    infinity. What it lets through that PostgreSQL cannot store is U+0000, which valid JSON can
    only write as the escape `\\u0000`, and an integer outside 64 bits, which needs 19 digits
    or more (orjson reads one past 2⁶⁴ as a float; `_loads` reads it exactly). A body holding
    neither byte pattern anywhere (strings included, so a false alarm only means the full check)
    needs no further look."""
    return _NUL_ESCAPE not in body and _LONG_DIGITS.search(body) is None


def _loads(body: bytes) -> Any:
    """Parse a delivery body without changing any value.

    orjson is the fast path and refuses what JSON does not allow (lone surrogates, NaN, nesting past
    1,024 levels), but it reads an integer of 2⁶⁴ or more as a float, silently changing the value. A
    body whose parse holds a float is therefore read again with the standard library, which keeps
    integers exact, so the storable-value check sees the number the sender wrote. Amounts are decimal
    strings in every payload, so the second parse is the rare path."""
    envelope = orjson.loads(body)
    if _holds_float(envelope):
        envelope = json.loads(body)
    return envelope


def _holds_float(value: Any) -> bool:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float):
            return True
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False
