"""
Document manifests of large batches: JSON lines, one document per line.

    {"key": "inv-000001", "uri": "file:///data/march/inv-000001.txt", "sha256": "9f86d0…", "bytes": 5123}

An ExtractionBatch too large to list its documents inline names a manifest
(`spec.manifestUri`). Admission reads it once, as a stream, before any transaction:

    read (file:// beneath <root>/<namespace>/, or http(s)://)   lading.documents.fetching
      -> split into lines (each at most MAX_LINE_BYTES; at most MAX_LINES lines and
         MAX_MANIFEST_BYTES in all)
      -> validate each line (ManifestLine; a plainly valid line, the usual case, by `fields_of`
         without pydantic, to the same verdict)
      -> spool the valid lines to a local temporary file (CSV)            `spool`

and acceptance then bulk-loads the spool with COPY inside its one transaction
(`lading.accepting`), where the rules that need the whole manifest are checked (every key
unique). Memory stays bounded whatever the manifest's size: one line at a time here, the
database holds the rest. An HTTP read never runs inside a database transaction.

Errors name the line and the field and never repeat the line's content (a manifest may hold
presigned URLs); the manifest's own URI appears only as `lading.urls.redacted` shows it:

    manifest line 17: sha256: must be 64 lowercase hex characters
    manifest line 18: uri: contains U+0000 (NUL), which PostgreSQL text cannot store

A manifest with any invalid line admits nothing (`ManifestInvalid`, condition reason
`InvalidManifest`); a manifest that cannot be read right now (connection refused, 5xx,
timeout) is `ManifestUnavailable`, a temporary error: admission is retried unchanged.

This module does not fetch documents (workers do, `lading.documents.fetching.Fetcher`) and
does not touch the database.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import pathlib
import re
import tempfile
import urllib.parse
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from typing import Any, ClassVar

import aiohttp
import orjson
import pydantic

from lading import errors, reasons, urls
from lading.documents import fetching
from lading.models import specs
from lading.settings import DocumentSettings

MAX_LINES = 1_000_000
"""Documents per manifest. A million jobs is a day of a large pool; beyond that, split the batch
so that one bad line does not hold up everything and one admission transaction stays minutes long."""
MAX_LINE_BYTES = 8192
"""One line: a 256-character key, a 2048-character URI, the digest and the size fit several times."""
MAX_MANIFEST_BYTES = 1024 * 1024 * 1024
"""A whole manifest (1 GiB): a million lines of up to ~1 KiB; the spool on local disk is smaller."""
DOCUMENT_MAX_BYTES = 16 * 1024 * 1024
"""One document's text, in bytes (16 MiB): far beyond any model's context, so only a wrong size
field hits it; workers never read more than a document's stated size plus one byte."""

CHUNK_WRITE_BYTES = 256 * 1024
"""Write buffer of the spool file."""

SHA256_PATTERN = re.compile(r"^[0-9a-f]{64}$")
KEY_PATTERN = re.compile(specs.DOCUMENT_KEY_PATTERN)
MANIFEST_URI_PATTERN = re.compile(specs.MANIFEST_URI_PATTERN)
KEY_MAX = 256
URI_MAX = 2048
FIELDS = ("key", "uri", "sha256", "bytes")


class ManifestInvalid(errors.PermanentError):
    """The manifest has an invalid line (or is empty, or too large): nothing was admitted."""

    reason = reasons.INVALID_MANIFEST

    def __init__(self, message: str, *, line: int | None = None, field: str | None = None) -> None:
        super().__init__(message)
        self.line = line
        self.field = field


class ManifestUnavailable(errors.TemporaryError):
    """The manifest cannot be read now (unreachable, 5xx, timeout, missing): retry admission later."""

    reason = reasons.MANIFEST_UNAVAILABLE


