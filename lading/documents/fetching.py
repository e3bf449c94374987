"""
Reading bytes named by a URI (file:// or http(s)://), for manifests at admission and for
documents in workers, and verifying a document against its manifest line.

    file://   only under the configured document roots: the path is refused when it has a
              '..' segment or when, symlinks resolved, it lies outside every root (a
              missing root list refuses every file:// URI). Existence is checked only
              after confinement, so a refused path reveals nothing about the file system.
    http(s):// aiohttp with timeouts, through the same egress policy as webhook delivery
              (`lading.delivery.egress`): loopback, private, link-local, cloud metadata and
              every other non-global address is refused unless `DocumentSettings.egress_allow`
              ($LADING_EGRESS_ALLOW) allows it; literal addresses are vetted before the
              request, host names by the resolver aiohttp connects through (no DNS cache, so
              no rebinding window). Redirects are followed by hand, at most `max_redirects`,
              to http(s) only, each hop vetted again. Reads stop one byte past what the
              caller accepts.

Failures are classified for the executor: a missing document (404, no such file) or a
document that is not what the manifest says (size, SHA-256, not UTF-8) is terminal,
retrying cannot change it; a connection error, timeout, 408, 429 or 5xx is transient.
Messages name the URI without its query string and user info (presigned URLs carry
credentials there).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import pathlib
import stat
import urllib.parse
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import ClassVar

import aiohttp

from lading import errors
from lading.delivery import egress
from lading.settings import DocumentSettings

CHUNK_BYTES = 256 * 1024
"""Read size for files and HTTP bodies: large enough for throughput, small enough to stay bounded."""

REDIRECTS = frozenset({301, 302, 303, 307, 308})


class FetchError(errors.LadingError):
    """A URI could not be read, or did not hold what its manifest line says."""

    error_class: ClassVar[str] = "DOCUMENT_UNAVAILABLE"
    """The stable error class an attempt records (extraction_jobs.last_error_class)."""
    terminal: ClassVar[bool] = False


class DocumentUnavailable(FetchError, errors.TemporaryError):
    """Connection refused or reset, timeout, 408, 429, 5xx, an unreadable file: retry later."""

    error_class = "DOCUMENT_UNAVAILABLE"


class DocumentNotFound(FetchError, errors.PermanentError):
    """404/410, or no such file under the document roots."""

    error_class = "DOCUMENT_NOT_FOUND"
    terminal = True


class DocumentRefused(FetchError, errors.PermanentError):
    """Outside the document roots, refused by the egress policy, a redirect to another scheme,
    or an HTTP status that retrying cannot change (401, 403, 400...)."""

    error_class = "DOCUMENT_REFUSED"
    terminal = True


class DigestMismatch(FetchError, errors.PermanentError):
    """The bytes read are not the ones the manifest describes (size or SHA-256)."""

    error_class = "DOCUMENT_DIGEST_MISMATCH"
    terminal = True


class DocumentNotText(FetchError, errors.PermanentError):
    """The bytes match the manifest but are not UTF-8 text."""

    error_class = "DOCUMENT_NOT_UTF8"
    terminal = True


def redact(uri: str) -> str:
    """The URI as messages show it: no user info, no query, no fragment; bounded length."""
    parts = urllib.parse.urlsplit(uri)
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    shown = urllib.parse.urlunsplit((parts.scheme, host, parts.path, "", ""))
    if parts.query:
        shown += "?…"
    return shown if len(shown) <= 200 else shown[:199] + "…"


ROOTS_ENV = "LADING_DOCUMENT_ROOTS"
"""Directories file:// manifests and documents may be read from, ':'-separated."""


def roots_from_env(value: str | None) -> tuple[str, ...]:
    """$LADING_DOCUMENT_ROOTS: directories separated by ':' (empty entries ignored)."""
    return tuple(part for part in (value or "").split(os.pathsep) if part)


def settings_from_env(environ: Mapping[str, str], *, roots: Sequence[str] = ()) -> DocumentSettings:
    """DocumentSettings for a process: `roots` (flags) or $LADING_DOCUMENT_ROOTS, and the egress
    allow-list of $LADING_EGRESS_ALLOW. ValueError names a malformed CIDR."""
    allow = egress.parse_cidrs([environ.get(egress.ENV_VAR, "")])
    return DocumentSettings(
        roots=tuple(roots) or roots_from_env(environ.get(ROOTS_ENV)),
        egress_allow=tuple(str(network) for network in allow),
    )


