"""
A real ERP webhook receiver for delivery tests: aiohttp on 127.0.0.1 (a random port) that
records every request and answers as the test programs it.

    async with erp_stub.running() as erp:
        erp.reply = erp_stub.statuses(503, 503, 200)     # change it any time
        ...
        assert erp.requests[0].headers["webhook-id"] == str(delivery_id)

Replies are small functions of the request: fixed statuses, a sequence of statuses, 429 with
Retry-After, a redirect, hanging (accepts the request, never answers), a huge answer. Hanging
replies end when the stub closes, so shutdown never hangs. It does not verify signatures: the
tests do, with the PyPI `standardwebhooks` library, on the recorded requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping

from aiohttp import web

PATH = "/webhooks/lading"

Reply = Callable[["ErpStub", web.Request], Awaitable[web.StreamResponse]]


@dataclasses.dataclass(frozen=True)
class Recorded:
    path: str
    headers: dict[str, str]
    body: bytes


class ErpStub:
    def __init__(self) -> None:
        self.requests: list[Recorded] = []
        self.reply: Reply = status(200)
        self.in_flight = 0
        self.max_in_flight_per_id: dict[str, int] = {}
        self._in_flight_ids: dict[str, int] = {}
        self.closing = asyncio.Event()
        self.url = ""

    @property
    def webhook_url(self) -> str:
        return self.url + PATH

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.requests.append(Recorded(request.path, dict(request.headers), body))
        webhook_id = request.headers.get("webhook-id", "")
        self._in_flight_ids[webhook_id] = self._in_flight_ids.get(webhook_id, 0) + 1
        self.max_in_flight_per_id[webhook_id] = max(
            self.max_in_flight_per_id.get(webhook_id, 0), self._in_flight_ids[webhook_id]
        )
        try:
            return await self.reply(self, request)
        finally:
            self._in_flight_ids[webhook_id] -= 1

    def ids(self) -> list[str]:
        return [r.headers.get("webhook-id", "") for r in self.requests]


def status(code: int, *, headers: Mapping[str, str] | None = None, body: bytes = b"") -> Reply:
    async def reply(_: ErpStub, __: web.Request) -> web.StreamResponse:
        return web.Response(status=code, headers=dict(headers or {}), body=body)

    return reply


def statuses(*codes: int, then: int = 200, headers: Mapping[str, str] | None = None) -> Reply:
    """Answer `codes` in order, then `then` for ever."""
    queue = list(codes)

    async def reply(_: ErpStub, __: web.Request) -> web.StreamResponse:
        code = queue.pop(0) if queue else then
        return web.Response(status=code, headers=dict(headers or {}) if code != then else {})

    return reply


def hang() -> Reply:
    """Read the request, never answer (until the stub closes)."""

    async def reply(stub: ErpStub, _: web.Request) -> web.StreamResponse:
        await stub.closing.wait()
        return web.Response(status=503)

    return reply


def slow(delay_s: float, code: int = 200) -> Reply:
    async def reply(stub: ErpStub, _: web.Request) -> web.StreamResponse:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stub.closing.wait(), delay_s)
        return web.Response(status=code)

    return reply


def huge(total_bytes: int, code: int = 200) -> Reply:
    """A streamed answer of `total_bytes` bytes (the client should stop reading long before)."""

    async def reply(stub: ErpStub, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(status=code)
        response.content_length = total_bytes
        await response.prepare(request)
        chunk = b"x" * 65536
        sent = 0
        with contextlib.suppress(ConnectionError, RuntimeError):
            while sent < total_bytes and not stub.closing.is_set():
                await response.write(chunk)
                sent += len(chunk)
        stub.huge_sent = sent  # type: ignore[attr-defined]
        return response

    return reply


@contextlib.asynccontextmanager
async def running(host: str = "127.0.0.1") -> AsyncIterator[ErpStub]:
    stub = ErpStub()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", stub.handle)
    runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, host, 0)
    await site.start()
    [port] = [address[1] for address in runner.addresses if isinstance(address, tuple)]
    stub.url = f"http://{host}:{port}"
    try:
        yield stub
    finally:
        stub.closing.set()
        await runner.cleanup()
