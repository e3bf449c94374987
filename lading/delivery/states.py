"""
The delivery state machine: the one place that says which state changes of a delivery are legal.

    PENDING ──claim──▶ IN_FLIGHT ──2xx──────────────────────▶ DELIVERED
                         │  ├──429/5xx/401/403/network ──▶ RETRY_SCHEDULED ──claim──▶ IN_FLIGHT
                         │  ├──other 4xx, budget spent ──▶ FAILED_TERMINAL
                         │  └──outcome unknown, budget spent ▶ UNKNOWN_EXTERNAL
                         └── lease expired (reap) ──▶ RETRY_SCHEDULED | UNKNOWN_EXTERNAL

    operator (`lading deliveries`):
      FAILED_TERMINAL | UNKNOWN_EXTERNAL ──redeliver──▶ PENDING   (fresh budget, same delivery id)
      UNKNOWN_EXTERNAL ──resolve──▶ DELIVERED                      (reconciled; who and why recorded)

Who moves a delivery out of each state: the dispatcher claims PENDING and RETRY_SCHEDULED once
due and finishes IN_FLIGHT under its fence and lease; the dispatcher's reaper finishes an
IN_FLIGHT whose owner vanished; only an operator moves FAILED_TERMINAL and UNKNOWN_EXTERNAL.
DELIVERED is final.

Every SQL statement that changes `deliveries.state` (lading/db/sql/deliveries.sql) writes its
allowed source states into its guard by hand; they are not generated from this table. What keeps
the two in step is tests/integration/delivery/test_delivery_transitions.py, which tries every
statement from every state and checks the moves it makes against `LEGAL`.
"""

from __future__ import annotations

import enum


class DeliveryState(enum.StrEnum):
    PENDING = "PENDING"                    #: written with the job's success; the dispatcher claims it
    IN_FLIGHT = "IN_FLIGHT"                #: owned by one dispatcher under a lease and a fence
    RETRY_SCHEDULED = "RETRY_SCHEDULED"    #: failed transiently; claimed again once next_attempt_at is due
    DELIVERED = "DELIVERED"                #: final; the receiver answered 2xx (or an operator reconciled it)
    FAILED_TERMINAL = "FAILED_TERMINAL"    #: refused (4xx) or budget spent with no doubt; an operator may redeliver
    UNKNOWN_EXTERNAL = "UNKNOWN_EXTERNAL"  #: budget spent and a request may have been applied; reconcile, then
                                           #: redeliver or resolve


FINAL: frozenset[DeliveryState] = frozenset({DeliveryState.DELIVERED})
"""No transition leaves these states."""

SETTLED: frozenset[DeliveryState] = frozenset(
    {DeliveryState.DELIVERED, DeliveryState.FAILED_TERMINAL, DeliveryState.UNKNOWN_EXTERNAL}
)
"""States no machine moves a delivery out of (only an operator can)."""

DUE: frozenset[DeliveryState] = frozenset({DeliveryState.PENDING, DeliveryState.RETRY_SCHEDULED})
"""States the dispatcher claims from, once next_attempt_at has come."""

FINISHING: frozenset[DeliveryState] = frozenset(
    {
        DeliveryState.DELIVERED,
        DeliveryState.RETRY_SCHEDULED,
        DeliveryState.FAILED_TERMINAL,
        DeliveryState.UNKNOWN_EXTERNAL,
    }
)
"""Where an attempt (or the reaping of an abandoned one) can end."""

LEGAL: frozenset[tuple[DeliveryState, DeliveryState]] = frozenset(
    {
        (DeliveryState.PENDING, DeliveryState.IN_FLIGHT),
        (DeliveryState.RETRY_SCHEDULED, DeliveryState.IN_FLIGHT),
        (DeliveryState.IN_FLIGHT, DeliveryState.DELIVERED),
        (DeliveryState.IN_FLIGHT, DeliveryState.RETRY_SCHEDULED),
        (DeliveryState.IN_FLIGHT, DeliveryState.FAILED_TERMINAL),
        (DeliveryState.IN_FLIGHT, DeliveryState.UNKNOWN_EXTERNAL),
        (DeliveryState.FAILED_TERMINAL, DeliveryState.PENDING),
        (DeliveryState.UNKNOWN_EXTERNAL, DeliveryState.PENDING),
        (DeliveryState.UNKNOWN_EXTERNAL, DeliveryState.DELIVERED),
    }
)
"""Every legal (from, to) pair; anything else is an IllegalTransition."""


def is_legal(source: DeliveryState, target: DeliveryState) -> bool:
    return (source, target) in LEGAL


def sources_of(target: DeliveryState) -> list[str]:
    """The states a delivery may be in for a move to `target`, as SQL text values."""
    return sorted(source.value for source, to in LEGAL if to is target)
