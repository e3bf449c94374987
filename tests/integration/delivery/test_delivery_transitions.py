"""
Every (from, to) pair of delivery states, tried against the SQL that performs each move.

Each operation declares the source states it acts on and is set up favourably for everything
but the state (fresh lease for a finish, expired lease for a reap, due for a claim), so only
its state guard can stop it. Together the operations must perform exactly `states.LEGAL`.
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable

import asyncpg
import pytest

from lading.db import deliveries
from lading.delivery import states
from lading.delivery.states import DeliveryState
from lading.ids import DeliveryId, Fence
from tests.integration.delivery import helpers

Setup = dict[str, bool]
Operation = Callable[[asyncpg.Connection, DeliveryId, Fence], Awaitable[None]]
OWNER = "d1"


async def _claim(conn: asyncpg.Connection, delivery_id: DeliveryId, fence: Fence) -> None:
    await deliveries.claim(conn, endpoints=[helpers.ENDPOINT], owner="d2", limit=1, lease_ttl_s=30)


def _finish(to: DeliveryState) -> Operation:
    async def run(conn: asyncpg.Connection, delivery_id: DeliveryId, fence: Fence) -> None:
        await deliveries.finish_many(conn, [deliveries.Finish(delivery_id, fence, to, "retry")], owner=OWNER)

    return run


def _reap(to: DeliveryState) -> Operation:
    async def run(conn: asyncpg.Connection, delivery_id: DeliveryId, fence: Fence) -> None:
        async with conn.transaction():
            await deliveries.lock_expired_leases(conn, limit=10)
            await deliveries.reap_many(conn, [deliveries.Reap(delivery_id, fence, to, 0.0)])

    return run


async def _redeliver(conn: asyncpg.Connection, delivery_id: DeliveryId, fence: Fence) -> None:
    await deliveries.redeliver(conn, delivery_id=delivery_id, note="test")


async def _resolve(conn: asyncpg.Connection, delivery_id: DeliveryId, fence: Fence) -> None:
    await deliveries.resolve(conn, delivery_id=delivery_id, resolved_by="ops", reason="test")


IN_FLIGHT = frozenset({DeliveryState.IN_FLIGHT})

OPERATIONS: dict[str, tuple[frozenset[DeliveryState], DeliveryState, Operation, Setup]] = {
    "claim": (states.DUE, DeliveryState.IN_FLIGHT, _claim, {}),
    "finish-delivered": (IN_FLIGHT, DeliveryState.DELIVERED, _finish(DeliveryState.DELIVERED), {}),
    "finish-retry": (IN_FLIGHT, DeliveryState.RETRY_SCHEDULED, _finish(DeliveryState.RETRY_SCHEDULED), {}),
    "finish-failed": (IN_FLIGHT, DeliveryState.FAILED_TERMINAL, _finish(DeliveryState.FAILED_TERMINAL), {}),
    "finish-unknown": (IN_FLIGHT, DeliveryState.UNKNOWN_EXTERNAL, _finish(DeliveryState.UNKNOWN_EXTERNAL), {}),
    "reap-retry": (IN_FLIGHT, DeliveryState.RETRY_SCHEDULED, _reap(DeliveryState.RETRY_SCHEDULED),
                   {"lease_expired": True}),
    "reap-unknown": (IN_FLIGHT, DeliveryState.UNKNOWN_EXTERNAL, _reap(DeliveryState.UNKNOWN_EXTERNAL),
                     {"lease_expired": True}),
    "redeliver": (frozenset({DeliveryState.FAILED_TERMINAL, DeliveryState.UNKNOWN_EXTERNAL}), DeliveryState.PENDING,
                  _redeliver, {}),
    "resolve": (frozenset({DeliveryState.UNKNOWN_EXTERNAL}), DeliveryState.DELIVERED, _resolve, {}),
}  # fmt: skip


async def _delivery_in_state(conn: asyncpg.Connection, state: DeliveryState, setup: Setup) -> tuple[DeliveryId, Fence]:
    await helpers.register(conn, "http://127.0.0.1:9/webhooks/lading")
    [job_id] = await helpers.succeed(conn)
    delivery = await helpers.delivery_of(conn, job_id)
    await conn.execute(
        """UPDATE deliveries
              SET state = $2::text, attempt = 1, budget_attempts = 1, fence = 1,
                  first_attempt_at = clock_timestamp(),
                  lease_until = CASE WHEN $2::text = 'IN_FLIGHT' THEN clock_timestamp() + make_interval(secs => $3) END,
                  owner = CASE WHEN $2::text = 'IN_FLIGHT' THEN $4 END,
                  delivered_at = CASE WHEN $2::text = 'DELIVERED' THEN clock_timestamp() END,
                  next_attempt_at = clock_timestamp() - interval '1 second'
            WHERE delivery_id = $1""",
        delivery.id, state.value, -60.0 if setup.get("lease_expired") else 60.0, OWNER,
    )  # fmt: skip
    await conn.execute(
        "INSERT INTO delivery_attempts (delivery_id, fence, attempt, owner, started_at) VALUES ($1, 1, 1, $2, now())",
        delivery.id, OWNER,
    )  # fmt: skip
    return delivery.id, Fence(1)


@pytest.mark.parametrize(
    ("operation", "source"),
    list(itertools.product(OPERATIONS, DeliveryState)),
    ids=lambda v: v if isinstance(v, str) else v.value,
)
async def test_an_operation_moves_a_delivery_exactly_from_its_declared_sources(
        db: asyncpg.Connection, operation: str, source: DeliveryState
) -> None:
    sources, target, run, setup = OPERATIONS[operation]
    delivery_id, fence = await _delivery_in_state(db, source, setup)
    await run(db, delivery_id, fence)
    after = await db.fetchval("SELECT state FROM deliveries WHERE delivery_id = $1", delivery_id)
    if source in sources:
        assert after == target.value, f"{operation} did not move {source.value} -> {target.value}"
    else:
        assert after == source.value, f"{operation} made an illegal move {source.value} -> {after}"


def test_the_operations_together_perform_exactly_the_legal_transitions() -> None:
    performed = {(s, target) for sources, target, _, _ in OPERATIONS.values() for s in sources}
    assert performed == states.LEGAL


def test_delivered_has_no_way_out_and_only_an_operator_leaves_the_other_settled_states() -> None:
    for source, target in states.LEGAL:
        assert source not in states.FINAL
        if source in states.SETTLED:
            assert (source, target) in {
                (DeliveryState.FAILED_TERMINAL, DeliveryState.PENDING),
                (DeliveryState.UNKNOWN_EXTERNAL, DeliveryState.PENDING),
                (DeliveryState.UNKNOWN_EXTERNAL, DeliveryState.DELIVERED),
            }


def test_sources_of_lists_exactly_the_legal_sources() -> None:
    for target in DeliveryState:
        assert states.sources_of(target) == sorted(s.value for s in DeliveryState if states.is_legal(s, target))
