"""
A stub model server that behaves like vLLM behind an OpenAI-compatible API, for tests,
benchmarks and `lading run` demos without a GPU. Loopback only.

    python hack/stub_model.py --port 0 --latency-ms 200 --rpm 600 --tpm 200000 --concurrency 32

It prints `listening on http://127.0.0.1:PORT/v1` on stdout once it accepts connections.

- `POST /v1/chat/completions`: reads the delimited document from the user message and answers
  with what Lading's builtin rule-based extractor finds in it, after a latency drawn from
  `--latency-ms` ± `--jitter-ms` (counted from the request's arrival, the stub's own parsing and
  extraction included, with `--latency-from-arrival`; after that work otherwise); `usage`
  reports prompt and completion tokens (characters / 4).
- `GET /v1/models`: the served model.
- `GET /metrics`: vLLM's metric names: `vllm:num_requests_running`, `vllm:num_requests_waiting`,
  `vllm:kv_cache_usage_perc` (and the older `vllm:gpu_cache_usage_perc`).
- Its own limits, like a hosted API: more than `--rpm` requests or `--tpm` tokens in any
  `--window-s` (60 s; tests scale it down), more than `--rps` in any second, or more than
  `--concurrency` at once, get a 429 with Retry-After. Tokens are counted when the request
  arrives and stay counted for the whole window, whatever the answer used: the prompt (message
  texts and the response_format schema, characters / 4) plus, with `--accounting reserved` (the
  hosted-API rule), the request's `max_tokens`, or with `--accounting used` (the default, as
  vLLM-based servers count) the completion it will produce. `--strict`: a refused request
  counts too (hosted APIs count unsuccessful requests against the minute), so a client that
  keeps knocking during a storm prolongs it. `--ratelimit-headers`: every answer carries
  OpenAI's `x-ratelimit-limit-*`, `x-ratelimit-remaining-*` and `x-ratelimit-reset-*` headers.
- Faults on demand: `POST /admin/faults` with `{"kind": "429"|"503"|"500"|"401"|"malformed"|
  "truncated"|"hang", "count": N, "retry_after": S}` makes the next N requests fail that way
  (503 is vLLM's overload answer, with Retry-After).
- `GET /admin/stats`: requests, answers by status, most requests/tokens seen in any 60 s window
  and requests in any second, most concurrent requests, with `--latency-from-arrival` how late
  on average an answer went out after its arrival + latency (`answer_late_mean_ms`: the stub's
  own event loop), each request's arrival time (unix seconds, the last `--keep-log`, 10,000 by
  default) and each admitted request's arrival and tokens. `arrivals_total` and `admitted_total`
  count every one since the start; with
  `?arrivals_after=N&admitted_after=M` (earlier totals) only the entries after those come back,
  so a poller streams the whole log however long the run (it misses entries only when more than
  `--keep-log` arrive between two polls, and can tell by the totals).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import math
import random
import re
import socket
import sys
import time
from typing import Any

from aiohttp import web

from lading_demo import builtin

ANSWERS = ("malformed", "truncated")
"""Faults that are answers: the request is admitted and counted against the limits like any other."""
DOCUMENT = re.compile(r"<document-([0-9a-f]+)>\n(.*)\n</document-\1>", re.DOTALL)


class Stub:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.in_flight = 0
        self.max_concurrent = 0
        self.late_s = 0.0  # with --latency-from-arrival: how much later than arrival + latency answers went out
        self.late_answers = 0  # the answers `late_s` sums over
        self.window: collections.deque[tuple[float, int]] = collections.deque()  # (arrival, tokens) admitted
        self.window_tokens = 0
        self.max_window_requests = 0
        self.second: collections.deque[float] = collections.deque()  # admitted arrivals of the last second
        self.max_second_requests = 0
        self.max_window_tokens = 0
        self.statuses: collections.Counter[int] = collections.Counter()
        self.refusals: collections.Counter[str] = collections.Counter()  # 429s of its own limits, by limit
        self.bad_answers: collections.Counter[str] = collections.Counter()  # malformed / truncated answers given
        self.budgets: collections.Counter[int] = collections.Counter()  # admitted requests by max_tokens
        self.arrivals: collections.deque[float] = collections.deque(maxlen=args.keep_log)
        # (arrival, tokens) of admitted requests
        self.admitted: collections.deque[tuple[float, int]] = collections.deque(maxlen=args.keep_log)
        self.arrivals_total = 0  # every arrival since the start, also those the deque let go
        self.admitted_total = 0
        self.faults: list[dict[str, Any]] = []
        self.closing = asyncio.Event()

    def _expire(self, now: float) -> None:
        while self.window and self.window[0][0] <= now - self.args.window_s:
            self.window_tokens -= self.window.popleft()[1]

    async def chat(self, request: web.Request) -> web.StreamResponse:
        arrived = time.time()
        self.arrivals.append(arrived)
        self.arrivals_total += 1
        body = await request.json()
        fault = self._next_fault()
        if fault is not None and fault["kind"] not in ANSWERS:
            return await self._fault(fault)  # refused before any limit is consulted
        user = next((m["content"] for m in body.get("messages", []) if m.get("role") == "user"), "")
        match = DOCUMENT.search(user)
        outcome = builtin.extract_text(match[2] if match else user)
        content = json.dumps(outcome.result if outcome.result is not None else {})
        prompt_chars = sum(len(m.get("content") or "") for m in body.get("messages", []))
        prompt_tokens = (prompt_chars + len(json.dumps(body.get("response_format") or ""))) // 4
        completion_tokens = len(content) // 4
        a = self.args
        max_tokens = body.get("max_tokens") if isinstance(body.get("max_tokens"), int) else completion_tokens
        tokens = prompt_tokens + (max_tokens if a.accounting == "reserved" else completion_tokens)

        self._expire(arrived)
        if self.in_flight + 1 > a.concurrency:
            return self._too_many("concurrency", 1, arrived=arrived, tokens=tokens)
        while self.second and self.second[0] <= arrived - 1.0:
            self.second.popleft()
        if len(self.second) + 1 > a.rps:
            return self._too_many("per-second", 1, arrived=arrived, tokens=tokens)
        if len(self.window) + 1 > a.rpm or self.window_tokens + tokens > a.tpm:
            retry_after = max(1, math.ceil(self.window[0][0] + a.window_s - arrived)) if self.window else 1
            return self._too_many("rate", retry_after, arrived=arrived, tokens=tokens)
        self.second.append(arrived)
        self.admitted.append((arrived, tokens))
        self.admitted_total += 1
        self.max_second_requests = max(self.max_second_requests, len(self.second))
        self._count(arrived, tokens)
        self.budgets[max_tokens] += 1

        if fault is not None:
            self.statuses[200] += 1  # an answer, counted like any other
            self.bad_answers[fault["kind"]] += 1
            return await self._fault(fault, prompt_tokens=prompt_tokens)
        self.in_flight += 1
        self.max_concurrent = max(self.max_concurrent, self.in_flight)
        try:
            latency = max(0.0, random.gauss(a.latency_ms, a.jitter_ms) / 1000) if a.jitter_ms else a.latency_ms / 1000
            due = arrived + latency
            if a.latency_from_arrival:
                latency = max(0.0, latency - (time.time() - arrived))  # its own work is part of the latency
            await asyncio.sleep(latency)
            if a.latency_from_arrival:
                self.late_s += max(0.0, time.time() - due)
                self.late_answers += 1
        finally:
            self.in_flight -= 1
        self.statuses[200] += 1
        return web.json_response({
            "id": "chatcmpl-stub", "object": "chat.completion", "created": int(arrived), "model": a.model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens},
        }, headers=self._ratelimit_headers(time.time()))

    def _count(self, arrived: float, tokens: int) -> None:
        self.window.append((arrived, tokens))
        self.window_tokens += tokens
        self.max_window_requests = max(self.max_window_requests, len(self.window))
        self.max_window_tokens = max(self.max_window_tokens, self.window_tokens)

    def _ratelimit_headers(self, now: float) -> dict[str, str]:
        """OpenAI's rate-limit headers: what is left of the window and when it is whole again."""
        a = self.args
        if not a.ratelimit_headers:
            return {}
        self._expire(now)
        reset_s = (self.window[-1][0] + a.window_s - now) if self.window else 0.0
        return {
            "x-ratelimit-limit-requests": str(a.rpm), "x-ratelimit-limit-tokens": str(a.tpm),
            "x-ratelimit-remaining-requests": str(max(0, a.rpm - len(self.window))),
            "x-ratelimit-remaining-tokens": str(max(0, a.tpm - self.window_tokens)),
            "x-ratelimit-reset-requests": f"{max(0.0, reset_s):.3f}s",
            "x-ratelimit-reset-tokens": f"{max(0.0, reset_s):.3f}s",
        }

    def _too_many(self, why: str, retry_after: int, *, arrived: float, tokens: int) -> web.Response:
        self.statuses[429] += 1
        self.refusals[why] += 1
        if self.args.strict:
            self._count(arrived, tokens)  # hosted APIs count unsuccessful requests against the minute
        return web.json_response(
            {"error": {"message": f"stub {why} limit exceeded", "type": "rate_limit_exceeded"}},
            status=429, headers={"Retry-After": str(retry_after), **self._ratelimit_headers(arrived)},
        )

    def _next_fault(self) -> dict[str, Any] | None:
        if not self.faults:
            return None
        fault = self.faults[0]
        fault["count"] -= 1
        if fault["count"] <= 0:
            self.faults.pop(0)
        return fault

    async def _fault(self, fault: dict[str, Any], *, prompt_tokens: int = 10) -> web.StreamResponse:
        kind = fault["kind"]
        if kind == "429":
            self.statuses[429] += 1
            return web.json_response({"error": {"message": "injected 429", "type": "rate_limit_exceeded"}},
                                     status=429, headers={"Retry-After": str(fault.get("retry_after", 1))})
        if kind == "503":
            self.statuses[503] += 1
            return web.json_response({"error": {"message": "server overloaded", "type": "ServiceUnavailable"}},
                                     status=503, headers={"Retry-After": str(fault.get("retry_after", 1))})
        if kind in ("500", "401"):
            self.statuses[int(kind)] += 1
            return web.json_response({"error": {"message": f"injected {kind}", "type": "InjectedError"}},
                                     status=int(kind))
        if kind == "hang":
            await self.closing.wait()
            raise web.HTTPServiceUnavailable()
        content = "{\"invoice_number\": " if kind == "truncated" else "this is not json"
        return web.json_response({
            "id": "chatcmpl-stub", "object": "chat.completion", "created": int(time.time()), "model": self.args.model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                         "finish_reason": "length" if kind == "truncated" else "stop"}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 5},
        })

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": self.args.model, "object": "model"}]})

    async def metrics(self, request: web.Request) -> web.Response:
        slots = max(1, self.args.concurrency)
        usage = min(1.0, self.in_flight / slots)
        labels = f'{{model_name="{self.args.model}"}}'
        lines = [
            "# TYPE vllm:num_requests_running gauge", f"vllm:num_requests_running{labels} {self.in_flight}",
            "# TYPE vllm:num_requests_waiting gauge", f"vllm:num_requests_waiting{labels} 0",
            "# TYPE vllm:kv_cache_usage_perc gauge", f"vllm:kv_cache_usage_perc{labels} {usage}",
            "# TYPE vllm:gpu_cache_usage_perc gauge", f"vllm:gpu_cache_usage_perc{labels} {usage}",
        ]
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    async def add_fault(self, request: web.Request) -> web.Response:
        fault = await request.json()
        if fault.get("kind") not in ("429", "503", "500", "401", "malformed", "truncated", "hang"):
            return web.json_response(
                {"error": "kind must be 429, 503, 500, 401, malformed, truncated or hang"}, status=400
            )
        self.faults.append({"kind": fault["kind"], "count": int(fault.get("count", 1)),
                            "retry_after": fault.get("retry_after", 1)})
        return web.json_response({"queued": len(self.faults)})

    async def stats(self, request: web.Request) -> web.Response:
        try:
            arrivals_after = int(request.query.get("arrivals_after", 0))
            admitted_after = int(request.query.get("admitted_after", 0))
        except ValueError:
            return web.json_response({"error": "arrivals_after and admitted_after must be integers"}, status=400)
        return web.json_response({
            "requests": len(self.arrivals), "statuses": {str(k): v for k, v in self.statuses.items()},
            "max_window_requests": self.max_window_requests, "max_second_requests": self.max_second_requests,
            "max_window_tokens": self.max_window_tokens,
            "max_concurrent": self.max_concurrent, "in_flight": self.in_flight,
            "answer_late_mean_ms": round(self.late_s / self.late_answers * 1000, 2)
            if self.late_answers else None,
            "arrivals": _after(list(self.arrivals), total=self.arrivals_total, after=arrivals_after),
            "arrivals_total": self.arrivals_total, "admitted_total": self.admitted_total,
            "refusals": dict(self.refusals), "faults_left": sum(f["count"] for f in self.faults),
            "bad_answers": dict(self.bad_answers), "budgets": {str(k): v for k, v in self.budgets.items()},
            "admitted": _after([list(a) for a in self.admitted], total=self.admitted_total, after=admitted_after),
        })


