"""
The per-endpoint circuit breaker, shared by every dispatcher replica through the `endpoints`
table (migration 0006), so a failing ERP is spared by the whole fleet, not by one process.

    closed ──threshold failures in a row──▶ open ──cool-down over──▶ half_open (one probe)
      ▲                                       ▲                          │
      └──────────── probe answered (up) ──────┼──────────────────────────┘
                                              └──── probe failed (cool-down doubles, capped)

The transitions are statements in lading/db/sql/deliveries.sql (`endpoint_record_outcomes`,
`endpoint_breaker_admit_probe`): an admission to probe is a compare-and-set, so at most one
replica probes at a time; the probe's lease frees the slot if its dispatcher dies. This module
is the pure part: what a dispatcher may do for an endpoint it has just read.
"""

from __future__ import annotations

import enum

from lading.db import deliveries


class BreakerState(enum.StrEnum):
    CLOSED = "closed"        #: deliveries flow; failures are counted
    OPEN = "open"            #: nothing is sent until breaker_open_until
    HALF_OPEN = "half_open"  #: one probe delivery is in flight (or may be taken once its lease is over)


GAUGE_VALUE: dict[BreakerState, int] = {BreakerState.CLOSED: 0, BreakerState.HALF_OPEN: 1, BreakerState.OPEN: 2}
"""The value of `lading_delivery_breaker_state`."""


class Admission(enum.Enum):
    CLAIM = "claim"    #: closed: claim as many as there are free slots
    PROBE = "probe"    #: try to become the one prober (admit_probe), then claim one delivery
    WAIT = "wait"      #: open, or another dispatcher's probe is in flight


def admission(endpoint: deliveries.EndpointHealth) -> Admission:
    """What a dispatcher may do for `endpoint` now (by the database clock read with it)."""
    state = BreakerState(endpoint.breaker_state)
    if state is BreakerState.CLOSED:
        return Admission.CLAIM
    if state is BreakerState.OPEN:
        due = endpoint.breaker_open_until is None or endpoint.breaker_open_until <= endpoint.now
        return Admission.PROBE if due else Admission.WAIT
    probing = endpoint.breaker_probe_until is not None and endpoint.breaker_probe_until > endpoint.now
    return Admission.WAIT if probing else Admission.PROBE
