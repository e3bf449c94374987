"""
A small asyncio TCP fault proxy on 127.0.0.1, in front of PostgreSQL (or anything else).

Modes, switched at any time: `pass` (forward both ways), `reset` (accept and close new
connections at once, and cut the open ones), `blackhole` (accept and forward nothing).
"""

from __future__ import annotations

import asyncio
import contextlib
import urllib.parse
from collections.abc import AsyncIterator


class FaultProxy:
    def __init__(self, *, target_host: str, target_port: int, target_unix: str | None) -> None:
        self.mode = "pass"
        self._target = (target_host, target_port, target_unix)
        self._server: asyncio.Server | None = None
        self._links: set[asyncio.StreamWriter] = set()
        self.port = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def cut(self) -> None:
        for writer in list(self._links):
            writer.close()
        self._links.clear()

    def set_mode(self, mode: str) -> None:
        if mode not in ("pass", "reset", "blackhole"):
            raise ValueError(mode)
        self.mode = mode
        if mode != "pass":
            self.cut()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.mode == "reset":
            writer.close()
            return
        self._links.add(writer)
        if self.mode == "blackhole":
            with contextlib.suppress(Exception):
                while await reader.read(65536):
                    pass
            return
        host, port, unix = self._target
        try:
            if unix is not None:
                up_reader, up_writer = await asyncio.open_unix_connection(unix)
            else:
                up_reader, up_writer = await asyncio.open_connection(host, port)
        except OSError:
            writer.close()
            return
        self._links.add(up_writer)
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer), return_exceptions=True)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                if self.mode != "pass":
                    break
                writer.write(data)
                await writer.drain()
        finally:
            writer.close()


@contextlib.asynccontextmanager
async def in_front_of(dsn: str) -> AsyncIterator[tuple[FaultProxy, str]]:
    """A proxy in front of the server of `dsn`, and the same dsn pointed through the proxy."""
    url = urllib.parse.urlsplit(dsn)
    query = urllib.parse.parse_qs(url.query)
    socket_dir = query.get("host", [None])[0]
    port = url.port or 5432
    unix = f"{socket_dir}/.s.PGSQL.{port}" if socket_dir and socket_dir.startswith("/") else None
    proxy = FaultProxy(target_host=url.hostname or "127.0.0.1", target_port=port, target_unix=unix)
    await proxy.start()
    rest = {k: v for k, v in query.items() if k != "host"}
    user = url.username or "postgres"
    password = f":{url.password}" if url.password else ""
    netloc = f"{user}{password}@127.0.0.1:{proxy.port}"
    proxied = urllib.parse.urlunsplit(
        ("postgresql", netloc, url.path, urllib.parse.urlencode(rest, doseq=True), "")
    )
    try:
        yield proxy, proxied
    finally:
        await proxy.stop()
