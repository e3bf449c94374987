"""
A small asyncio TCP fault proxy on 127.0.0.1, in front of PostgreSQL (or anything else).

Modes, switched at any time: `pass` (forward both ways), `reset` (accept and close new
connections at once, and cut the open ones), `blackhole` (accept and forward nothing).

Modes that keep open connections (for faults in the middle of an exchange):

- `slow`: forward both ways, each chunk `delay_s` late;
- `stall`: open connections stay open and forward nothing more, new ones are held the same way;
- `drop_replies`: forward what clients send, swallow what the server answers and close the
  client's connection once the answer started (a server that committed, then lost the link);
- `stall_after_headers`: forward each answer up to the end of its HTTP headers, then nothing
  (a server that hangs after the headers);
- `reset_mid_body`: forward each answer up to its headers and `body_bytes` more, then reset the
  client's connection with an RST (`SO_LINGER` 0).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import urllib.parse
from collections.abc import AsyncIterator


class FaultProxy:
    def __init__(self, *, target_host: str, target_port: int, target_unix: str | None) -> None:
        self.mode = "pass"
        self._target = (target_host, target_port, target_unix)
        self._server: asyncio.Server | None = None
        self._links: set[asyncio.StreamWriter] = set()
        self.port = 0
        self.delay_s = 0.2
        """Per-chunk delay of the `slow` mode."""
        self.body_bytes = 16
        """Body bytes `reset_mid_body` lets through before the reset."""
        self._changed = asyncio.Event()

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
        if mode not in MODES:
            raise ValueError(f"unknown fault proxy mode {mode!r}; one of {', '.join(MODES)}")
        self.mode = mode
        self._changed.set()
        self._changed = asyncio.Event()
        if mode in ("reset", "blackhole"):
            self.cut()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.mode == "reset":
            writer.close()
            return
        self._links.add(writer)
        while self.mode == "stall":
            await self._changed.wait()
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
        await asyncio.gather(
            self._pipe(reader, up_writer, replies=False), self._pipe(up_reader, writer, replies=True),
            return_exceptions=True,
        )  # fmt: skip

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, replies: bool) -> None:
        answer = b""  # what this connection's current answer has sent so far (for the HTTP-aware modes)
        try:
            while data := await reader.read(65536):
                while self.mode == "stall":
                    await self._changed.wait()
                if self.mode == "slow":
                    await asyncio.sleep(self.delay_s)
                elif self.mode not in KEEPING:
                    break
                if replies and self.mode == "drop_replies":
                    break  # the server's answer is lost; the client sees its connection close
                if replies and self.mode in ("stall_after_headers", "reset_mid_body"):
                    answer += data
                    end = answer.find(b"\r\n\r\n")
                    if end >= 0:
                        keep = end + 4 + (self.body_bytes if self.mode == "reset_mid_body" else 0)
                        already = len(answer) - len(data)
                        writer.write(data[: max(0, keep - already)])
                        await writer.drain()
                        if self.mode == "reset_mid_body":
                            _reset(writer)
                            return
                        while self.mode == "stall_after_headers":
                            await self._changed.wait()
                        return
                writer.write(data)
                await writer.drain()
        finally:
            writer.close()


MODES = ("pass", "reset", "blackhole", "slow", "stall", "drop_replies", "stall_after_headers", "reset_mid_body")
KEEPING = ("pass", "slow", "drop_replies", "stall_after_headers", "reset_mid_body")
"""Modes in which open connections keep forwarding (what they forward is the mode's business)."""


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with an RST instead of a FIN: the peer reads ECONNRESET."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
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
