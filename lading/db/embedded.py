"""
A real PostgreSQL server started on demand, for `lading run` and the test suite when
no `DATABASE_URL` is given. It uses the `pgserver` wheel (PostgreSQL 16 binaries in a
Python package; starts in about a second) and listens on a Unix socket in its data
directory only, so nothing is exposed on the network.

Run as root, pgserver creates a system user `pgserver` to own the server process (the
PostgreSQL server refuses to run as root) and makes the data directory's parent folders
traversable for that user. Keep the data directory under the project's own state folder
(`.lading/`), never under a shared or sensitive path.
"""

from __future__ import annotations

import contextlib
import dataclasses
import pathlib
import warnings
from collections.abc import Iterator
from typing import Any

STATE_DIR = pathlib.Path(".lading")
"""The project's own state folder (git-ignored)."""


@dataclasses.dataclass(frozen=True)
class EmbeddedServer:
    dsn: str
    data_dir: pathlib.Path


@contextlib.contextmanager
def running(data_dir: pathlib.Path, *, delete_on_exit: bool) -> Iterator[EmbeddedServer]:
    """Start (or attach to) an embedded server in `data_dir`; stop it (and delete the data if asked) on exit."""
    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset (containers, CI); harmless here.
        warnings.simplefilter("ignore")
        import pgserver  # imported lazily: only this path needs the server binaries

        data_dir.parent.mkdir(parents=True, exist_ok=True)
        get_server: Any = getattr(pgserver, "get_server")  # noqa: B009 - untyped package, no explicit export
        server: Any = get_server(data_dir.resolve(), cleanup_mode="delete" if delete_on_exit else "stop")
        dsn = server.get_uri()
    try:
        yield EmbeddedServer(dsn=dsn, data_dir=data_dir)
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            server.cleanup()
