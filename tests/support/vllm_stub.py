"""
A real vLLM metrics endpoint for tests: aiohttp on 127.0.0.1 (a random port) serving `GET /metrics`
in the Prometheus text format vLLM writes, with the load the test sets.

    async with vllm_stub.running() as stub:
        stub.set_load(running=12, waiting=3, kv_cache=0.41)
        load = await headroom.scrape_vllm(session, stub.metrics_url, timeout_s=1)
        stub.mode = "hang"           # or "garbage", "status-500", "huge", "empty", "legacy", "binary"

`legacy` serves the V0 engine's `vllm:gpu_cache_usage_perc` instead of V1's `vllm:kv_cache_usage_perc`.
Each model in `models` gets its own series, as a server with several LoRA/served names does, so a
reader must sum across labels. `/health` answers 200 like vLLM's, for probe-shaped tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator

from aiohttp import web

MODES = ("normal", "legacy", "garbage", "status-500", "hang", "huge", "empty", "binary")


class VllmStub:
    def __init__(self) -> None:
        self.mode = "normal"
        self.models: tuple[str, ...] = ("Qwen/Qwen2.5-7B-Instruct",)
        self.running = 0.0
        """Per model."""
        self.waiting = 0.0
        """Per model."""
        self.kv_cache = 0.0
        self.scrapes = 0
        self.port = 0
        self.closing = asyncio.Event()
        self._runner: web.AppRunner | None = None

    def set_load(self, *, running: float, waiting: float, kv_cache: float) -> None:
        self.running, self.waiting, self.kv_cache = running, waiting, kv_cache

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def metrics_url(self) -> str:
        return f"{self.origin}/metrics"

    def text(self) -> str:
        kv_name = "vllm:gpu_cache_usage_perc" if self.mode == "legacy" else "vllm:kv_cache_usage_perc"
        lines = [
            "# HELP vllm:num_requests_running Number of requests in model execution batches.",
            "# TYPE vllm:num_requests_running gauge",
            *(f'vllm:num_requests_running{{engine="0",model_name="{m}"}} {self.running}' for m in self.models),
            "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
            "# TYPE vllm:num_requests_waiting gauge",
            *(f'vllm:num_requests_waiting{{engine="0",model_name="{m}"}} {self.waiting}' for m in self.models),
            f"# HELP {kv_name} KV-cache usage. 1 means 100 percent usage.",
            f"# TYPE {kv_name} gauge",
            *(f'{kv_name}{{engine="0",model_name="{m}"}} {self.kv_cache}' for m in self.models),
            "# HELP vllm:prompt_tokens_total Number of prefill tokens processed.",
            "# TYPE vllm:prompt_tokens_total counter",
            *(f'vllm:prompt_tokens_total{{engine="0",model_name="{m}"}} 123456.0' for m in self.models),
            "# HELP process_resident_memory_bytes Resident memory size in bytes.",
            "# TYPE process_resident_memory_bytes gauge",
            "process_resident_memory_bytes 1.2e+09",
        ]
        return "\n".join(lines) + "\n"

    async def _metrics(self, request: web.Request) -> web.StreamResponse:
        self.scrapes += 1
        mode = self.mode
        if mode == "hang":
            await self.closing.wait()
            return web.Response(status=503)
        if mode == "status-500":
            return web.Response(status=500, text="Internal Server Error")
        if mode == "garbage":
            return web.Response(text="this is {not prometheus text\n", content_type="text/plain")
        if mode == "empty":
            return web.Response(text="", content_type="text/plain")
        if mode == "binary":
            return web.Response(body=b"\xff\xfe\x00garbage", content_type="text/plain")
        if mode == "huge":
            filler = "# HELP filler " + "x" * 1024 + "\n"
            return web.Response(text=self.text() + filler * 8192, content_type="text/plain")
        return web.Response(text=self.text(), content_type="text/plain", charset="utf-8")

    async def _health(self, request: web.Request) -> web.StreamResponse:
        return web.Response(status=200)

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/health", self._health)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=1.0)
        await self._runner.setup()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        await web.SockSite(self._runner, sock).start()

    async def close(self) -> None:
        self.closing.set()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


@contextlib.asynccontextmanager
async def running() -> AsyncIterator[VllmStub]:
    stub = VllmStub()
    await stub.start()
    try:
        yield stub
    finally:
        await stub.close()
