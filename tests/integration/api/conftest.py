"""
HTTP intake fixtures: a real `python -m lading_api` process on the run's database, tenants with
tokens, and a client that speaks to it.

    acme     namespace acme, maxQueuedJobs 1000, pool lading-system/builtin
    globex   namespace globex: the other tenant of the cross-tenant tests
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import asyncpg
import pytest

from lading import access
from lading.db import api_tokens, registry
from lading.ids import PoolName, TenantName
from tests.support import processes

POOL = PoolName("lading-system/builtin")
_LISTENING = re.compile(rb"lading api: listening on (http://\S+)")


@dataclasses.dataclass
class ApiProcess:
    process: subprocess.Popen[bytes]
    base_url: str

    def kill(self) -> None:
        """SIGKILL it (if it still runs) and reap it."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=30)
        if self.process.stdout is not None:
            self.process.stdout.close()


def start_api(database_url: str, *, failpoints: str | None = None, args: tuple[str, ...] = ()) -> ApiProcess:
    """`python -m lading_api` on a free loopback port; returns once it listens."""
    env = processes.environment(**({"LADING_FAILPOINTS": failpoints} if failpoints else {}))
    process = subprocess.Popen(
        [sys.executable, "-m", "lading_api", "--port", "0", "--database-url", database_url, *args],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    assert process.stdout is not None
    seen = b""
    while True:
        line = process.stdout.readline()  # the process prints the line at once, or exits
        if not line:
            process.wait(timeout=30)
            process.stdout.close()
            raise RuntimeError(f"lading api exited with {process.returncode}: {seen.decode(errors='replace')}")
        seen += line
        if match := _LISTENING.search(line):
            return ApiProcess(process, match[1].decode())


@pytest.fixture(scope="module")
def api_server(database_url: str) -> Iterator[ApiProcess]:
    server = start_api(database_url)
    try:
        yield server
    finally:
        server.kill()


@dataclasses.dataclass(frozen=True)
class Tenant:
    namespace: str
    token: str

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}


async def make_tenant(
        conn: asyncpg.Connection,
        namespace: str,
        *,
        max_queued_jobs: int | None = 1000,
        spec: dict[str, Any] | None = None,
) -> Tenant:
    await registry.upsert_tenant(
        conn, name=TenantName(namespace), namespaces=[namespace], weight=1, max_queued_jobs=max_queued_jobs,
        max_in_flight=None, spec=spec or {},
    )  # fmt: skip
    await registry.upsert_pool(conn, name=POOL, provider="builtin", model="lading-builtin", spec={})
    token = access.mint()
    await api_tokens.insert(conn, name=f"{namespace}-token", token_sha256=access.digest(token),
                            namespaces=[namespace], expires_at=None)
    return Tenant(namespace, token)


@pytest.fixture
async def acme(db: asyncpg.Connection) -> Tenant:
    return await make_tenant(db, "acme")


@pytest.fixture
async def globex(db: asyncpg.Connection) -> Tenant:
    return await make_tenant(db, "globex")


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        yield session


def document(key: str = "inv-0001", text: str = "Invoice 0001\nTotal 10.00 EUR", **extra: Any) -> dict[str, Any]:
    return {"key": key, "text": text, "inferencePoolRef": str(POOL), **extra}


@dataclasses.dataclass(frozen=True)
class Answer:
    status: int
    headers: Any
    body: Any


async def call(
        http: aiohttp.ClientSession,
        method: str,
        url: str,
        *,
        tenant: Tenant | None = None,
        key: str | None = None,
        json: Any = None,
        data: Any = None,
        headers: dict[str, str] | None = None,
) -> Answer:
    sent = {**(tenant.auth if tenant else {}), **({"Idempotency-Key": key} if key else {}), **(headers or {})}
    async with http.request(method, url, json=json, data=data, headers=sent, allow_redirects=False) as response:
        raw = await response.read()
        body: Any = raw
        with contextlib.suppress(ValueError):
            if response.content_type in ("application/json", "application/problem+json"):
                body = await response.json(content_type=None)
        return Answer(response.status, response.headers, body)
