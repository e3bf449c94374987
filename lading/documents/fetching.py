"""
Reading bytes named by a URI (file:// or http(s)://), for manifests at admission and for
documents in workers, and verifying a document against its manifest line.

    file://   only beneath the batch's own namespace directory, `<root>/<namespace>/` for each
              configured document root (`DocumentSettings.roots`), plus the directories
              `lading run` gives a namespace (`DocumentSettings.namespace_directories`). The
              namespace is trusted context, from the batch row or the custom resource, never from
              a manifest. The check is textual first (no '..' segment; the path must start with a
              namespace directory), so a path outside reveals nothing about the file system.
              Then the path is opened one component at a time from the namespace directory, each
              with O_NOFOLLOW (O_DIRECTORY for directories), relative to the one before: no
              symbolic link is followed anywhere below the root (RESOLVE_BENEATH |
              RESOLVE_NO_SYMLINKS semantics without openat2, which Python does not expose).
              Only a regular file is opened, and with O_NONBLOCK: a FIFO, socket, device or
              directory is refused at once and can never block a thread.
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
Messages name the URI through `lading.urls.redacted` (no user info, query or fragment: presigned
URLs carry credentials there) and an exception only by type (`lading.urls.describe`); a
mismatch never says what the file's size or digest is, only that it is not the listed one.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import hashlib
import os
import re
import stat
import urllib.parse
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import ClassVar

import aiohttp

from lading import errors, urls
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


NAMESPACE_PATTERN = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
"""A Kubernetes namespace name (an RFC 1123 label): the only directory names a tenant gets."""

O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
O_NOCTTY = getattr(os, "O_NOCTTY", 0)
O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)


ROOTS_ENV = "LADING_DOCUMENT_ROOTS"
"""Document roots, ':'-separated; a batch of namespace N reads file:// URIs beneath `<root>/N/` only."""


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


def namespace_directories(settings: DocumentSettings, *, namespace: str) -> tuple[str, ...]:
    """The directories a batch of `namespace` may read file:// URIs beneath."""
    own = tuple(os.path.join(os.path.normpath(root), namespace) for root in settings.roots)
    extra = tuple(os.path.normpath(d) for ns, d in settings.namespace_directories if ns == namespace)
    return tuple(dict.fromkeys(own + extra))


@dataclasses.dataclass(frozen=True)
class Confined:
    """A file:// URI resolved textually: `parts` are opened one by one beneath `base`."""

    base: str
    """A document root or a `lading run` directory: configuration, opened as it is."""
    parts: tuple[str, ...]
    """Path components below `base` (the namespace's directory first, under a root); none of
    them may be a symbolic link."""


def confine(uri: str, *, settings: DocumentSettings, namespace: str) -> Confined:
    """Where a file:// URI of a batch of `namespace` may be opened, decided on the text alone;
    DocumentRefused when it lies outside the namespace's directories."""
    shown = urls.redacted(uri)
    parts = urllib.parse.urlsplit(uri)
    if parts.scheme != "file" or parts.netloc not in ("", "localhost"):
        raise DocumentRefused(f"{shown}: not a local file:// URI")
    if parts.query or parts.fragment:
        raise DocumentRefused(f"{shown}: a file:// URI has no query or fragment")
    raw = urllib.parse.unquote(parts.path)
    if not raw.startswith("/") or "\x00" in raw:
        raise DocumentRefused(f"{shown}: a file:// URI needs an absolute path")
    segments = raw.split("/")
    if ".." in segments:
        raise DocumentRefused(f"{shown}: '..' path segments are not allowed")
    if not NAMESPACE_PATTERN.match(namespace):
        raise DocumentRefused(f"{shown}: {namespace!r} is not a namespace name; file:// URIs are refused")
    if not settings.roots and not settings.namespace_directories:
        raise DocumentRefused(
            f"{shown}: no document roots are configured (--document-root, LADING_DOCUMENT_ROOTS); "
            "file:// URIs are refused"
        )
    path = "/".join(segment for segment in segments if segment not in ("", "."))
    for root in settings.roots:
        for base in dict.fromkeys((os.path.normpath(root), os.path.realpath(root))):
            below = _below(path, base=base)
            if below is not None and below[:1] == (namespace,):
                return Confined(base=base, parts=below)
    for ns, directory in settings.namespace_directories:
        if ns == namespace:
            for base in dict.fromkeys((os.path.normpath(directory), os.path.realpath(directory))):
                below = _below(path, base=base)
                if below is not None:
                    return Confined(base=base, parts=below)
    allowed = ", ".join(d + "/" for d in namespace_directories(settings, namespace=namespace))
    raise DocumentRefused(f"{shown}: outside the document directories of namespace {namespace} ({allowed})")


