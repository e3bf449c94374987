"""Metrics and probes: readiness follows the database, liveness does not."""

from __future__ import annotations

import secrets

import aiohttp
import asyncpg
import pytest

from lading import health
from tests.support import faultproxy


async def _get(port: int, path: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}{path}") as response:
        return response.status, await response.text()


async def test_readiness_flips_with_the_database_and_liveness_does_not(database_url: str) -> None:
    async with faultproxy.in_front_of(database_url) as (proxy, proxied), health.serving(
        proxied, host="127.0.0.1", port=0
    ) as port:
        assert await _get(port, "/readyz") == (200, "ok\n")
        assert (await _get(port, "/healthz"))[0] == 200

        proxy.set_mode("reset")
        status, body = await _get(port, "/readyz")
        assert status == 503 and body.startswith("database unavailable")
        assert (await _get(port, "/healthz"))[0] == 200

        proxy.set_mode("pass")
        assert await _get(port, "/readyz") == (200, "ok\n")


async def test_readiness_is_false_while_migrations_are_pending(admin_url: str) -> None:
    name = f"lading_empty_{secrets.token_hex(4)}"
    admin = await asyncpg.connect(admin_url)
    await admin.execute(f'CREATE DATABASE "{name}"')
    try:
        state = await health.readiness(admin_url.rsplit("/", 1)[0] + f"/{name}")
        assert not state.ready and state.reason.startswith("migrations pending: 0001")
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


async def test_metrics_are_served_in_prometheus_format(database_url: str) -> None:
    async with health.serving(database_url, host="127.0.0.1", port=0) as port:
        status, body = await _get(port, "/metrics")
    assert status == 200
    for name in ("lading_jobs_claimed_total", "lading_stale_completions_total", "lading_leases_lost_total",
                 "lading_provider_latency_seconds"):
        assert f"# TYPE {name.removesuffix('_total')}" in body


@pytest.mark.parametrize("value", ["9464", "host:", ":80", "h:99999", "h:x"])
def test_a_bad_listen_address_is_a_clear_error(value: str) -> None:
    with pytest.raises(ValueError, match="HOST:PORT"):
        health.parse_listen(value)


def test_listen_addresses_parse() -> None:
    assert health.parse_listen("0.0.0.0:9464") == ("0.0.0.0", 9464)
    assert health.parse_listen("[::1]:80") == ("::1", 80)
