"""A real HTTP file server on 127.0.0.1 for manifests and documents, with scripted failures."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import socket
from collections.abc import AsyncIterator

from aiohttp import web


class FileServer:
    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        """Body by path, e.g. `/m.jsonl`."""
        self.failures: dict[str, collections.deque[int]] = collections.defaultdict(collections.deque)
        """Statuses the next requests of a path get before it is served (e.g. 503 once)."""
        self.redirects: dict[str, str] = {}
        """Path -> Location header (302)."""
        self.requests: collections.Counter[str] = collections.Counter()
        self.gates: dict[str, asyncio.Event] = {}
        """Path -> event: a request of the path is counted, then answered only once the event is set
        (a stalled or slow server, for as long as the test wants)."""
        self.port = 0
        self._runner: web.AppRunner | None = None

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=1.0)
        await self._runner.setup()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        await web.SockSite(self._runner, sock).start()

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        self.requests[path] += 1
        gate = self.gates.get(path)
        if gate is not None:
            await gate.wait()
        if self.failures[path]:
            return web.Response(status=self.failures[path].popleft(), text="scripted failure")
        if path in self.redirects:
            raise web.HTTPFound(self.redirects[path])
        body = self.files.get(path)
        if body is None:
            return web.Response(status=404, text="not found")
        return web.Response(body=body, content_type="application/octet-stream")


@contextlib.asynccontextmanager
async def running() -> AsyncIterator[FileServer]:
    server = FileServer()
    await server.start()
    try:
        yield server
    finally:
        await server.close()


def unused_port() -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port