def _below(path: str, *, base: str) -> tuple[str, ...] | None:
    """The components of `path` (slash-joined, no leading slash) beneath `base`, or None."""
    prefix = base.strip("/")
    if not prefix:
        return tuple(path.split("/")) if path else ()
    if path == prefix:
        return ()
    if path.startswith(prefix + "/"):
        return tuple(path[len(prefix) + 1:].split("/"))
    return None


DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | O_CLOEXEC
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC


def open_confined(target: Confined, *, shown: str) -> int:
    """Open the regular file `target` names, walking from its base without following any link.

    Blocking (a system call per component): run it in a thread."""
    if not target.parts:
        raise DocumentRefused(f"{shown}: not a regular file")
    try:
        directory = os.open(target.base, os.O_RDONLY | os.O_DIRECTORY | O_CLOEXEC)
    except OSError as exc:  # the volume is not mounted (yet): the operator's problem, retried
        raise DocumentUnavailable(f"{shown}: the document root cannot be opened: {exc.strerror}") from None
    try:
        for part in target.parts[:-1]:
            inner = os.open(part, DIRECTORY_FLAGS, dir_fd=directory)
            os.close(directory)
            directory = inner
        name = target.parts[-1]
        mode = os.stat(name, dir_fd=directory, follow_symlinks=False).st_mode
        if stat.S_ISLNK(mode):
            raise DocumentRefused(f"{shown}: a symbolic link; links are not followed")
        if not stat.S_ISREG(mode):  # a FIFO, socket or device is never opened, so never blocks
            raise DocumentRefused(f"{shown}: not a regular file")
        fd = os.open(name, FILE_FLAGS, dir_fd=directory)
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # swapped since the stat: still never read
            os.close(fd)
            raise DocumentRefused(f"{shown}: not a regular file")
        return fd
    except FileNotFoundError:
        raise DocumentNotFound(f"{shown}: no such file") from None
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise DocumentRefused(
                f"{shown}: a path component is a symbolic link or not a directory; links are not followed"
            ) from None
        # permissions, a stale NFS handle: perhaps not for ever
        raise DocumentUnavailable(f"{shown}: cannot open: {exc.strerror}") from None
    finally:
        os.close(directory)


def _read(fd: int, uri: str) -> bytes:
    try:
        return os.read(fd, CHUNK_BYTES)
    except OSError as exc:
        raise DocumentUnavailable(f"{urls.redacted(uri)}: read failed: {exc.strerror}") from None


async def _file_chunks(uri: str, *, settings: DocumentSettings, namespace: str) -> AsyncIterator[bytes]:
    target = confine(uri, settings=settings, namespace=namespace)
    fd = await asyncio.to_thread(open_confined, target, shown=urls.redacted(uri))
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
            raise DocumentRefused(f"{urls.redacted(url)}: {exc}") from None
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
                        raise DocumentRefused(f"{urls.redacted(url)}: HTTP {response.status} without a Location")
                    target = urllib.parse.urljoin(url, location)
                    if urllib.parse.urlsplit(target).scheme not in ("http", "https"):
                        raise DocumentRefused(f"{urls.redacted(url)}: redirect to a non-http(s) URI refused")
                    url = target
                    continue
                _check_status(response.status, url)
                while chunk := await response.content.read(CHUNK_BYTES):
                    yield chunk
                return
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            refused = egress.find_refusal(exc)
            if refused is not None:
                raise DocumentRefused(f"{urls.redacted(url)}: {refused}") from None
            raise DocumentUnavailable(f"{urls.redacted(url)}: {urls.describe(exc)}") from None
    raise DocumentRefused(f"{urls.redacted(uri)}: more than {settings.max_redirects} redirects")


