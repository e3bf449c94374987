"""Manifest lines: every field checked, errors name the line and the field, limits hold, hashes match inline."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import pathlib
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lading.documents import manifest_lines
from lading.jobs import hashing
from lading.models import specs
from lading.settings import DocumentSettings

SHA = hashlib.sha256(b"hello").hexdigest()
GOOD = {"key": "inv-0001", "uri": "file:///data/inv-0001.txt", "sha256": SHA, "bytes": 5}


def line(**changes: object) -> bytes:
    value = {**GOOD, **changes}
    return json.dumps({k: v for k, v in value.items() if v is not ...}).encode()


def test_a_valid_line_parses() -> None:
    parsed = manifest_lines.parse_line(1, line())
    assert (parsed.key, parsed.uri, parsed.sha256, parsed.bytes) == ("inv-0001", GOOD["uri"], SHA, 5)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (line(sha256="ABC"), "manifest line 17: sha256: must be 64 lowercase hex characters"),
        (line(sha256=SHA.upper()), "manifest line 17: sha256: must be 64 lowercase hex characters"),
        (line(sha256=...), "manifest line 17: sha256: is required"),
        (line(bytes=0), "manifest line 17: bytes: must be greater than 0"),
        (line(bytes=-3), "manifest line 17: bytes: must be greater than 0"),
        (line(bytes="5"), "manifest line 17: bytes: must be an integer"),
        (line(bytes=5.5), "manifest line 17: bytes: must be an integer"),
        (line(bytes=True), "manifest line 17: bytes: must be an integer"),
        (line(bytes=manifest_lines.DOCUMENT_MAX_BYTES + 1), "manifest line 17: bytes: must be at most 16777216"),
        (line(key=""), "manifest line 17: key: must not be empty"),
        (line(key="/abs"), "manifest line 17: key: must be a document key"),
        (line(key="a/../b"), "manifest line 17: key: a document key must not contain empty, '.' or '..'"),
        (line(key="k" * 257), "manifest line 17: key: must be at most 256 characters"),
        (line(key=7), "manifest line 17: key: must be a string"),
        (line(uri="ftp://h/x"), "manifest line 17: uri: must be a file://, http:// or https:// URI"),
        (line(uri="file://relative/x"), "manifest line 17: uri: a file:// URI needs an absolute path"),
        (line(uri="https://user:pw@h/x"), "manifest line 17: uri: the URL must not carry credentials"),
        (line(uri="file:///a b"), "manifest line 17: uri: must be a file://, http:// or https:// URI"),
        # PostgreSQL text cannot store U+0000: named as such, before the COPY of the spool could fail on it.
        (line(uri="https://h/x\x00.txt"), "manifest line 17: uri: contains U+0000 (NUL), which PostgreSQL"),
        (line(uri="file:///data/\x00"), "manifest line 17: uri: contains U+0000 (NUL), which PostgreSQL"),
        (line(key="inv\x001"), "manifest line 17: key: contains U+0000 (NUL), which PostgreSQL"),
        (line(sha256="\x00" * 64), "manifest line 17: sha256: contains U+0000 (NUL), which PostgreSQL"),
        (b'{"key": "inv-1", "uri": "file:///x\\ud800"}', "manifest line 17: not valid JSON"),
        (line(extra=1), "manifest line 17: extra: unknown field (a line has exactly key, uri, sha256, bytes)"),
        (b"{not json", "manifest line 17: not valid JSON"),
        (b"[1, 2]", "manifest line 17: must be a JSON object with key, uri, sha256, bytes"),
        # A final newline inside a value is not let through by a pattern's "$".
        (line(key="inv-1\n"), "manifest line 17: key: must be a document key"),
        (line(uri="file:///data/x\n"), "manifest line 17: uri: must be a file://, http:// or https:// URI"),
        (line(sha256=SHA + "\n"), "manifest line 17: sha256: must be 64 lowercase hex characters"),
    ],
)
@pytest.mark.parametrize("validate", [manifest_lines.parse_line, manifest_lines.fields_of])
def test_errors_name_the_line_and_the_field(raw: bytes, message: str, validate: Callable[[int, bytes], object]) -> None:
    with pytest.raises(manifest_lines.ManifestInvalid) as caught:
        validate(17, raw)
    assert str(caught.value).startswith(message)
    assert caught.value.line == 17


ODD_TEXT = st.text(st.sampled_from("aZ09._-/:%,\"\\ \n\r\t\x00\x7fé\u2028\ud800"), max_size=12)
PLAIN_TEXT = st.text(st.sampled_from("aZ09._-/:%,\"?#="), max_size=12)
VALID = {
    "key": st.from_regex(specs.DOCUMENT_KEY_PATTERN, fullmatch=True),
    "uri": st.builds(str.__add__, st.sampled_from(["file:///", "https://h/", "http://h:8080/"]), PLAIN_TEXT),
    "sha256": st.just(SHA),
    "bytes": st.integers(min_value=1, max_value=manifest_lines.DOCUMENT_MAX_BYTES),
}
ODD = {
    "key": st.one_of(
        st.sampled_from(["a//b", "a/./b", "./a", "a/..", "..", ".", "a/", ".hidden/x", "a..b/c.", "k" * 257]),
        ODD_TEXT,
        st.integers(),
    ),
    "uri": st.one_of(
        st.builds(
            str.__add__,
            st.sampled_from(["file://", "file://localhost/", "file://h/", "http://", "https://", "ftp://", ""]),
            ODD_TEXT,
        ),
        st.sampled_from(["https://u:p@h/x", "http://h:99999/x", "https://[::1/x", "file:///" + "p" * 2048]),
        st.none(),
    ),
    "sha256": st.one_of(st.sampled_from([SHA.upper(), SHA + "\n", SHA[:63]]), ODD_TEXT),
    "bytes": st.one_of(
        st.integers(min_value=-2, max_value=0),
        st.integers(min_value=manifest_lines.DOCUMENT_MAX_BYTES + 1, max_value=2**70),
        st.booleans(),
        st.floats(allow_nan=False),
        st.text(max_size=3),
    ),
    "extra": st.integers(),
}


@st.composite
def manifest_line_values(draw: st.DrawFn) -> dict[str, object]:
    """A valid line's values with up to two fields made odd, dropped, or added (`extra`)."""
    values = {name: draw(strategy) for name, strategy in VALID.items()}
    for name in draw(st.lists(st.sampled_from([*ODD, "drop"]), max_size=2)):
        if name == "drop":
            values.pop(draw(st.sampled_from(sorted(VALID))), None)
        else:
            values[name] = draw(ODD[name])
    return values


