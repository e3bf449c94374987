"""Fetching file:// documents: confined to the batch namespace's directory, read bounded, verified
exactly, with errors that reveal nothing about files the tenant does not own."""

from __future__ import annotations

import asyncio
import hashlib
import os
import pathlib
import socket

import pytest

from lading.documents import fetching
from lading.settings import DocumentSettings

TEXT = "Rechnung Nr. 4711 \u2013 Summe 12,00 \u20ac\n"
DATA = TEXT.encode()
SHA = hashlib.sha256(DATA).hexdigest()
OTHER = b"globex's invoice, not for acme"
OTHER_SHA = hashlib.sha256(OTHER).hexdigest()


@pytest.fixture
def root(tmp_path: pathlib.Path) -> pathlib.Path:
    """The document root: `acme/a.txt` is acme's, `globex/b.txt` another tenant's."""
    docs = tmp_path / "docs"
    (docs / "acme").mkdir(parents=True)
    (docs / "globex").mkdir()
    (docs / "acme" / "a.txt").write_bytes(DATA)
    (docs / "globex" / "b.txt").write_bytes(OTHER)
    (tmp_path / "secret.txt").write_bytes(b"outside")
    return docs


def fetcher(*roots: pathlib.Path) -> fetching.Fetcher:
    return fetching.Fetcher(settings=DocumentSettings(roots=tuple(str(r) for r in roots)))


async def fetch(root: pathlib.Path, uri: str, *, sha256: str = SHA, size: int = len(DATA)) -> str:
    return await fetcher(root).text(uri=uri, sha256=sha256, size=size, namespace="acme")


async def test_a_document_beneath_the_namespace_directory_is_read_and_verified(root: pathlib.Path) -> None:
    assert await fetch(root, (root / "acme" / "a.txt").as_uri()) == TEXT


@pytest.mark.parametrize(
    ("uri", "message"),
    [
        ("file://{root}/acme/../globex/b.txt", "'..' path segments are not allowed"),
        ("file://{root}/acme/%2E%2E/globex/b.txt", "'..' path segments are not allowed"),
        ("file://{parent}/secret.txt", "outside the document directories of namespace acme"),
        ("file:///etc/passwd", "outside the document directories of namespace acme"),
        ("file://{root}/a.txt", "outside the document directories of namespace acme"),
        ("file://otherhost{root}/acme/a.txt", "not a local file:// URI"),
    ],
)
async def test_paths_outside_the_namespace_directory_are_refused(root: pathlib.Path, uri: str, message: str) -> None:
    formatted = uri.format(root=root, parent=root.parent)
    with pytest.raises(fetching.DocumentRefused, match=message) as caught:
        await fetch(root, formatted)
    assert caught.value.terminal and caught.value.error_class == "DOCUMENT_REFUSED"


async def test_another_tenants_file_with_a_valid_digest_is_refused(root: pathlib.Path) -> None:
    uri = (root / "globex" / "b.txt").as_uri()
    with pytest.raises(fetching.DocumentRefused, match="outside the document directories of namespace acme"):
        await fetch(root, uri, sha256=OTHER_SHA, size=len(OTHER))
    # The owner reads it.
    globex = await fetcher(root).text(uri=uri, sha256=OTHER_SHA, size=len(OTHER), namespace="globex")
    assert globex.encode() == OTHER


async def test_a_directory_symlink_in_the_middle_of_the_path_is_not_followed(root: pathlib.Path) -> None:
    os.symlink(root / "globex", root / "acme" / "shared")
    with pytest.raises(fetching.DocumentRefused, match="symbolic link") as caught:
        await fetch(root, (root / "acme" / "shared" / "b.txt").as_uri(), sha256=OTHER_SHA, size=len(OTHER))
    assert "globex" not in str(caught.value)


async def test_a_symlinked_file_is_not_followed_even_within_the_namespace(root: pathlib.Path) -> None:
    os.symlink(root / "acme" / "a.txt", root / "acme" / "alias.txt")
    os.symlink(root.parent / "secret.txt", root / "acme" / "link.txt")
    for name in ("alias.txt", "link.txt"):
        with pytest.raises(fetching.DocumentRefused, match="symbolic link"):
            await fetch(root, (root / "acme" / name).as_uri())


async def test_a_namespace_directory_that_is_a_symlink_is_not_followed(root: pathlib.Path) -> None:
    (root / "acme" / "a.txt").unlink()
    (root / "acme").rmdir()
    os.symlink(root / "globex", root / "acme")
    with pytest.raises(fetching.DocumentRefused, match="symbolic link"):
        await fetch(root, (root / "acme" / "b.txt").as_uri(), sha256=OTHER_SHA, size=len(OTHER))


async def test_a_root_reached_through_a_symlink_is_the_operators_choice(root: pathlib.Path) -> None:
    mount = root.parent / "mount"
    os.symlink(root, mount)
    assert await fetcher(mount).text(
        uri=(mount / "acme" / "a.txt").as_uri(), sha256=SHA, size=len(DATA), namespace="acme"
    ) == TEXT


async def test_a_fifo_is_refused_at_once_and_never_blocks(root: pathlib.Path) -> None:
    fifo = root / "acme" / "pipe.txt"
    os.mkfifo(fifo)
    try:
        async with asyncio.timeout(5):
            with pytest.raises(fetching.DocumentRefused, match="not a regular file"):
                await fetch(root, fifo.as_uri())
    except TimeoutError:
        # Unblock the reader thread so that the test run can end, then fail.
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail("opening a FIFO under the document root blocked")


