"""
Where the dispatcher gets an endpoint's signing secrets: never from PostgreSQL.

    SecretSource.keys_for("acme/erp") -> (SigningKey, ...)   one per active secret; () when none

Two sources:

- `StaticSecrets`: a dict, filled by `lading run` from the manifests' Secrets.
- `DirectorySecrets(path)`: a file per endpoint, `<path>/<namespace>.<name>`, one secret per
  line (several lines = a rotation: every delivery is signed with each, so the receiver may
  hold either). The operator mounts the endpoints' Secrets there in the worker Deployment
  (`--endpoint-secrets-dir`, `$LADING_ENDPOINT_SECRETS_DIR`). A file is re-read when its
  modification time changes, so a rotation needs no restart.

An endpoint without a usable secret has no keys: its deliveries stay due and are counted
(`lading_deliveries_waiting_for_secret`), never failed. Secrets never appear in an
exception, a log line or a repr; an unusable file is named, its content is not.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import pathlib
from collections.abc import Mapping, Sequence
from typing import Final, Protocol

from lading.webhooks import signing

logger = logging.getLogger(__name__)

ENV_VAR: Final = "LADING_ENDPOINT_SECRETS_DIR"
MAX_FILE_BYTES: Final = 64 * 1024
"""A secrets file larger than this is refused unread: a handful of secrets is well under a kilobyte."""
MAX_KEYS: Final = signing.MAX_SIGNATURES
"""More secrets than a receiver would check are pointless; the rest are ignored (and logged)."""


class SecretSource(Protocol):
    def keys_for(self, endpoint: str) -> tuple[signing.SigningKey, ...]:
        """The active signing keys of the endpoint (`namespace/name`); () when it has none."""
        ...


class StaticSecrets:
    """Secrets given up front (by `lading run`, or a test): endpoint -> secrets in `whsec_` form."""

    def __init__(self, secrets: Mapping[str, Sequence[str]]) -> None:
        self._keys = {endpoint: signing.parse_keys(values) for endpoint, values in secrets.items() if values}

    def keys_for(self, endpoint: str) -> tuple[signing.SigningKey, ...]:
        return self._keys.get(endpoint, ())

    def __repr__(self) -> str:
        return f"StaticSecrets(endpoints={sorted(self._keys)})"


@dataclasses.dataclass
class _Cached:
    mtime_ns: int
    size: int
    keys: tuple[signing.SigningKey, ...]


class DirectorySecrets:
    """One file per endpoint, `<namespace>.<name>`, one secret per line; re-read when it changes."""

    def __init__(self, path: pathlib.Path | str) -> None:
        self.path = pathlib.Path(path)
        self._cache: dict[str, _Cached] = {}

    def _file(self, endpoint: str) -> pathlib.Path | None:
        namespace, sep, name = endpoint.partition("/")
        if not sep or not namespace or not name or "/" in name or name.startswith(".") or namespace.startswith("."):
            return None
        return self.path / f"{namespace}.{name}"

    def keys_for(self, endpoint: str) -> tuple[signing.SigningKey, ...]:
        file = self._file(endpoint)
        if file is None:
            return ()
        try:
            stat = file.stat()
        except OSError:
            self._cache.pop(endpoint, None)
            return ()
        cached = self._cache.get(endpoint)
        if cached is not None and cached.mtime_ns == stat.st_mtime_ns and cached.size == stat.st_size:
            return cached.keys
        keys = self._read(file, stat.st_size)
        self._cache[endpoint] = _Cached(stat.st_mtime_ns, stat.st_size, keys)
        return keys

    def _read(self, file: pathlib.Path, size: int) -> tuple[signing.SigningKey, ...]:
        if size > MAX_FILE_BYTES:
            logger.error("Signing secrets file %s is larger than %d bytes; ignored", file, MAX_FILE_BYTES)
            return ()
        try:
            text = file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            logger.error("Signing secrets file %s cannot be read (%s); ignored", file, type(exc).__name__)
            return ()
        keys: list[signing.SigningKey] = []
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            try:
                keys.append(signing.SigningKey.parse(line))
            except signing.SecretFormatError as exc:
                logger.error("Signing secrets file %s, line %d: %s; line ignored", file, number, exc)
        if len(keys) > MAX_KEYS:
            logger.error("Signing secrets file %s has %d secrets; the first %d are used", file, len(keys), MAX_KEYS)
            keys = keys[:MAX_KEYS]
        return tuple(keys)

    def __repr__(self) -> str:
        return f"DirectorySecrets({str(self.path)!r})"


def from_environment() -> DirectorySecrets | None:
    """`$LADING_ENDPOINT_SECRETS_DIR`, if set."""
    value = os.environ.get(ENV_VAR)
    return DirectorySecrets(value) if value else None
