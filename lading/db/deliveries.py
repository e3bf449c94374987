"""
Repository of `deliveries`, `delivery_attempts` and the endpoints' health columns: one
function per named query in `sql/deliveries.sql`.

Functions take a connection and never open transactions of their own, except where a
statement needs one to lock (the caller decides the unit of work otherwise). Lease and
fence guards live in the SQL; the states come from `lading.delivery.states`.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import uuid
from collections.abc import Sequence
from typing import Any

import asyncpg

from lading.db import queries
from lading.delivery.states import DeliveryState
from lading.ids import BatchId, DeliveryId, Fence, JobId


@dataclasses.dataclass(frozen=True)
class ClaimedDelivery:
    """A delivery this dispatcher owns under `fence` until its lease runs out (database clock)."""

    id: DeliveryId
    job_id: JobId
    endpoint: str
    attempt: int
    budget_attempts: int
    """Attempts in the current retry budget, this one included."""
    ambiguous_attempts: int
    """Earlier attempts of this budget whose outcome is unknown."""
    fence: Fence
    first_attempt_at: dt.datetime
    created_at: dt.datetime
    claimed_at: dt.datetime
    tenant: str
    document_key: str
    schema: str
    batch_id: BatchId
    batch_namespace: str
    batch_name: str
    result: dict[str, Any] | None
    validation_policy: str
    validation_outcome: str
    cost: decimal.Decimal | None = None
    """What the job's attempts cost (`extraction_jobs.cost`); None: its pool is unpriced."""
    cost_currency: str | None = None
    tokens_in: int | None = None
    """Prompt tokens of all the job's attempts; None when no attempt reported any."""
    tokens_out: int | None = None


@dataclasses.dataclass(frozen=True)
class Finish:
    """How one attempt ended; applied by `finish_many` under the attempt's fence."""

    delivery_id: DeliveryId
    fence: Fence
    to: DeliveryState
    outcome: str
    """delivery_attempts.outcome: delivered, retry, failed, unknown."""
    retry_in_s: float | None = None
    http_status: int | None = None
    error_class: str | None = None
    error: str | None = None
    latency_ms: int | None = None
    ambiguous: bool = False
    """The request may have reached the receiver without us learning its answer."""


@dataclasses.dataclass(frozen=True)
class ExpiredLease:
    id: DeliveryId
    fence: Fence
    endpoint: str
    budget_attempts: int
    ambiguous_attempts: int
    first_attempt_at: dt.datetime
    endpoint_spec: dict[str, Any]
    now: dt.datetime


@dataclasses.dataclass(frozen=True)
class Reap:
    delivery_id: DeliveryId
    fence: Fence
    to: DeliveryState
    retry_in_s: float | None


@dataclasses.dataclass(frozen=True)
class Delivery:
    """One row of `deliveries`, for reading (CLI, tests)."""

    id: DeliveryId
    job_id: JobId
    endpoint: str
    state: DeliveryState
    attempt: int
    budget_attempts: int
    ambiguous_attempts: int
    fence: Fence
    owner: str | None
    lease_until: dt.datetime | None
    next_attempt_at: dt.datetime
    first_attempt_at: dt.datetime | None
    last_status: int | None
    last_error_class: str | None
    last_error: str | None
    created_at: dt.datetime
    updated_at: dt.datetime
    delivered_at: dt.datetime | None
    resolved_by: str | None
    resolved_reason: str | None

    @classmethod
    def from_row(cls, r: asyncpg.Record) -> Delivery:
        return cls(
            id=DeliveryId(r["delivery_id"]),
            job_id=JobId(r["job_id"]),
            endpoint=r["endpoint"],
            state=DeliveryState(r["state"]),
            attempt=r["attempt"],
            budget_attempts=r["budget_attempts"],
            ambiguous_attempts=r["ambiguous_attempts"],
            fence=Fence(r["fence"]),
            owner=r["owner"],
            lease_until=r["lease_until"],
            next_attempt_at=r["next_attempt_at"],
            first_attempt_at=r["first_attempt_at"],
            last_status=r["last_status"],
            last_error_class=r["last_error_class"],
            last_error=r["last_error"],
            created_at=r["created_at"],
            updated_at=r["updated_at"],
            delivered_at=r["delivered_at"],
            resolved_by=r["resolved_by"],
            resolved_reason=r["resolved_reason"],
        )


