"""
Schemathesis against a live `lading api` (`make api-fuzz`): the intake's OpenAPI document drives
generated requests, valid and invalid, with the document's stateful links; every answer must be
no 5xx and conform to the document (status, content type, headers, body schema).

Creates its own database on $DATABASE_URL (an admin URL; default the local server), migrates and
seeds it (tenant `acme`, pool `lading-system/qwen`: the one the document's request examples name,
so requests made from them are accepted and the stateful links lead to objects that exist; a
token), runs the intake on a free loopback port, runs `st run` against it, and drops the
database. Extra arguments go to `st run` (e.g. `--max-examples 200`). Needs the `schemathesis`
package (the make target installs it).
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import re
import secrets
import shutil
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "api")]

import asyncpg  # noqa: E402

from lading import access  # noqa: E402
from lading.db import api_tokens, migrating, registry  # noqa: E402
from lading.db import pool as dbpool  # noqa: E402
from lading.ids import PoolName, TenantName  # noqa: E402

ADMIN_URL = os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


async def _prepare(admin_url: str, name: str) -> tuple[str, str]:
    admin = await asyncpg.connect(admin_url)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    url = admin_url.rpartition("/")[0] + f"/{name}"
    conn = await dbpool.connect(url)
    try:
        await migrating.migrate(conn)
        await registry.upsert_tenant(conn, name=TenantName("acme"), namespaces=["acme"], weight=1,
                                     max_queued_jobs=10_000, max_in_flight=None, spec={})
        await registry.upsert_pool(conn, name=PoolName("lading-system/qwen"), provider="builtin",
                                   model="lading-builtin", spec={})
        token = access.mint()
        await api_tokens.insert(conn, name="fuzz", token_sha256=access.digest(token), namespaces=["acme"],
                                expires_at=None)
    finally:
        await conn.close()
    return url, token


async def _drop(admin_url: str, name: str) -> None:
    admin = await asyncpg.connect(admin_url)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


def main(argv: list[str]) -> int:
    st = shutil.which("st") or str(pathlib.Path(sys.executable).parent / "st")
    name = f"lading_fuzz_{os.getpid()}_{secrets.token_hex(3)}"
    url, token = asyncio.run(_prepare(ADMIN_URL, name))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(p) for p in (ROOT, ROOT / "api", ROOT / "cli"))}
    server = subprocess.Popen([sys.executable, "-m", "lading_api", "--port", "0", "--database-url", url],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        assert server.stdout is not None
        match = re.search(r"listening on (http://\S+)", server.stdout.readline().decode())
        if match is None:
            print("api_fuzz: lading api did not start", file=sys.stderr)
            return 2
        # The token's namespace in every path: elsewhere everything is 404 and nothing gets created
        # for the document's links to follow (other namespaces' 404s are the cross-tenant tests').
        config = pathlib.Path(os.environ.get("TMPDIR", "/tmp")) / f"{name}.toml"
        config.write_text('parameters = { "path.namespace" = "acme" }\n', encoding="utf-8")
        command = [st, "--config-file", str(config), "run", f"{match[1]}/openapi.json", "--url", match[1],
                   "--header", f"Authorization: Bearer {token}", "--checks", "all",
                   # A cancelled batch (DELETE) stays readable with its final status, as a custom
                   # resource's status outlives its jobs: 200 after DELETE is the documented answer.
                   "--exclude-checks", "positive_data_acceptance,use_after_free", *argv]  # fmt: skip
        return subprocess.run(command, check=False).returncode
    finally:
        server.kill()
        server.wait()
        if server.stdout is not None:
            server.stdout.close()
        asyncio.run(_drop(ADMIN_URL, name))


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
