"""hack/stub_model.py as a real process for tests: started on a free loopback port, stopped by PID."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import urllib.request
from collections.abc import AsyncIterator
from typing import Any

from tests.support import processes

SCRIPT = processes.ROOT / "hack" / "stub_model.py"


class StubProcess:
    def __init__(self, process: asyncio.subprocess.Process, url: str) -> None:
        self.process = process
        self.url = url
        """Base URL of the OpenAI API (ends in /v1)."""
        self.origin = url.removesuffix("/v1")

    async def stats(self) -> dict[str, Any]:
        return await asyncio.to_thread(self._get, "/admin/stats")

    async def fault(self, kind: str, *, count: int = 1, retry_after: int = 1) -> None:
        body = json.dumps({"kind": kind, "count": count, "retry_after": retry_after}).encode()
        await asyncio.to_thread(self._post, "/admin/faults", body)

    def _get(self, path: str) -> dict[str, Any]:
        with urllib.request.urlopen(self.origin + path, timeout=5) as response:
            result: dict[str, Any] = json.load(response)
            return result

    def _post(self, path: str, body: bytes) -> None:
        request = urllib.request.Request(
            self.origin + path, data=body, method="POST", headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=5):
            pass


@contextlib.asynccontextmanager
async def running(*args: str) -> AsyncIterator[StubProcess]:
    process = await asyncio.create_subprocess_exec(
        sys.executable, str(SCRIPT), "--port", "0", *args,
        env=processes.environment(), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        async with asyncio.timeout(30):
            line = (await process.stdout.readline()).decode().strip()
        if not line.startswith("listening on "):
            raise RuntimeError(f"stub model server did not start: {line!r}")
        yield StubProcess(process, line.removeprefix("listening on "))
    finally:
        await processes.stop(process)