def confined_path(uri: str, *, roots: Sequence[str]) -> pathlib.Path:
    """The local path of a file:// URI, symlinks resolved, if it lies under one of `roots`."""
    parts = urllib.parse.urlsplit(uri)
    if parts.scheme != "file" or parts.netloc not in ("", "localhost"):
        raise DocumentRefused(f"{redact(uri)}: not a local file:// URI")
    raw = urllib.parse.unquote(parts.path)
    if not raw.startswith("/") or "\x00" in raw:
        raise DocumentRefused(f"{redact(uri)}: a file:// URI needs an absolute path")
    if ".." in raw.split("/"):
        raise DocumentRefused(f"{redact(uri)}: '..' path segments are not allowed")
    if not roots:
        raise DocumentRefused(
            f"{redact(uri)}: no document roots are configured (--document-root, LADING_DOCUMENT_ROOTS); "
            "file:// URIs are refused"
        )
    resolved = pathlib.Path(os.path.realpath(raw))
    for root in roots:
        base = pathlib.Path(os.path.realpath(root))
        if resolved == base or resolved.is_relative_to(base):
            return resolved
    raise DocumentRefused(f"{redact(uri)}: outside the document roots ({', '.join(roots)})")


def _open_regular(path: pathlib.Path, uri: str) -> int:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise DocumentNotFound(f"{redact(uri)}: no such file") from None
    except IsADirectoryError:
        raise DocumentRefused(f"{redact(uri)}: not a regular file") from None
    except OSError as exc:  # permissions, a stale NFS handle, a symlink swapped in since the check
        raise DocumentUnavailable(f"{redact(uri)}: cannot open: {exc.strerror}") from None
    if not _is_regular(fd):
        os.close(fd)
        raise DocumentRefused(f"{redact(uri)}: not a regular file")
    return fd


def _is_regular(fd: int) -> bool:
    return stat.S_ISREG(os.fstat(fd).st_mode)


def _read(fd: int, uri: str) -> bytes:
    try:
        return os.read(fd, CHUNK_BYTES)
    except OSError as exc:
        raise DocumentUnavailable(f"{redact(uri)}: read failed: {exc.strerror}") from None


async def _file_chunks(uri: str, *, roots: Sequence[str]) -> AsyncIterator[bytes]:
    path = confined_path(uri, roots=roots)
    fd = await asyncio.to_thread(_open_regular, path, uri)
    try:
        while chunk := await asyncio.to_thread(_read, fd, uri):
            yield chunk
    finally:
        os.close(fd)


async def _http_chunks(
        uri: str,
        *,
        session: aiohttp.ClientSession,
        settings: DocumentSettings,
) -> AsyncIterator[bytes]:
    url = uri
    timeout = aiohttp.ClientTimeout(
        total=None, connect=settings.fetch_timeout_s, sock_read=settings.fetch_timeout_s
    )
    allowed = egress.parse_cidrs(settings.egress_allow)
    for _hop in range(settings.max_redirects + 1):
        try:
            egress.vet_url(url, allowed=allowed)
        except egress.EgressRefused as exc:
            raise DocumentRefused(f"{redact(url)}: {exc}") from None
        try:
            token = egress.allowing(allowed)  # what the resolver vets host names against
            try:
                request = await session.get(url, allow_redirects=False, timeout=timeout)
            finally:
                egress.reset(token)
            async with request as response:
                if response.status in REDIRECTS:
                    location = response.headers.get("Location")
                    if not location:
                        raise DocumentRefused(f"{redact(url)}: HTTP {response.status} without a Location")
                    target = urllib.parse.urljoin(url, location)
                    if urllib.parse.urlsplit(target).scheme not in ("http", "https"):
                        raise DocumentRefused(f"{redact(url)}: redirect to a non-http(s) URI refused")
                    url = target
                    continue
                _check_status(response.status, url)
                while chunk := await response.content.read(CHUNK_BYTES):
                    yield chunk
                return
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            refused = egress.find_refusal(exc)
            if refused is not None:
                raise DocumentRefused(f"{redact(url)}: {refused}") from None
            raise DocumentUnavailable(f"{redact(url)}: {type(exc).__name__}: {_short(exc)}") from None
    raise DocumentRefused(f"{redact(uri)}: more than {settings.max_redirects} redirects")


