"""
The fault proxy's modes for faults in the middle of an HTTP exchange, against a real server:
the server's work happens and its answer is lost (`drop_replies`), the answer stops after its
headers (`stall_after_headers`), or is cut by an RST in its body (`reset_mid_body`); `pass` again
restores the leg.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from tests.support import faultproxy

BODY = b"x" * 4096


@contextlib.asynccontextmanager
async def _server_and_proxy() -> AsyncIterator[tuple[list[str], faultproxy.FaultProxy, str]]:
    handled: list[str] = []

    async def handle(request: web.Request) -> web.Response:
        handled.append(request.path)
        return web.Response(body=BODY)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    [port] = [a[1] for a in runner.addresses if isinstance(a, tuple)]
    proxy = faultproxy.FaultProxy(target_host="127.0.0.1", target_port=port, target_unix=None)
    await proxy.start()
    try:
        yield handled, proxy, f"http://127.0.0.1:{proxy.port}"
    finally:
        await proxy.stop()
        await runner.cleanup()


async def _get(url: str, *, timeout_s: float = 2.0) -> bytes:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:
        async with session.get(url) as response:
            return await response.read()


async def test_drop_replies_lets_the_server_work_and_loses_its_answer() -> None:
    async with _server_and_proxy() as (handled, proxy, url):
        proxy.set_mode("drop_replies")
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        writer.write(b"POST /commit HTTP/1.1\r\nHost: erp\r\nContent-Length: 2\r\n\r\n{}")
        await writer.drain()
        assert await asyncio.wait_for(reader.read(), 5) == b""  # closed, and not one byte of the answer
        writer.close()
        assert handled == ["/commit"]  # the server did its work
        proxy.set_mode("pass")
        assert await _get(url + "/again") == BODY


async def test_stall_after_headers_sends_the_headers_and_then_nothing() -> None:
    async with _server_and_proxy() as (_, proxy, url):
        proxy.set_mode("stall_after_headers")
        async with aiohttp.ClientSession() as session:
            async with session.get(url + "/hang") as response:  # the headers arrive ...
                assert response.status == 200
                with pytest.raises(TimeoutError):  # ... the body never does
                    await asyncio.wait_for(response.read(), 1.0)
        proxy.set_mode("pass")
        assert await _get(url + "/again") == BODY


async def test_reset_mid_body_cuts_the_answer_with_a_reset() -> None:
    async with _server_and_proxy() as (_, proxy, url):
        proxy.set_mode("reset_mid_body")
        with pytest.raises(aiohttp.ClientPayloadError):
            await _get(url + "/cut")
        proxy.set_mode("pass")
        assert await _get(url + "/again") == BODY


async def test_an_unknown_mode_is_refused_by_name() -> None:
    proxy = faultproxy.FaultProxy(target_host="127.0.0.1", target_port=1, target_unix=None)
    with pytest.raises(ValueError, match="unknown fault proxy mode 'cut'"):
        proxy.set_mode("cut")