@dataclasses.dataclass(frozen=True)
class Attempt:
    fence: Fence
    attempt: int
    owner: str
    started_at: dt.datetime
    finished_at: dt.datetime | None
    outcome: str | None
    http_status: int | None
    error_class: str | None
    error: str | None
    latency_ms: int | None


@dataclasses.dataclass(frozen=True)
class EndpointHealth:
    """A registered endpoint as the dispatcher sees it: where, budget, breaker and auth state."""

    name: str
    url: str
    spec: dict[str, Any]
    breaker_state: str
    breaker_failures: int
    breaker_opens: int
    breaker_open_until: dt.datetime | None
    breaker_probe_until: dt.datetime | None
    auth_failures: int
    auth_failing: bool
    auth_failing_since: dt.datetime | None
    last_auth_status: int | None
    now: dt.datetime


@dataclasses.dataclass(frozen=True)
class Outcomes:
    """One round of attempt outcomes of one endpoint, folded into its health by `record_outcomes`."""

    up: int = 0
    """Answers that show the endpoint works: 2xx, and 4xx other than 401/403/429."""
    failures: int = 0
    """5xx, 429, 401/403, network errors and time-outs."""
    auth_refusals: int = 0
    """401/403 answers."""
    successes: int = 0
    """2xx answers."""
    last_auth_status: int | None = None


async def claim(
        conn: asyncpg.Connection,
        *,
        endpoints: Sequence[str],
        owner: str,
        limit: int,
        lease_ttl_s: float,
        probe: bool = False,
) -> list[ClaimedDelivery]:
    """Take up to `limit` due deliveries of `endpoints` in one statement (SKIP LOCKED)."""
    if not endpoints or limit <= 0:
        return []
    rows = await conn.fetch(queries.sql("delivery_claim"), list(endpoints), limit, owner, lease_ttl_s, probe)
    return [
        ClaimedDelivery(
            id=DeliveryId(r["delivery_id"]),
            job_id=JobId(r["job_id"]),
            endpoint=r["endpoint"],
            attempt=r["attempt"],
            budget_attempts=r["budget_attempts"],
            ambiguous_attempts=r["ambiguous_attempts"],
            fence=Fence(r["fence"]),
            first_attempt_at=r["first_attempt_at"],
            created_at=r["created_at"],
            claimed_at=r["claimed_at"],
            tenant=r["tenant"],
            document_key=r["document_key"],
            schema=r["schema"],
            batch_id=BatchId(r["batch_id"]),
            batch_namespace=r["batch_namespace"],
            batch_name=r["batch_name"],
            result=r["result"],
            validation_policy=r["validation_policy"],
            validation_outcome=r["validation_outcome"],
            cost=r["cost"],
            cost_currency=r["cost_currency"],
            tokens_in=r["tokens_in"],
            tokens_out=r["tokens_out"],
        )
        for r in rows
    ]


async def finish_many(conn: asyncpg.Connection, finishes: Sequence[Finish], *, owner: str) -> dict[DeliveryId, str]:
    """Apply many attempt outcomes at once; returns the deliveries that moved, with their new state.

    An outcome whose fence is stale or whose lease ran out changes nothing (its attempt row is
    closed as `stale`) and is absent from the result."""
    if not finishes:
        return {}
    rows = await conn.fetch(
        queries.sql("delivery_finish_many"),
        [f.delivery_id for f in finishes],
        [f.fence for f in finishes],
        [f.to.value for f in finishes],
        [f.retry_in_s for f in finishes],
        [f.outcome for f in finishes],
        [f.http_status for f in finishes],
        [f.error_class for f in finishes],
        [f.error for f in finishes],
        [f.latency_ms for f in finishes],
        [f.ambiguous for f in finishes],
        owner,
    )
    return {DeliveryId(r["delivery_id"]): r["state"] for r in rows}