def outcome(validate: Callable[[int, bytes], object], raw: bytes) -> object:
    try:
        result = validate(9, raw)
    except manifest_lines.ManifestInvalid as exc:
        return str(exc), exc.line, exc.field
    if isinstance(result, manifest_lines.ManifestLine):
        return result.key, result.uri, result.sha256, result.bytes
    return result


@settings(max_examples=500)
@given(values=manifest_line_values())
def test_the_quick_check_of_plain_lines_decides_as_pydantic_does(values: dict[str, object]) -> None:
    """fields_of checks plain lines without pydantic: the same values accepted, the same errors."""
    raw = json.dumps(values).encode()
    assert outcome(manifest_lines.fields_of, raw) == outcome(manifest_lines.parse_line, raw)


def test_errors_never_repeat_the_line() -> None:
    secret_uri = "https://files.example/doc?X-Amz-Signature=topsecret"
    with pytest.raises(manifest_lines.ManifestInvalid) as caught:
        manifest_lines.parse_line(3, line(uri=secret_uri, sha256="nothex"))
    assert "topsecret" not in str(caught.value)
    with pytest.raises(manifest_lines.ManifestInvalid) as caught:
        manifest_lines.parse_line(3, b'{"key": "topsecret", ')
    assert "topsecret" not in str(caught.value)


def write(path: pathlib.Path, lines: list[bytes]) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path.as_uri()


async def collect(uri: str, roots: tuple[str, ...]) -> list[tuple[int, manifest_lines.ManifestLine]]:
    return [item async for item in manifest_lines.lines(uri, settings=DocumentSettings(roots=roots), namespace="acme")]


async def test_a_file_manifest_streams_with_line_numbers_and_skips_blank_lines(tmp_path: pathlib.Path) -> None:
    uri = write(tmp_path / "acme" / "m.jsonl", [line(key="a"), b"", b"  ", line(key="b") + b"\r"])
    got = await collect(uri, (str(tmp_path),))
    assert [(n, item.key) for n, item in got] == [(1, "a"), (4, "b")]


async def test_a_bad_line_deep_in_the_manifest_is_named(tmp_path: pathlib.Path) -> None:
    lines = [line(key=f"k{i}") for i in range(1, 200)]
    lines[149] = line(key="k150", sha256="0" * 63)
    uri = write(tmp_path / "acme" / "m.jsonl", lines)
    with pytest.raises(manifest_lines.ManifestInvalid, match=r"^manifest line 150: sha256: must be 64 lowercase hex"):
        await collect(uri, (str(tmp_path),))


async def test_a_bad_last_line_without_a_newline_is_named_and_nothing_is_spooled(tmp_path: pathlib.Path) -> None:
    lines = [line(key=f"k{i}") for i in range(1, 5001)]  # several chunks read
    lines[-1] = line(key="k5000", bytes=0)
    path = tmp_path / "acme" / "m.jsonl"
    uri = write(path, lines)
    path.write_bytes(path.read_bytes().rstrip(b"\n"))
    with pytest.raises(manifest_lines.ManifestInvalid, match=r"^manifest line 5000: bytes: must be greater than 0"):
        async with manifest_lines.spool(uri, settings=DocumentSettings(roots=(str(tmp_path),)), namespace="acme"):
            pytest.fail("a manifest with an invalid line was spooled")