def _check_status(status: int, url: str) -> None:
    if status == 200:
        return
    if status in (404, 410):
        raise DocumentNotFound(f"{redact(url)}: HTTP {status}")
    if status in (408, 425, 429) or status >= 500:
        raise DocumentUnavailable(f"{redact(url)}: HTTP {status}")
    raise DocumentRefused(f"{redact(url)}: HTTP {status}")


def _short(exc: BaseException) -> str:
    text = str(exc) or "no detail"
    return text if len(text) <= 200 else text[:199] + "…"


@contextlib.asynccontextmanager
async def chunks(
        uri: str,
        *,
        session: aiohttp.ClientSession | None,
        settings: DocumentSettings,
) -> AsyncIterator[AsyncIterator[bytes]]:
    """The bytes at `uri` as an iterator of chunks; the caller bounds how much it reads.

    `session` is required for http(s) URIs. Use as a context manager so that an early stop
    closes the file or the HTTP connection."""
    scheme = urllib.parse.urlsplit(uri).scheme
    source: AsyncIterator[bytes]
    if scheme == "file":
        source = _file_chunks(uri, roots=settings.roots)
    elif scheme in ("http", "https"):
        if session is None:
            raise ValueError("an http(s) URI needs an aiohttp session")
        source = _http_chunks(uri, session=session, settings=settings)
    else:
        raise DocumentRefused(f"{redact(uri)}: only file://, http:// and https:// URIs are supported")
    try:
        yield source
    finally:
        closer = getattr(source, "aclose", None)
        if closer is not None:
            await closer()


def new_session() -> aiohttp.ClientSession:
    """A session for fetching: egress-vetting resolver without DNS cache, no cookies kept, no proxy
    from the environment, no automatic retries."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(resolver=egress.VettingResolver(), use_dns_cache=False),
        cookie_jar=aiohttp.DummyCookieJar(),
        trust_env=False,
        auto_decompress=True,
        headers={"User-Agent": "lading-document-fetcher"},
    )


class Fetcher:
    """Fetches documents for a worker: one HTTP session, reused; close it when done."""

    def __init__(self, *, settings: DocumentSettings) -> None:
        self.settings = settings
        self._session: aiohttp.ClientSession | None = None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def text(self, *, uri: str, sha256: str, size: int) -> str:
        """The document's text, read in at most `size + 1` bytes and verified against the manifest."""
        session = None
        if urllib.parse.urlsplit(uri).scheme in ("http", "https"):
            if self._session is None:
                self._session = new_session()
            session = self._session
        async with asyncio.timeout(self.settings.fetch_timeout_s):
            try:
                data = await self._read(uri, session=session, limit=size)
            except TimeoutError:
                raise DocumentUnavailable(
                    f"{redact(uri)}: not read within {self.settings.fetch_timeout_s:g} s"
                ) from None
        return verify(data, uri=uri, sha256=sha256, size=size)

    async def _read(self, uri: str, *, session: aiohttp.ClientSession | None, limit: int) -> bytes:
        buffer = bytearray()
        async with chunks(uri, session=session, settings=self.settings) as source:
            async for chunk in source:
                buffer += chunk
                if len(buffer) > limit:
                    raise DigestMismatch(
                        f"{redact(uri)}: longer than the {limit} bytes the manifest says; not the listed document"
                    )
        return bytes(buffer)


def verify(data: bytes, *, uri: str, sha256: str, size: int) -> str:
    """`data` as text if it is exactly what the manifest line describes."""
    if len(data) != size:
        raise DigestMismatch(
            f"{redact(uri)}: {len(data)} bytes, the manifest says {size}; not the listed document"
        )
    actual = hashlib.sha256(data).hexdigest()
    if actual != sha256:
        raise DigestMismatch(
            f"{redact(uri)}: sha256 is {actual[:16]}…, the manifest says {sha256[:16]}…; not the listed document"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DocumentNotText(f"{redact(uri)}: not UTF-8 text (byte {exc.start})") from None