def _check_status(status: int, url: str) -> None:
    if status == 200:
        return
    if status in (404, 410):
        raise DocumentNotFound(f"{urls.redacted(url)}: HTTP {status}")
    if status in (408, 425, 429) or status >= 500:
        raise DocumentUnavailable(f"{urls.redacted(url)}: HTTP {status}")
    raise DocumentRefused(f"{urls.redacted(url)}: HTTP {status}")


@contextlib.asynccontextmanager
async def chunks(
        uri: str,
        *,
        session: aiohttp.ClientSession | None,
        settings: DocumentSettings,
        namespace: str,
) -> AsyncIterator[AsyncIterator[bytes]]:
    """The bytes at `uri` as an iterator of chunks; the caller bounds how much it reads.

    `namespace` is the batch's (trusted context): a file:// URI is read only beneath its
    directories. `session` is required for http(s) URIs. Use as a context manager so that an early stop
    closes the file or the HTTP connection."""
    scheme = urllib.parse.urlsplit(uri).scheme
    source: AsyncIterator[bytes]
    if scheme == "file":
        source = _file_chunks(uri, settings=settings, namespace=namespace)
    elif scheme in ("http", "https"):
        if session is None:
            raise ValueError("an http(s) URI needs an aiohttp session")
        source = _http_chunks(uri, session=session, settings=settings)
    else:
        raise DocumentRefused(f"{urls.redacted(uri)}: only file://, http:// and https:// URIs are supported")
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

    async def text(self, *, uri: str, sha256: str, size: int, namespace: str) -> str:
        """The document's text, read in at most `size + 1` bytes and verified against the manifest.
        `namespace` is the batch's, from its row: file:// URIs are read only beneath its directories."""
        session = None
        if urllib.parse.urlsplit(uri).scheme in ("http", "https"):
            if self._session is None:
                self._session = new_session()
            session = self._session
        async with asyncio.timeout(self.settings.fetch_timeout_s):
            try:
                data = await self._read(uri, session=session, limit=size, namespace=namespace)
            except TimeoutError:
                raise DocumentUnavailable(
                    f"{urls.redacted(uri)}: not read within {self.settings.fetch_timeout_s:g} s"
                ) from None
        return verify(data, uri=uri, sha256=sha256, size=size)

    async def _read(
            self, uri: str, *, session: aiohttp.ClientSession | None, limit: int, namespace: str
    ) -> bytes:
        buffer = bytearray()
        async with chunks(uri, session=session, settings=self.settings, namespace=namespace) as source:
            async for chunk in source:
                buffer += chunk
                if len(buffer) > limit:
                    raise DigestMismatch(_mismatch(uri))
        return bytes(buffer)


def _mismatch(uri: str) -> str:
    # One message for every mismatch: saying how long the file is, or what its digest is, would
    # tell a tenant about a file the manifest merely names.
    return f"{urls.redacted(uri)}: does not match the manifest's sha256 and bytes; not the listed document"


def verify(data: bytes, *, uri: str, sha256: str, size: int) -> str:
    """`data` as text if it is exactly what the manifest line describes. DigestMismatch says that
    it is not, never what it is instead (size or digest)."""
    if len(data) != size or hashlib.sha256(data).hexdigest() != sha256:
        raise DigestMismatch(_mismatch(uri))
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DocumentNotText(f"{urls.redacted(uri)}: not UTF-8 text (byte {exc.start})") from None