class ManifestLine(pydantic.BaseModel):
    """One line of a manifest: a document of the batch, by reference."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True, strict=True)

    key: str
    """Key of the document, unique in the manifest; the same rules as an inline document's key."""
    uri: str
    """Where workers read the text: file:// (beneath `<root>/<namespace>/` of the workers' document
    roots, namespace the batch's) or http(s)://."""
    sha256: str
    """SHA-256 of the document's bytes (UTF-8 text), 64 lowercase hex characters."""
    bytes: int
    """Size of the document in bytes; a worker reads at most this much and checks it exactly."""

    @pydantic.field_validator("key", "uri", "sha256", mode="before")
    @classmethod
    def _storable(cls, value: object) -> object:
        # Before the patterns, so a NUL (which PostgreSQL text cannot store, and which the COPY of
        # the spool would fail on) is named as such rather than as "must be a URI".
        return specs._refuse_unstorable(value)

    @pydantic.field_validator("key")
    @classmethod
    def _key(cls, value: str) -> str:
        if not value:
            raise ValueError("must not be empty")
        if len(value) > KEY_MAX:
            raise ValueError(f"must be at most {KEY_MAX} characters")
        if not KEY_PATTERN.fullmatch(value):  # fullmatch: "$" alone lets a final newline through
            raise ValueError(f"must be {specs.PATTERN_HINTS[specs.DOCUMENT_KEY_PATTERN]}")
        # One rule for inline and manifest keys.
        return specs._check_document_key(value)

    @pydantic.field_validator("uri")
    @classmethod
    def _uri(cls, value: str) -> str:
        if len(value) > URI_MAX:
            raise ValueError(f"must be at most {URI_MAX} characters")
        if not MANIFEST_URI_PATTERN.fullmatch(value):
            raise ValueError(f"must be {specs.PATTERN_HINTS[specs.MANIFEST_URI_PATTERN]}")
        # The same URI rules as spec.manifestUri.
        return specs._check_manifest_uri(value)

    @pydantic.field_validator("sha256")
    @classmethod
    def _sha256(cls, value: str) -> str:
        if not SHA256_PATTERN.fullmatch(value):
            raise ValueError("must be 64 lowercase hex characters")
        return value

    @pydantic.field_validator("bytes")
    @classmethod
    def _bytes(cls, value: int) -> int:
        if value <= 0:
            raise ValueError("must be greater than 0 (empty documents cannot be extracted)")
        if value > DOCUMENT_MAX_BYTES:
            raise ValueError(f"must be at most {DOCUMENT_MAX_BYTES} ({DOCUMENT_MAX_BYTES // (1024 * 1024)} MiB)")
        return value


def parse_line(number: int, raw: bytes) -> ManifestLine:
    """Validate line `number` (1-based); ManifestInvalid names the line and the first bad field."""
    try:
        return ManifestLine.model_validate_json(raw)
    except pydantic.ValidationError as exc:
        first = exc.errors(include_input=False, include_url=False)[0]
        field, message = _describe(first)
        prefix = f"manifest line {number}: " + (f"{field}: " if field else "")
        raise ManifestInvalid(prefix + message, line=number, field=field) from None


def _describe(error: Mapping[str, Any]) -> tuple[str | None, str]:
    kind = error["type"]
    loc = error.get("loc") or ()
    field = str(loc[0]) if loc else None
    if kind == "json_invalid":
        return None, "not valid JSON"
    if kind == "model_type":
        return None, "must be a JSON object with " + ", ".join(FIELDS)
    if kind == "missing":
        return field, "is required"
    if kind == "extra_forbidden":
        return field, "unknown field (a line has exactly " + ", ".join(FIELDS) + ")"
    if kind == "string_type":
        return field, "must be a string"
    if kind in ("int_type", "int_from_float", "int_parsing"):
        return field, "must be an integer"
    if kind == "value_error":
        return field, str(error.get("ctx", {}).get("error", error["msg"]))
    return field, str(error["msg"])


Fields = tuple[str, str, str, int]
"""A valid line's key, uri, sha256 and bytes."""


