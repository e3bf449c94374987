"""Headroom signals: vLLM /metrics scraped from a real HTTP server, parsed, turned into a fraction; external pools."""

from __future__ import annotations

import datetime as dt
import time

import aiohttp
import pytest
from lading_operator import headroom, scaling

from tests.support import vllm_stub

NOW = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)


# --- parsing


def test_parse_sums_requests_across_models_and_reads_the_newer_cache_name() -> None:
    stub = vllm_stub.VllmStub()
    stub.models = ("a", "b", "c")
    stub.set_load(running=4, waiting=1, kv_cache=0.25)
    load = headroom.parse_vllm_metrics(stub.text())
    assert load == headroom.VllmLoad(running=12.0, waiting=3.0, kv_cache_usage=0.25)


def test_parse_reads_the_legacy_gpu_cache_name() -> None:
    stub = vllm_stub.VllmStub()
    stub.mode = "legacy"
    stub.set_load(running=2, waiting=0, kv_cache=0.5)
    assert headroom.parse_vllm_metrics(stub.text()).kv_cache_usage == 0.5


def test_parse_prefers_the_newer_name_when_both_are_exported() -> None:
    text = (
        "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 1\n"
        "# TYPE vllm:gpu_cache_usage_perc gauge\nvllm:gpu_cache_usage_perc 0.9\n"
        "# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc 0.2\n"
    )
    assert headroom.parse_vllm_metrics(text).kv_cache_usage == 0.2


def test_parse_without_cache_metric_reports_it_unknown() -> None:
    load = headroom.parse_vllm_metrics("vllm:num_requests_waiting 5\n")
    assert load == headroom.VllmLoad(running=0.0, waiting=5.0, kv_cache_usage=None)


