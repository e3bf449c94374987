"""
The fault suite reads the stub model's whole log however long the run: the stub keeps only its
last entries (10,000 by default; 5 here), and the recorder streams them by the stub's running
totals, so the limiter figures count every request the model saw, and a poll too slow to keep up
is counted as missed rather than passing silently.
"""

from __future__ import annotations

from typing import Any

import aiohttp

from hack.reliability import checker, history
from tests.support import stub_model

KEEP = 5


async def _send(session: aiohttp.ClientSession, url: str, count: int) -> None:
    for i in range(count):
        body = {"model": "stub-model", "messages": [{"role": "user", "content": f"invoice {i}"}]}
        async with session.post(url + "/chat/completions", json=body) as response:
            assert response.status == 200


async def test_the_streamed_log_holds_every_request_when_the_stub_keeps_only_its_last_few() -> None:
    async with stub_model.running("--latency-ms", "0", "--keep-log", str(KEEP)) as stub:
        log = history.ModelLog(stub.origin)
        async with aiohttp.ClientSession() as session:
            for _ in range(6):  # 24 requests, never more than the stub keeps between two polls
                await _send(session, stub.url, KEEP - 1)
                await log.poll()
        assert len(log.arrivals) == len(log.admitted) == 24 and log.missed == 0
        assert log.arrivals == sorted(log.arrivals) and len(set(log.arrivals)) == 24
        assert len((await stub.stats())["arrivals"]) == KEEP  # what a single read at the end would see

        async with aiohttp.ClientSession() as session:
            await _send(session, stub.url, KEEP + 3)  # more than it keeps before the next poll
        await log.poll()
        assert log.missed == 2 * 3  # arrivals and admitted, 3 of each let go
        assert len(log.arrivals) == 24 + KEEP


def test_the_request_overshoot_counts_a_window_larger_than_the_stub_keeps() -> None:
    start = 1_000_000.0
    admitted = [[start + i * 0.004, 10] for i in range(12_000)]  # 12,000 requests in 48 s
    h: dict[str, Any] = {
        "scenario": "s", "seed": 1, "started": start, "ended": start + 60, "submitted": {}, "faults": [],
        "kills": [], "observations": [], "events_seen": [], "bounds": {}, "notes": [],
        "model": {"limits": {"rpm": 11_000, "tpm": 10**9, "concurrency": 16},
                   "stats": {"admitted": admitted, "arrivals": [a[0] for a in admitted], "max_concurrent": 1,
                             "refusals": {}, "log_missed": 0}},
        "final": {k: [] for k in ("jobs", "attempts", "results", "stale", "outbox", "inbox", "deliveries",
                                   "delivery_attempts", "erp_inbox", "ledger")}}  # fmt: skip
    figures = checker.check(h)
    assert figures["limiter_overshoot_requests"] == 1_000
    h["model"]["stats"]["log_missed"] = 3
    assert checker.violations(checker.check(h))["model_log_missed"] == 3