async def test_an_overlong_line_is_refused_without_reading_it_whole(tmp_path: pathlib.Path) -> None:
    uri = write(tmp_path / "acme" / "m.jsonl", [line(), b"x" * (manifest_lines.MAX_LINE_BYTES * 3)])
    longer = rf"^manifest line 2: longer than {manifest_lines.MAX_LINE_BYTES}"
    with pytest.raises(manifest_lines.ManifestInvalid, match=longer):
        await collect(uri, (str(tmp_path),))


async def test_too_many_lines_are_refused(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(manifest_lines, "MAX_LINES", 3)
    uri = write(tmp_path / "acme" / "m.jsonl", [line(key=f"k{i}") for i in range(4)])
    with pytest.raises(manifest_lines.ManifestInvalid, match="more than 3 lines; split the batch"):
        await collect(uri, (str(tmp_path),))


async def test_a_manifest_outside_the_roots_is_invalid_and_a_missing_one_unavailable(tmp_path: pathlib.Path) -> None:
    uri = write(tmp_path / "acme" / "m.jsonl", [line()])
    elsewhere = tmp_path / "roots"
    elsewhere.mkdir()
    with pytest.raises(manifest_lines.ManifestInvalid, match="outside the document directories of namespace acme"):
        await collect(uri, (str(elsewhere),))
    with pytest.raises(manifest_lines.ManifestUnavailable, match="no such file"):
        await collect((tmp_path / "acme" / "missing.jsonl").as_uri(), (str(tmp_path),))


async def test_spool_counts_documents_and_bytes_and_deletes_its_file(tmp_path: pathlib.Path) -> None:
    uri = write(tmp_path / "acme" / "m.jsonl", [line(key="a", bytes=3), line(key="b", uri='file:///d/x,"y"', bytes=4)])
    settings = DocumentSettings(roots=(str(tmp_path),))
    async with manifest_lines.spool(uri, settings=settings, namespace="acme") as spooled:
        assert (spooled.documents, spooled.total_bytes) == (2, 7)
        rows = spooled.path.read_text().splitlines()
        assert rows[1].startswith('2,b,"file:///d/x,""y""",')
        path = spooled.path
    assert not path.exists()


@given(
    uris=st.lists(
        st.one_of(
            st.from_regex(specs.MANIFEST_URI_PATTERN, fullmatch=True).filter(lambda u: "\n" not in u and "\r" not in u),
            st.sampled_from(['file:///a"b', "file:///a,b", 'https://h/é"x,y""']),
        ),
        min_size=1,
        max_size=5,
    )
)
def test_spool_rows_are_written_as_the_csv_module_writes_them(uris: list[str]) -> None:
    rows = [(i + 1, f"k{i}", uri, SHA, i + 5) for i, uri in enumerate(uris)]
    expected = io.StringIO()
    csv.writer(expected, lineterminator="\n").writerows(rows)
    assert manifest_lines._csv(rows) == expected.getvalue()


async def test_an_empty_manifest_is_invalid(tmp_path: pathlib.Path) -> None:
    uri = write(tmp_path / "acme" / "m.jsonl", [b""])
    with pytest.raises(manifest_lines.ManifestInvalid, match="lists no documents"):
        async with manifest_lines.spool(uri, settings=DocumentSettings(roots=(str(tmp_path),)), namespace="acme"):
            pass


@given(
    texts=st.dictionaries(
        st.from_regex(specs.DOCUMENT_KEY_PATTERN, fullmatch=True).filter(lambda k: len(k) <= 40),
        st.text(min_size=1, max_size=50),
        min_size=1,
        max_size=30,
    )
)
def test_the_same_documents_hash_the_same_inline_or_by_manifest(texts: dict[str, str]) -> None:
    """Inline: the digest of each text. Manifest: the sha256 field, streamed in key order."""
    options = {"schema": "invoice.v1", "model_policy": {"pool": "a/b", "model": "m"}, "validation_policy": "p-v1"}
    inline = hashing.batch_request_hash(
        **options, documents=[(key, hashing.content_digest(text)) for key, text in texts.items()]  # type: ignore[arg-type]
    )
    streamed = hashing.BatchRequestHasher(**options)  # type: ignore[arg-type]
    for key in sorted(texts):
        streamed.add(key, hashlib.sha256(texts[key].encode()).hexdigest())
    assert streamed.hexdigest() == inline


def test_the_streaming_hasher_refuses_unsorted_or_repeated_keys() -> None:
    hasher = hashing.BatchRequestHasher(schema="s", model_policy={}, validation_policy="p")
    hasher.add("b", SHA)
    with pytest.raises(ValueError, match="unique and ascending"):
        hasher.add("a", SHA)
    with pytest.raises(ValueError, match="unique and ascending"):
        hasher.add("b", SHA)