async def test_a_socket_and_a_device_are_refused(root: pathlib.Path) -> None:
    path = root / "acme" / "s.sock"
    assert len(str(path)) < 100, "AF_UNIX paths are short"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(str(path))
        with pytest.raises(fetching.DocumentRefused, match="not a regular file"):
            await fetch(root, path.as_uri())
    settings = DocumentSettings(namespace_directories=(("acme", "/dev"),))
    with pytest.raises(fetching.DocumentRefused, match="not a regular file"):
        await fetching.Fetcher(settings=settings).text(uri="file:///dev/zero", sha256=SHA, size=1, namespace="acme")


async def test_the_namespace_must_be_a_namespace_name(root: pathlib.Path) -> None:
    for namespace in ("..", "", "acme/../globex", "Acme"):
        with pytest.raises(fetching.DocumentRefused, match="not a namespace name"):
            await fetcher(root).text(
                uri=(root / "acme" / "a.txt").as_uri(), sha256=SHA, size=len(DATA), namespace=namespace
            )


async def test_without_roots_every_file_uri_is_refused(root: pathlib.Path) -> None:
    with pytest.raises(fetching.DocumentRefused, match="no document roots are configured"):
        await fetcher().text(uri=(root / "acme" / "a.txt").as_uri(), sha256=SHA, size=len(DATA), namespace="acme")


async def test_a_missing_file_is_not_found_and_terminal(root: pathlib.Path) -> None:
    with pytest.raises(fetching.DocumentNotFound, match="no such file") as caught:
        await fetch(root, (root / "acme" / "gone.txt").as_uri())
    assert caught.value.terminal and caught.value.error_class == "DOCUMENT_NOT_FOUND"


async def test_a_directory_is_refused(root: pathlib.Path) -> None:
    (root / "acme" / "dir").mkdir()
    with pytest.raises(fetching.DocumentRefused, match="not a regular file"):
        await fetch(root, (root / "acme" / "dir").as_uri())


async def test_lading_run_directories_serve_their_namespace_only(tmp_path: pathlib.Path) -> None:
    (tmp_path / "a.txt").write_bytes(DATA)
    settings = DocumentSettings(namespace_directories=(("acme", str(tmp_path)),))
    uri = (tmp_path / "a.txt").as_uri()
    assert await fetching.Fetcher(settings=settings).text(uri=uri, sha256=SHA, size=len(DATA), namespace="acme") == TEXT
    with pytest.raises(fetching.DocumentRefused, match="outside the document directories of namespace globex"):
        await fetching.Fetcher(settings=settings).text(uri=uri, sha256=SHA, size=len(DATA), namespace="globex")


MISMATCH = "does not match the manifest's sha256 and bytes; not the listed document"


def _without_uri(error: Exception, uri: str) -> str:
    """The error's message without the document's URI, whose temporary path may hold any digits."""
    return str(error).replace(uri, "<uri>")


async def test_a_tampered_document_is_a_mismatch_that_does_not_say_what_the_file_is(root: pathlib.Path) -> None:
    tampered = DATA.replace(b"12", b"99")  # same size, other bytes
    (root / "acme" / "a.txt").write_bytes(tampered)
    uri = (root / "acme" / "a.txt").as_uri()
    with pytest.raises(fetching.DigestMismatch, match=MISMATCH) as caught:
        await fetch(root, uri)
    assert caught.value.terminal and caught.value.error_class == "DOCUMENT_DIGEST_MISMATCH"
    actual = hashlib.sha256(tampered).hexdigest()
    message = _without_uri(caught.value, uri)
    assert actual[:8] not in message and str(len(tampered)) not in message


async def test_a_longer_document_is_refused_after_one_byte_too_many(root: pathlib.Path) -> None:
    (root / "acme" / "big.txt").write_bytes(b"x" * 1_000_000)
    uri = (root / "acme" / "big.txt").as_uri()
    with pytest.raises(fetching.DigestMismatch, match=MISMATCH) as caught:
        await fetch(root, uri, size=10)
    message = _without_uri(caught.value, uri)
    assert "1000000" not in message and "10 " not in message


async def test_a_shorter_document_is_a_mismatch_without_its_size(root: pathlib.Path) -> None:
    uri = (root / "acme" / "a.txt").as_uri()
    with pytest.raises(fetching.DigestMismatch, match=MISMATCH) as caught:
        await fetch(root, uri, size=len(DATA) + 1)
    assert str(len(DATA)) not in _without_uri(caught.value, uri)


def test_verify_reveals_neither_size_nor_digest() -> None:
    data = b"some other file's content " * 50  # 1300 bytes
    for size in (len(data), len(data) + 5):
        with pytest.raises(fetching.DigestMismatch) as caught:
            fetching.verify(data, uri="file:///data/acme/x.txt", sha256=SHA, size=size)
        message = str(caught.value)
        assert hashlib.sha256(data).hexdigest()[:6] not in message and str(len(data)) not in message


async def test_bytes_that_match_but_are_not_utf8_are_terminal(root: pathlib.Path) -> None:
    latin = "Größe".encode("latin-1")
    (root / "acme" / "latin.txt").write_bytes(latin)
    with pytest.raises(fetching.DocumentNotText, match="not UTF-8") as caught:
        await fetch(root, (root / "acme" / "latin.txt").as_uri(), sha256=hashlib.sha256(latin).hexdigest(),
                    size=len(latin))  # fmt: skip
    assert caught.value.error_class == "DOCUMENT_NOT_UTF8"


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
