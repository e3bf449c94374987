"""
Token lookups of the intake: requests that miss the cached lookup of one token at the same moment
(as every request in flight does when it expires under load) share one database lookup.
"""

from __future__ import annotations

import asyncio

import asyncpg
import pytest
from lading_api import app, openapi
from lading_api.settings import ApiSettings

from lading import access
from lading.db import api_tokens
from lading.settings import DocumentSettings
from tests.integration.api.conftest import Tenant


async def test_concurrent_requests_whose_lookup_expired_share_one_lookup(
        acme: Tenant, dbpool: asyncpg.Pool, database_url: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    lookups = 0
    authenticate = api_tokens.authenticate

    async def counted(conn: asyncpg.Connection, *, token_sha256: str) -> api_tokens.Principal | None:
        nonlocal lookups
        lookups += 1
        return await authenticate(conn, token_sha256=token_sha256)

    monkeypatch.setattr(api_tokens, "authenticate", counted)
    intake = app.Intake(db=dbpool, guards=dbpool, dsn=database_url, settings=ApiSettings(token_cache_s=60),
                        documents=DocumentSettings(), openapi=openapi.document())  # fmt: skip
    digest = access.digest(acme.token)
    first = await asyncio.gather(*(intake._principal(digest) for _ in range(20)))
    assert lookups == 1 and all(p is not None and p.namespaces == frozenset({"acme"}) for p in first)
    intake._principals.clear()  # the cached lookup expired
    again = await asyncio.gather(*(intake._principal(digest) for _ in range(20)))
    assert lookups == 2 and again == first
    stranger = access.digest(access.mint())
    unknown = await asyncio.gather(*(intake._principal(stranger) for _ in range(5)))
    assert unknown == [None] * 5 and lookups == 3
    await intake._principal(stranger)  # an unknown token is never kept
    assert lookups == 4
    assert intake._lookups == {}