def fields_of(number: int, raw: bytes) -> Fields:
    """The fields of line `number`, validated exactly as `parse_line` validates them (same values
    accepted, same errors): a plainly valid line, the usual case, is checked here without pydantic;
    anything else goes to `parse_line`, which decides and names the error."""
    plain = _plain_fields(raw)
    if plain is not None:
        return plain
    line = parse_line(number, raw)
    return line.key, line.uri, line.sha256, line.bytes


_PLAIN_KEY = re.compile(r"(?!\.\.?(?:/|\Z))[A-Za-z0-9._-]+(?:/(?!\.\.?(?:/|\Z))[A-Za-z0-9._-]+)*").fullmatch
"""KEY_PATTERN and specs._check_document_key in one pattern: segments of its characters joined by
"/", none empty, "." or ".."."""
_PLAIN_FILE_URI = re.compile(r"file:///[!-~]*").fullmatch
"""A file:// URI with an absolute path in printable ASCII: no space, control character or NUL, so
MANIFEST_URI_PATTERN, _check_manifest_uri and the storable check all hold without being run."""
_PLAIN_HTTP_URI = re.compile(r"https?://[!-~]+").fullmatch
_PLAIN_SHA256 = SHA256_PATTERN.fullmatch


def _plain_fields(raw: bytes) -> Fields | None:
    """The fields of a line that is valid for reasons checkable at a glance: a JSON object of exactly
    the four fields, of exact types, printable ASCII, within limits. None for anything else (not
    necessarily invalid: a non-ASCII URI, a file://localhost/ one, an invalid line). Accepts only
    what ManifestLine accepts, with the same values (orjson and pydantic both keep the last of a
    repeated name), so the slower path decides every line that is not plain."""
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if type(value) is not dict or len(value) != len(FIELDS):
        return None
    key, uri, sha256, size = value.get("key"), value.get("uri"), value.get("sha256"), value.get("bytes")
    if type(key) is not str or type(uri) is not str or type(sha256) is not str or type(size) is not int:
        return None
    if not (0 < size <= DOCUMENT_MAX_BYTES and len(key) <= KEY_MAX and len(uri) <= URI_MAX):
        return None
    if _PLAIN_SHA256(sha256) is None or _PLAIN_KEY(key) is None:
        return None
    if _PLAIN_FILE_URI(uri) is None:
        if _PLAIN_HTTP_URI(uri) is None:
            return None
        try:
            specs._check_manifest_uri(uri)  # host, port, no credentials
        except ValueError:
            return None
    return key, uri, sha256, size


async def lines(
        uri: str,
        *,
        settings: DocumentSettings,
        namespace: str,
        session: aiohttp.ClientSession | None = None,
) -> AsyncGenerator[tuple[int, ManifestLine], None]:
    """Stream the manifest's documents as (line number, line); blank lines are skipped but counted.
    `namespace` is the batch's (trusted context): a file:// manifest is read only beneath its
    directories (`lading.documents.fetching.confine`)."""
    async with contextlib.aclosing(
        line_chunks(uri, settings=settings, namespace=namespace, session=session)
    ) as chunks:
        async for chunk in chunks:
            for number, key, document_uri, sha256, size in chunk:
                yield number, ManifestLine.model_construct(key=key, uri=document_uri, sha256=sha256, bytes=size)


async def line_chunks(
        uri: str,
        *,
        settings: DocumentSettings,
        namespace: str,
        session: aiohttp.ClientSession | None = None,
) -> AsyncGenerator[list[tuple[int, str, str, str, int]], None]:
    """`lines` as (line number, key, uri, sha256, bytes) tuples, a list per chunk read: one step
    of the generator per chunk, not per line, which is most of the cost of a plain line."""
    number = 0
    total = 0
    pending = b""
    try:
        async with fetching.chunks(uri, session=session, settings=settings, namespace=namespace) as source:
            async for chunk in source:
                total += len(chunk)
                if total > MAX_MANIFEST_BYTES:
                    raise ManifestInvalid(f"manifest is larger than {MAX_MANIFEST_BYTES} bytes; split the batch")
                complete = (pending + chunk).split(b"\n")
                pending = complete.pop()
                parsed: list[tuple[int, str, str, str, int]] = []
                for raw in complete:
                    number += 1
                    if (fields := _line(number, raw)) is not None:
                        parsed.append((number, *fields))
                if len(pending) > MAX_LINE_BYTES:
                    raise ManifestInvalid(
                        f"manifest line {number + 1}: longer than {MAX_LINE_BYTES} bytes", line=number + 1
                    )
                if parsed:
                    yield parsed
    except (fetching.DocumentUnavailable, fetching.DocumentNotFound) as exc:
        raise ManifestUnavailable(f"manifest {exc}") from None
    except fetching.FetchError as exc:
        raise ManifestInvalid(f"manifest {exc}") from None
    if pending:
        number += 1
        if (fields := _line(number, pending)) is not None:
            yield [(number, *fields)]