async def lock_expired_leases(conn: asyncpg.Connection, *, limit: int) -> list[ExpiredLease]:
    """Inside a transaction: lock in-flight deliveries whose lease ran out (SKIP LOCKED)."""
    rows = await conn.fetch(queries.sql("delivery_lock_expired_leases"), limit)
    return [
        ExpiredLease(
            id=DeliveryId(r["delivery_id"]),
            fence=Fence(r["fence"]),
            endpoint=r["endpoint"],
            budget_attempts=r["budget_attempts"],
            ambiguous_attempts=r["ambiguous_attempts"],
            first_attempt_at=r["first_attempt_at"],
            endpoint_spec=r["endpoint_spec"],
            now=r["now"],
        )
        for r in rows
    ]


async def reap_many(conn: asyncpg.Connection, reaps: Sequence[Reap]) -> dict[DeliveryId, str]:
    if not reaps:
        return {}
    rows = await conn.fetch(
        queries.sql("delivery_reap_many"),
        [r.delivery_id for r in reaps],
        [r.fence for r in reaps],
        [r.to.value for r in reaps],
        [r.retry_in_s for r in reaps],
    )
    return {DeliveryId(r["delivery_id"]): r["state"] for r in rows}


async def redeliver(conn: asyncpg.Connection, *, delivery_id: DeliveryId, note: str) -> bool:
    return await conn.fetchval(queries.sql("delivery_redeliver"), delivery_id, note) is not None


async def resolve(conn: asyncpg.Connection, *, delivery_id: DeliveryId, resolved_by: str, reason: str) -> bool:
    return await conn.fetchval(queries.sql("delivery_resolve"), delivery_id, resolved_by, reason) is not None


async def get(conn: asyncpg.Connection, *, delivery_id: DeliveryId) -> Delivery | None:
    row = await conn.fetchrow(queries.sql("delivery_get"), delivery_id)
    return None if row is None else Delivery.from_row(row)


async def list_page(
        conn: asyncpg.Connection,
        *,
        after: DeliveryId | None,
        limit: int,
        state: DeliveryState | None = None,
        endpoint: str | None = None,
) -> list[Delivery]:
    rows = await conn.fetch(
        queries.sql("delivery_list"), after, limit, None if state is None else state.value, endpoint
    )
    return [Delivery.from_row(r) for r in rows]


async def attempts_of(conn: asyncpg.Connection, *, delivery_id: DeliveryId) -> list[Attempt]:
    rows = await conn.fetch(queries.sql("delivery_attempts_of"), delivery_id)
    return [
        Attempt(
            fence=Fence(r["fence"]),
            attempt=r["attempt"],
            owner=r["owner"],
            started_at=r["started_at"],
            finished_at=r["finished_at"],
            outcome=r["outcome"],
            http_status=r["http_status"],
            error_class=r["error_class"],
            error=r["error"],
            latency_ms=r["latency_ms"],
        )
        for r in rows
    ]


async def count_by_state(conn: asyncpg.Connection) -> dict[tuple[str, DeliveryState], int]:
    rows = await conn.fetch(queries.sql("delivery_count_by_state"))
    return {(r["endpoint"], DeliveryState(r["state"])): int(r["n"]) for r in rows}


async def due_count_by_endpoint(conn: asyncpg.Connection) -> dict[str, int]:
    rows = await conn.fetch(queries.sql("delivery_due_count_by_endpoint"))
    return {r["endpoint"]: int(r["n"]) for r in rows}


async def count_delivered_of_batch(conn: asyncpg.Connection, *, batch_id: BatchId) -> int:
    return int(await conn.fetchval(queries.sql("delivery_count_delivered_of_batch"), batch_id))


