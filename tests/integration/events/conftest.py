"""Fixtures of the event tests: a unique broker topology per test, deleted afterwards."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aio_pika.abc
import pytest

from lading.settings import BrokerTopology, EventSettings, IngressSettings, RelaySettings
from tests.support import broker


@pytest.fixture
def names() -> BrokerTopology:
    return broker.unique_topology()


@pytest.fixture
def event_settings(names: BrokerTopology) -> EventSettings:
    return EventSettings(
        topology=names,
        relay=RelaySettings(batch_size=100, claim_ttl_s=5.0, poll_interval_s=0.05, publish_timeout_s=2.0,
                            refused_retry_s=30.0, reconnect_base_s=0.05, reconnect_cap_s=0.5),
        ingress=IngressSettings(prefetch=16, retry_base_s=0.05, retry_cap_s=0.5, reconnect_base_s=0.05,
                                reconnect_cap_s=0.5),
    )  # fmt: skip


@pytest.fixture
async def channel(amqp_url: str, names: BrokerTopology) -> AsyncIterator[aio_pika.abc.AbstractChannel]:
    async with broker.declared(amqp_url, names) as ch:
        yield ch