def _line(number: int, raw: bytes) -> Fields | None:
    if number > MAX_LINES:
        raise ManifestInvalid(f"manifest has more than {MAX_LINES} lines; split the batch", line=number)
    if len(raw) > MAX_LINE_BYTES:
        raise ManifestInvalid(f"manifest line {number}: longer than {MAX_LINE_BYTES} bytes", line=number)
    if not raw.strip():
        return None
    return fields_of(number, raw)


@dataclasses.dataclass(frozen=True)
class Spooled:
    """A validated manifest on local disk, ready for COPY: CSV rows (line, key, uri, sha256, bytes)."""

    uri: str
    path: pathlib.Path
    documents: int
    total_bytes: int
    """Sum of the documents' sizes, for byte quotas."""

    COLUMNS: ClassVar[tuple[str, ...]] = ("line", "key", "uri", "sha256", "bytes")


@contextlib.asynccontextmanager
async def spool(
        uri: str,
        *,
        settings: DocumentSettings,
        namespace: str,
        directory: str | None = None,
) -> AsyncIterator[Spooled]:
    """Read and validate the whole manifest of a batch of `namespace` into a temporary file,
    deleted on exit.

    Raises ManifestInvalid (nothing to admit) or ManifestUnavailable (retry later)."""
    session = fetching.new_session() if urllib.parse.urlsplit(uri).scheme in ("http", "https") else None
    handle, name = tempfile.mkstemp(prefix="lading-manifest-", suffix=".csv", dir=directory)
    path = pathlib.Path(name)
    try:
        documents = 0
        total_bytes = 0
        with os.fdopen(handle, "w", encoding="utf-8", newline="", buffering=CHUNK_WRITE_BYTES) as out:
            try:
                async with (
                    _timeout(settings.manifest_timeout_s, uri),
                    contextlib.aclosing(
                        line_chunks(uri, settings=settings, namespace=namespace, session=session)
                    ) as stream,
                ):
                    async for rows in stream:
                        out.write(_csv(rows))
                        documents += len(rows)
                        total_bytes += sum(row[4] for row in rows)
            finally:
                if session is not None:
                    await session.close()
        if documents == 0:
            raise ManifestInvalid(f"manifest {urls.redacted(uri)} lists no documents")
        yield Spooled(uri=uri, path=path, documents=documents, total_bytes=total_bytes)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name)


def _csv(rows: list[tuple[int, str, str, str, int]]) -> str:
    """`rows` as CSV lines, as csv.writer writes them (at a quarter of its cost): only a URI can
    need quotes (a key is letters, digits and ._-/, a digest hex), and never for a line break, which
    no URI holds."""
    quote = '"'
    return "".join([
        f'{number},{key},{uri if quote not in uri and "," not in uri else _quoted(uri)},{sha256},{size}\n'
        for number, key, uri, sha256, size in rows
    ])  # fmt: skip


def _quoted(field: str) -> str:
    return '"' + field.replace('"', '""') + '"'


@contextlib.asynccontextmanager
async def _timeout(seconds: float, uri: str) -> AsyncIterator[None]:
    try:
        async with asyncio.timeout(seconds):
            yield
    except TimeoutError:
        raise ManifestUnavailable(f"manifest {urls.redacted(uri)}: not read within {seconds:g} s") from None