async def count_open_of_batches(conn: asyncpg.Connection, *, batch_ids: Sequence[BatchId]) -> int:
    """Deliveries of these batches not yet settled (PENDING, IN_FLIGHT, RETRY_SCHEDULED)."""
    return int(await conn.fetchval(queries.sql("delivery_count_open_of_batches"), list(batch_ids)))


async def endpoints_for_dispatch(conn: asyncpg.Connection) -> list[EndpointHealth]:
    rows = await conn.fetch(queries.sql("endpoint_list_for_dispatch"))
    return [
        EndpointHealth(
            name=r["name"],
            url=r["url"],
            spec=r["spec"] or {},
            breaker_state=r["breaker_state"],
            breaker_failures=r["breaker_failures"],
            breaker_opens=r["breaker_opens"],
            breaker_open_until=r["breaker_open_until"],
            breaker_probe_until=r["breaker_probe_until"],
            auth_failures=r["auth_failures"],
            auth_failing=r["auth_failing"],
            auth_failing_since=r["auth_failing_since"],
            last_auth_status=r["last_auth_status"],
            now=r["now"],
        )
        for r in rows
    ]


async def admit_probe(conn: asyncpg.Connection, *, endpoint: str, probe_ttl_s: float) -> bool:
    """Half-open the endpoint's breaker for one probe, if its cool-down is over, no probe is running and one
    of its deliveries is due (the probe's claim then finds it)."""
    return await conn.fetchval(queries.sql("endpoint_breaker_admit_probe"), endpoint, probe_ttl_s) is not None


async def record_outcomes(
        conn: asyncpg.Connection,
        *,
        endpoint: str,
        outcomes: Outcomes,
        breaker_threshold: int,
        cooldown_s: float,
        cooldown_cap_s: float,
        auth_threshold: int,
) -> tuple[str, bool] | None:
    """Fold a round of outcomes into the endpoint's breaker and AuthFailing; returns (breaker state, auth failing)."""
    row = await conn.fetchrow(
        queries.sql("endpoint_record_outcomes"),
        endpoint,
        outcomes.up,
        outcomes.failures,
        outcomes.auth_refusals,
        outcomes.successes,
        outcomes.last_auth_status,
        breaker_threshold,
        cooldown_s,
        cooldown_cap_s,
        auth_threshold,
    )
    return None if row is None else (row["breaker_state"], row["auth_failing"])


def parse_id(text: str) -> DeliveryId:
    """A delivery id as typed by an operator; ValueError names what is wrong."""
    try:
        return DeliveryId(uuid.UUID(text.strip()))
    except ValueError:
        raise ValueError(f"{text!r} is not a delivery id (a UUID such as 0b6f...-...)") from None


async def count_waiting_for_endpoint_by_tenant(conn: asyncpg.Connection) -> dict[str, int]:
    """Per tenant: due or retrying deliveries whose DeliveryEndpoint is not registered (they wait, unclaimed,
    until it appears)."""
    rows = await conn.fetch(queries.sql("delivery_count_waiting_for_endpoint_by_tenant"))
    return {r["tenant"]: int(r["n"]) for r in rows}


# What the operator writes into custom resource status: reads only, one short query each.
@dataclasses.dataclass(frozen=True)
class EndpointStatus:
    """What the operator writes into a DeliveryEndpoint's status."""

    breaker_state: str
    auth_failing: bool
    last_auth_status: int | None
    delivered: int
    pending: int
    unknown: int
    failed: int


async def endpoint_health(conn: asyncpg.Connection | asyncpg.Pool, *, endpoint: str) -> EndpointStatus | None:
    row = await conn.fetchrow(queries.sql("endpoint_get_health"), endpoint)
    if row is None:
        return None
    return EndpointStatus(
        row["breaker_state"], row["auth_failing"], row["last_auth_status"],
        row["delivered"], row["pending"], row["unknown"], row["failed"],
    )  # fmt: skip
