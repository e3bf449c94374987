"""The worker's delivery flags: secrets directory, egress allow-list from flags and environment, opting out."""

from __future__ import annotations

import argparse
import ipaddress
import pathlib

import pytest
from lading_worker import main

from lading.delivery import secrets


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    main.add_arguments(parser)
    return parser.parse_args(["--pool", "lading-system/builtin", *argv])


def test_flags_and_the_environment_build_the_dispatchers_configuration(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LADING_EGRESS_ALLOW", "10.1.0.0/16, fd00::/8")
    config = main.delivery_from(
        _parse("--egress-allow", "192.168.7.0/24", "--endpoint-secrets-dir", str(tmp_path),
               "--delivery-concurrency", "8", "--delivery-lease-ttl", "10")
    )  # fmt: skip
    assert config is not None
    assert isinstance(config.secrets, secrets.DirectorySecrets) and config.secrets.path == tmp_path
    assert set(config.policy.allow) == {
        ipaddress.ip_network("192.168.7.0/24"), ipaddress.ip_network("10.1.0.0/16"), ipaddress.ip_network("fd00::/8")
    }
    assert (config.settings.concurrency, config.settings.lease_ttl_s, config.settings.total_timeout_s) == (8, 10, 5)
    settings = main.settings_from(_parse("--egress-allow", "192.168.7.0/24"))
    assert "192.168.7.0/24" in settings.documents.egress_allow, "documents fetched by URL share the allow-list"


def test_the_secrets_directory_comes_from_the_environment_and_no_dispatcher_opts_out(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LADING_EGRESS_ALLOW", raising=False)
    monkeypatch.setenv("LADING_ENDPOINT_SECRETS_DIR", str(tmp_path))
    config = main.delivery_from(_parse())
    assert config is not None and isinstance(config.secrets, secrets.DirectorySecrets)
    assert main.delivery_from(_parse("--no-dispatcher")) is None


def test_a_bad_cidr_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LADING_EGRESS_ALLOW", raising=False)
    with pytest.raises(ValueError, match=r"'10\.0\.0\.0/99' is not a CIDR"):
        main.delivery_from(_parse("--egress-allow", "10.0.0.0/99"))