def _after(kept: list[Any], *, total: int, after: int) -> list[Any]:
    """The entries of a log numbered after `after` (1-based, of `total` so far) that are still kept."""
    return kept[max(0, len(kept) - max(0, total - after)):]


async def serve(args: argparse.Namespace) -> None:
    stub = Stub(args)
    app = web.Application(client_max_size=16 * 1024 * 1024)
    app.router.add_post("/v1/chat/completions", stub.chat)
    app.router.add_get("/v1/models", stub.models)
    app.router.add_get("/metrics", stub.metrics)
    app.router.add_post("/admin/faults", stub.add_fault)
    app.router.add_get("/admin/stats", stub.stats)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", args.port))
    await web.SockSite(runner, sock, backlog=1024).start()
    print(f"listening on http://127.0.0.1:{sock.getsockname()[1]}/v1", flush=True)
    try:
        await asyncio.Event().wait()  # until SIGTERM/SIGINT (aiohttp's runner handles them)
    finally:
        stub.closing.set()
        await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1] if __doc__ else None)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--model", default="stub-model")
    parser.add_argument("--latency-ms", type=float, default=200.0)
    parser.add_argument("--jitter-ms", type=float, default=0.0)
    parser.add_argument("--latency-from-arrival", action="store_true",
                        help="answer --latency-ms after the request arrived, its own parsing and extraction "
                             "included (by default they come before the latency)")
    parser.add_argument("--rpm", type=int, default=1_000_000)
    parser.add_argument("--tpm", type=int, default=1_000_000_000)
    parser.add_argument("--rps", type=int, default=1_000_000, help="requests allowed in any one second")
    parser.add_argument("--concurrency", type=int, default=10_000)
    parser.add_argument("--keep-log", type=int, default=10_000,
                        help="arrivals (and admitted requests) /admin/stats keeps; older ones only count")
    parser.add_argument("--window-s", type=float, default=60.0, help="the per-minute limits' window (scaled in tests)")
    parser.add_argument("--accounting", choices=("reserved", "used"), default="used",
                        help="reserved: prompt + max_tokens count (hosted APIs); used: prompt + completion")
    parser.add_argument("--strict", action="store_true", help="refused requests count against the limits too")
    parser.add_argument("--ratelimit-headers", action="store_true", help="send x-ratelimit-* headers")
    args = parser.parse_args(argv)
    try:
        asyncio.run(serve(args))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
