"""Fetching file:// documents: confined to the document roots, read bounded, verified exactly."""

from __future__ import annotations

import hashlib
import os
import pathlib

import pytest

from lading.documents import fetching
from lading.settings import DocumentSettings

TEXT = "Rechnung Nr. 4711 \u2013 Summe 12,00 \u20ac\n"
DATA = TEXT.encode()
SHA = hashlib.sha256(DATA).hexdigest()


@pytest.fixture
def root(tmp_path: pathlib.Path) -> pathlib.Path:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_bytes(DATA)
    (tmp_path / "secret.txt").write_bytes(b"outside")
    return docs


def fetcher(*roots: pathlib.Path) -> fetching.Fetcher:
    return fetching.Fetcher(settings=DocumentSettings(roots=tuple(str(r) for r in roots)))


async def test_a_document_under_a_root_is_read_and_verified(root: pathlib.Path) -> None:
    text = await fetcher(root).text(uri=(root / "a.txt").as_uri(), sha256=SHA, size=len(DATA))
    assert text == TEXT


@pytest.mark.parametrize(
    ("uri", "message"),
    [
        ("file://{root}/../secret.txt", "'..' path segments are not allowed"),
        ("file://{root}/%2E%2E/secret.txt", "'..' path segments are not allowed"),
        ("file://{parent}/secret.txt", "outside the document roots"),
        ("file:///etc/passwd", "outside the document roots"),
        ("file://otherhost{root}/a.txt", "not a local file:// URI"),
    ],
)
async def test_paths_outside_the_roots_are_refused(root: pathlib.Path, uri: str, message: str) -> None:
    formatted = uri.format(root=root, parent=root.parent)
    with pytest.raises(fetching.DocumentRefused, match=message) as caught:
        await fetcher(root).text(uri=formatted, sha256=SHA, size=len(DATA))
    assert caught.value.terminal and caught.value.error_class == "DOCUMENT_REFUSED"


async def test_a_symlink_out_of_the_roots_is_refused(root: pathlib.Path) -> None:
    os.symlink(root.parent / "secret.txt", root / "link.txt")
    with pytest.raises(fetching.DocumentRefused, match="outside the document roots"):
        await fetcher(root).text(uri=(root / "link.txt").as_uri(), sha256=SHA, size=7)


async def test_a_symlink_within_the_roots_is_followed(root: pathlib.Path) -> None:
    os.symlink(root / "a.txt", root / "alias.txt")
    assert await fetcher(root).text(uri=(root / "alias.txt").as_uri(), sha256=SHA, size=len(DATA)) == TEXT


async def test_without_roots_every_file_uri_is_refused(root: pathlib.Path) -> None:
    with pytest.raises(fetching.DocumentRefused, match="no document roots are configured"):
        await fetcher().text(uri=(root / "a.txt").as_uri(), sha256=SHA, size=len(DATA))


async def test_a_missing_file_is_not_found_and_terminal(root: pathlib.Path) -> None:
    with pytest.raises(fetching.DocumentNotFound, match="no such file") as caught:
        await fetcher(root).text(uri=(root / "gone.txt").as_uri(), sha256=SHA, size=len(DATA))
    assert caught.value.terminal and caught.value.error_class == "DOCUMENT_NOT_FOUND"


async def test_a_directory_is_refused(root: pathlib.Path) -> None:
    (root / "dir").mkdir()
    with pytest.raises(fetching.DocumentRefused, match="not a regular file"):
        await fetcher(root).text(uri=(root / "dir").as_uri(), sha256=SHA, size=len(DATA))


async def test_a_tampered_document_is_a_digest_mismatch(root: pathlib.Path) -> None:
    (root / "a.txt").write_bytes(DATA.replace(b"12", b"99"))  # same size, other bytes
    with pytest.raises(fetching.DigestMismatch, match=r"sha256 is .*, the manifest says") as caught:
        await fetcher(root).text(uri=(root / "a.txt").as_uri(), sha256=SHA, size=len(DATA))
    assert caught.value.terminal and caught.value.error_class == "DOCUMENT_DIGEST_MISMATCH"


async def test_a_longer_document_is_refused_after_one_byte_too_many(root: pathlib.Path) -> None:
    (root / "big.txt").write_bytes(b"x" * 1_000_000)
    with pytest.raises(fetching.DigestMismatch, match="longer than the 10 bytes the manifest says"):
        await fetcher(root).text(uri=(root / "big.txt").as_uri(), sha256=SHA, size=10)


async def test_a_shorter_document_is_a_mismatch(root: pathlib.Path) -> None:
    with pytest.raises(fetching.DigestMismatch, match=f"{len(DATA)} bytes, the manifest says {len(DATA) + 1}"):
        await fetcher(root).text(uri=(root / "a.txt").as_uri(), sha256=SHA, size=len(DATA) + 1)


async def test_bytes_that_match_but_are_not_utf8_are_terminal(root: pathlib.Path) -> None:
    latin = "Größe".encode("latin-1")
    (root / "latin.txt").write_bytes(latin)
    with pytest.raises(fetching.DocumentNotText, match="not UTF-8") as caught:
        await fetcher(root).text(
            uri=(root / "latin.txt").as_uri(), sha256=hashlib.sha256(latin).hexdigest(), size=len(latin)
        )
    assert caught.value.error_class == "DOCUMENT_NOT_UTF8"


def test_messages_show_uris_without_credentials_or_query() -> None:
    shown = fetching.redact("https://user:pw@files.example:8443/a/b.txt?X-Amz-Signature=abc#frag")
    assert shown == "https://files.example:8443/a/b.txt?…"


def test_roots_from_the_environment() -> None:
    assert fetching.roots_from_env("/data:/mnt/docs::") == ("/data", "/mnt/docs")
    assert fetching.roots_from_env(None) == ()


def test_settings_from_the_environment_take_flags_first() -> None:
    env = {"LADING_DOCUMENT_ROOTS": "/data:/mnt/docs", "LADING_EGRESS_ALLOW": "10.20.0.0/16, 127.0.0.1"}
    settings = fetching.settings_from_env(env)
    assert settings.roots == ("/data", "/mnt/docs")
    assert settings.egress_allow == ("10.20.0.0/16", "127.0.0.1/32")
    assert fetching.settings_from_env(env, roots=["/srv"]).roots == ("/srv",)
    with pytest.raises(ValueError, match="not a CIDR"):
        fetching.settings_from_env({"LADING_EGRESS_ALLOW": "intranet"})