def test_parse_ignores_nan_and_clamps_the_cache_fraction() -> None:
    text = "vllm:num_requests_running NaN\nvllm:num_requests_waiting 2\nvllm:kv_cache_usage_perc 1.7\n"
    assert headroom.parse_vllm_metrics(text) == headroom.VllmLoad(running=0.0, waiting=2.0, kv_cache_usage=1.0)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("this is {not prometheus\n", "not Prometheus text"),
        ("", "not a vLLM server"),
        ("process_resident_memory_bytes 1e9\n", "not a vLLM server"),
    ],
)
def test_parse_rejects_what_is_not_vllm_metrics(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        headroom.parse_vllm_metrics(text)


# --- scraping a real server


async def test_scrape_reads_the_stub_and_follows_its_changes() -> None:
    async with vllm_stub.running() as stub, aiohttp.ClientSession() as session:
        stub.set_load(running=10, waiting=0, kv_cache=0.3)
        first = await headroom.scrape_vllm(session, stub.metrics_url, timeout_s=2)
        stub.set_load(running=40, waiting=7, kv_cache=0.95)
        second = await headroom.scrape_vllm(session, stub.metrics_url, timeout_s=2)
    assert first == headroom.VllmLoad(running=10.0, waiting=0.0, kv_cache_usage=0.3)
    assert second == headroom.VllmLoad(running=40.0, waiting=7.0, kv_cache_usage=0.95)
    assert stub.scrapes == 2


@pytest.mark.parametrize("mode", ["garbage", "status-500", "huge", "empty", "binary"])
async def test_scrape_of_a_broken_server_is_none_not_an_error(mode: str) -> None:
    async with vllm_stub.running() as stub, aiohttp.ClientSession() as session:
        stub.mode = mode
        assert await headroom.scrape_vllm(session, stub.metrics_url, timeout_s=2, max_bytes=1024 * 1024) is None
        assert stub.scrapes == 1


async def test_scrape_of_a_hanging_server_gives_up_at_the_timeout() -> None:
    async with vllm_stub.running() as stub, aiohttp.ClientSession() as session:
        stub.mode = "hang"
        started = time.monotonic()
        assert await headroom.scrape_vllm(session, stub.metrics_url, timeout_s=0.3) is None
        elapsed = time.monotonic() - started
    assert 0.25 <= elapsed < 2.0


async def test_scrape_of_a_closed_port_is_none() -> None:
    async with vllm_stub.running() as stub:
        url = stub.metrics_url
    async with aiohttp.ClientSession() as session:
        assert await headroom.scrape_vllm(session, url, timeout_s=1) is None


# --- headroom fractions


@pytest.mark.parametrize(
    ("load", "max_num_seqs", "replicas", "fraction", "reason"),
    [
        (None, None, 1, None, "vLLM metrics unavailable"),
        (headroom.VllmLoad(0, 0, 0.0), None, 1, 1.0, "vLLM: 0 of 256 sequences running, KV cache 0%"),
        (headroom.VllmLoad(64, 0, 0.1), 128, 1, 0.5, "vLLM: 64 of 128 sequences running, KV cache 10%"),
        (headroom.VllmLoad(64, 0, 0.1), 128, 2, 0.75, "vLLM: 64 of 256 sequences running"),
        (headroom.VllmLoad(10, 0, 0.45), 128, 1, 0.5, "KV cache 45%"),
        (headroom.VllmLoad(10, 0, None), 100, 1, 0.9, "vLLM: 10 of 100 sequences running"),
        (headroom.VllmLoad(10, 3, 0.2), 128, 1, 0.0, "vLLM: 3 requests waiting, KV cache 20%"),
        (headroom.VllmLoad(10, 0, 0.92), 128, 1, 0.0, "vLLM: KV cache 92% used"),
        (headroom.VllmLoad(300, 0, 0.5), 128, 1, 0.0, "vLLM: 300 of 128 sequences running"),
    ],
)
def test_vllm_headroom(
        load: headroom.VllmLoad | None,
        max_num_seqs: int | None,
        replicas: int,
        fraction: float | None,
        reason: str,
) -> None:
    result = headroom.vllm_headroom(load, max_num_seqs=max_num_seqs, replicas=replicas)
    if fraction is None:
        assert result.fraction is None
    else:
        assert result.fraction == pytest.approx(fraction)
    assert reason in result.reason
    assert result.exhausted == (fraction is not None and fraction < scaling.HEADROOM_EXHAUSTED_BELOW)


def test_loads_of_two_replicas_add_up_and_the_fuller_cache_counts() -> None:
    total = headroom.VllmLoad(3, 1, 0.2) + headroom.VllmLoad(5, 0, None) + headroom.VllmLoad(1, 0, 0.7)
    assert total == headroom.VllmLoad(9, 1, 0.7)


def test_engine_not_ready_is_no_headroom() -> None:
    result = headroom.engine_not_ready(ready=0, desired=1)
    assert result.exhausted and result.reason == "vLLM not ready (0/1 replicas)"


@pytest.mark.parametrize(
    ("kwargs", "fraction", "reason"),
    [
        ({}, None, "no recent 429"),
        ({"paused_until": NOW + dt.timedelta(seconds=90), "paused_reason": "key refused"}, 0.0,
         "pool paused for 90s: key refused"),
        ({"paused_until": NOW - dt.timedelta(seconds=1)}, None, "no recent 429"),
        ({"cooldown_until": NOW + dt.timedelta(seconds=7)}, 0.0, "429 cooldown, 7s left"),
        ({"cooldown_until": NOW - dt.timedelta(seconds=7)}, None, "no recent 429"),
        ({"last_rate_limited_at": NOW - dt.timedelta(seconds=12)}, 0.0, "429 from the provider 12s ago"),
        ({"last_rate_limited_at": NOW - dt.timedelta(seconds=61)}, None, "no recent 429"),
        ({"remaining_fraction": 0.25}, 0.25, "rate limit 25% left"),
        ({"remaining_fraction": 1.5}, 1.0, "rate limit 100% left"),
        ({"remaining_fraction": float("nan")}, None, "no recent 429"),
    ],
)
def test_external_headroom(kwargs: dict[str, object], fraction: float | None, reason: str) -> None:
    result = headroom.external_headroom(now=NOW, **kwargs)  # type: ignore[arg-type]
    assert (result.fraction, result.reason) == (fraction, reason)


def test_headroom_renders_for_the_status_column() -> None:
    assert scaling.Headroom(0.4567, "x").render() == "0.46"
    assert scaling.Headroom(1.2, "x").render() == "1.00"
    assert scaling.Headroom.unknown().render() is None
