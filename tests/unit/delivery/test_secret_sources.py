"""Where signing secrets come from: static maps and a directory re-read on change; never shown."""

from __future__ import annotations

import logging
import os
import pathlib

import pytest

from lading.delivery import secrets
from lading.webhooks import signing

ONE = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
TWO = "whsec_dGhpcyBpcyB0aGUgbmV3IHNlY3JldCBrZXkh"


def test_static_secrets_give_each_endpoint_its_keys_and_none_to_others() -> None:
    source = secrets.StaticSecrets({"acme/erp": [ONE, TWO]})
    assert source.keys_for("acme/erp") == signing.parse_keys([ONE, TWO])
    assert source.keys_for("acme/other") == ()
    assert "MfKQ" not in repr(source)


def test_a_directory_file_per_endpoint_with_one_secret_per_line_is_a_rotation(tmp_path: pathlib.Path) -> None:
    (tmp_path / "acme.erp").write_text(f"{ONE}\n\n{TWO}\n")
    source = secrets.DirectorySecrets(tmp_path)
    assert source.keys_for("acme/erp") == signing.parse_keys([ONE, TWO])
    assert source.keys_for("acme/none") == ()


def test_a_changed_file_is_read_again_and_a_removed_one_gives_no_keys(tmp_path: pathlib.Path) -> None:
    file = tmp_path / "acme.erp"
    file.write_text(ONE + "\n")
    source = secrets.DirectorySecrets(tmp_path)
    assert source.keys_for("acme/erp") == signing.parse_keys([ONE])
    file.write_text(TWO + "\n")
    stat = file.stat()
    os.utime(file, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    assert source.keys_for("acme/erp") == signing.parse_keys([TWO])
    file.unlink()
    assert source.keys_for("acme/erp") == ()


def test_a_bad_line_is_skipped_and_logged_without_its_content(
        tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "acme.erp").write_text("whsec_!!notbase64!!\n" + ONE + "\n")
    with caplog.at_level(logging.ERROR):
        keys = secrets.DirectorySecrets(tmp_path).keys_for("acme/erp")
    assert keys == signing.parse_keys([ONE])
    assert "line 1" in caplog.text and "notbase64" not in caplog.text and "MfKQ" not in caplog.text


@pytest.mark.parametrize("name", ["acme", "/erp", "acme/", "../x/y", "acme/.hidden", "a/b/c"])
def test_names_that_are_not_namespace_slash_name_never_reach_the_file_system(
        tmp_path: pathlib.Path, name: str
) -> None:
    assert secrets.DirectorySecrets(tmp_path).keys_for(name) == ()
