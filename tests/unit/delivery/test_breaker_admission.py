"""What a dispatcher may do for an endpoint, from its shared breaker state (pure)."""

from __future__ import annotations

import datetime as dt

from lading.db import deliveries
from lading.delivery import breaker

NOW = dt.datetime(2026, 3, 1, tzinfo=dt.UTC)
SECOND = dt.timedelta(seconds=1)


def _endpoint(state: str, *, open_until: dt.datetime | None = None,
              probe_until: dt.datetime | None = None) -> deliveries.EndpointHealth:  # fmt: skip
    return deliveries.EndpointHealth(
        name="acme/erp", url="https://erp.example/h", spec={}, breaker_state=state, breaker_failures=0,
        breaker_opens=0, breaker_open_until=open_until, breaker_probe_until=probe_until, auth_failures=0,
        auth_failing=False, auth_failing_since=None, last_auth_status=None, now=NOW,
    )  # fmt: skip


def test_closed_claims_open_waits_its_cool_down_then_probes() -> None:
    assert breaker.admission(_endpoint("closed")) is breaker.Admission.CLAIM
    assert breaker.admission(_endpoint("open", open_until=NOW + SECOND)) is breaker.Admission.WAIT
    assert breaker.admission(_endpoint("open", open_until=NOW - SECOND)) is breaker.Admission.PROBE


def test_half_open_waits_while_a_probe_is_in_flight_and_probes_again_when_its_lease_is_over() -> None:
    assert breaker.admission(_endpoint("half_open", probe_until=NOW + SECOND)) is breaker.Admission.WAIT
    assert breaker.admission(_endpoint("half_open", probe_until=NOW - SECOND)) is breaker.Admission.PROBE
