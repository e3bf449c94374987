"""
The SSRF policy end to end: the dispatcher refuses private and special addresses before
connecting (literal or resolved), records why on the attempt, connects only to the address it
vetted, and connects where `--egress-allow` (or a per-endpoint allowance) permits.
"""

from __future__ import annotations

import socket

import aiohttp.abc
import asyncpg
import pytest

from lading.db import deliveries
from lading.delivery import egress
from tests.integration.delivery import helpers
from tests.support import erp_stub


class MapResolver(aiohttp.abc.AbstractResolver):
    """A resolver seam: names resolve to the addresses the test says."""

    def __init__(self, names: dict[str, list[str]]) -> None:
        self.names = names
        self.asked: list[str] = []

    async def resolve(
            self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[aiohttp.abc.ResolveResult]:
        self.asked.append(host)
        return [
            {"hostname": host, "host": ip, "port": port, "family": socket.AF_INET6 if ":" in ip else socket.AF_INET,
             "proto": 0, "flags": socket.AI_NUMERICHOST}
            for ip in self.names[host]
        ]  # fmt: skip

    async def close(self) -> None:
        pass


async def _attempt(db: asyncpg.Connection, job_id: int) -> deliveries.Attempt:
    delivery = await helpers.delivery_of(db, job_id)  # type: ignore[arg-type]
    [attempt] = await deliveries.attempts_of(db, delivery_id=delivery.id)
    return attempt


@pytest.mark.parametrize(
    "url",
    [
        "http://10.1.2.3/h", "http://172.16.0.1/h", "http://192.168.1.1/h", "http://127.0.0.1/h",
        "http://169.254.169.254/latest/meta-data/", "http://100.64.0.1/h", "http://0.0.0.0/h", "http://[::1]/h",
        "http://[fe80::1]/h", "http://[fc00::1]/h", "http://[fd00:ec2::254]/h", "http://[::ffff:127.0.0.1]/h",
        "http://[::ffff:10.0.0.1]/h", "http://2130706433/h", "http://0x7f000001/h", "http://017700000001/h",
        "http://127.1/h", "http://224.0.0.1/h", "http://240.0.0.1/h", "ftp://8.8.8.8/h",
    ],
)  # fmt: skip
async def test_special_addresses_are_refused_before_connecting_and_the_attempt_says_why(
        db: asyncpg.Connection, dbpool: asyncpg.Pool, url: str,
) -> None:
    await helpers.register(db, url)
    [job_id] = await helpers.succeed(db)
    async with helpers.dispatcher(dbpool, loopback_for=()) as d:
        result = await d.run_once()
    assert result.failed == 1
    attempt = await _attempt(db, job_id)
    assert (attempt.outcome, attempt.error_class, attempt.http_status) == ("failed", "EgressRefused", None)
    assert attempt.error and ("refused" in attempt.error or "not http or https" in attempt.error)
    assert "meta-data" not in (attempt.error or ""), "paths are never echoed"


async def test_a_name_resolving_to_a_private_address_is_refused_and_nothing_connects(
        db: asyncpg.Connection, dbpool: asyncpg.Pool,
) -> None:
    resolver = MapResolver({"erp.example.test": ["10.0.0.7"]})
    await helpers.register(db, "http://erp.example.test:8080/webhooks/lading")
    [job_id] = await helpers.succeed(db)
    async with helpers.dispatcher(dbpool, resolver=resolver) as d:
        assert (await d.run_once()).failed == 1
    attempt = await _attempt(db, job_id)
    assert attempt.error_class == "EgressRefused"
    assert attempt.error is not None and "erp.example.test (10.0.0.7) refused: a private address" in attempt.error
    assert resolver.asked == ["erp.example.test"]


async def test_the_connection_goes_to_the_vetted_address_and_any_refused_address_in_the_answer_refuses_it_all(
        db: asyncpg.Connection, dbpool: asyncpg.Pool,
) -> None:
    async with erp_stub.running() as erp:
        port = erp.url.rsplit(":", 1)[1]
        resolver = MapResolver({"erp.example.test": ["127.0.0.1"], "mixed.example.test": ["127.0.0.1", "10.0.0.1"]})
        await helpers.register(db, f"http://erp.example.test:{port}/webhooks/lading")
        await helpers.succeed(db)
        async with helpers.dispatcher(dbpool, resolver=resolver) as d:  # loopback allowed for this endpoint
            assert (await d.run_once()).delivered == 1
            await helpers.register(db, f"http://mixed.example.test:{port}/webhooks/lading")
            [mixed] = await helpers.succeed(db, name="b2")
            assert (await d.run_once()).failed == 1
    assert len(erp.requests) == 1
    assert erp.requests[0].headers["Host"] == f"erp.example.test:{port}"
    assert (await _attempt(db, mixed)).error_class == "EgressRefused"


async def test_an_allow_listed_cidr_permits_what_is_otherwise_refused_and_only_for_whom_it_is_given(
        db: asyncpg.Connection, dbpool: asyncpg.Pool,
) -> None:
    async with erp_stub.running() as erp:
        await helpers.register(db, erp.webhook_url)
        [refused] = await helpers.succeed(db)
        async with helpers.dispatcher(dbpool, loopback_for=("acme/other",)) as d:
            assert (await d.run_once()).failed == 1, "loopback was allowed for another endpoint only"
        [allowed] = await helpers.succeed(db, name="b2")
        async with helpers.dispatcher(dbpool, loopback_for=(), allow=egress.parse_cidrs(["127.0.0.0/8"])) as d:
            assert (await d.run_once()).delivered == 1
    assert (await _attempt(db, refused)).error_class == "EgressRefused"
    assert (await helpers.delivery_of(db, allowed)).state == "DELIVERED"
    assert len(erp.requests) == 1


class BrokenResolver(MapResolver):
    async def resolve(
            self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[aiohttp.abc.ResolveResult]:
        raise RuntimeError("a bug")


async def test_an_unexpected_error_in_one_attempt_is_recorded_as_a_doubtful_attempt_and_the_dispatcher_goes_on(
        db: asyncpg.Connection, dbpool: asyncpg.Pool,
) -> None:
    await helpers.register(db, "http://erp.example.test/webhooks/lading")
    [job_id] = await helpers.succeed(db)
    async with helpers.dispatcher(dbpool, resolver=BrokenResolver({})) as d:
        result = await d.run_once()
    assert result.retried == 1
    delivery = await helpers.delivery_of(db, job_id)
    assert (delivery.state, delivery.last_error_class, delivery.ambiguous_attempts) == (
        "RETRY_SCHEDULED", "DispatcherError", 1
    )
