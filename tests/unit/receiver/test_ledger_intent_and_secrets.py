"""The ledger's business-intent key and the receiver's secret intake, without a database."""

from __future__ import annotations

import argparse
import pathlib

import pytest
from lading_cli import receiver
from lading_webhook_receiver import ledger

from lading.models import invoice


@pytest.mark.parametrize(
    ("name", "vat_id", "identity"),
    [
        ("Kuzey Tekstil", "TR 123.456-7890", "vat:TR1234567890"),
        ("Another Name Entirely", "tr1234567890", "vat:TR1234567890"),  # the VAT id decides
        ("Ege  Lojistik\tLtd ", None, "name:ege lojistik ltd"),
        ("Müller Straße GmbH", "", "name:müller strasse gmbh"),  # Unicode case folding: ß is ss
        ("\uff26\uff55\uff4c\uff4c Co", " - ", "name:full co"),  # NFKC folds fullwidth; a VAT id of only noise is none
    ],
)
def test_supplier_identity_prefers_the_vat_id_and_normalises(name: str, vat_id: str | None, identity: str) -> None:
    assert ledger.supplier_identity(invoice.Supplier(name=name, vat_id=vat_id)) == identity


def _args(tmp_path: pathlib.Path, *, secret: list[str], lines: str | None = None) -> argparse.Namespace:
    files = []
    if lines is not None:
        files.append(tmp_path / "secrets")
        files[0].write_text(lines)
    return argparse.Namespace(secret=secret, secret_file=files)


def test_secrets_come_from_flags_files_and_the_environment_together(tmp_path: pathlib.Path) -> None:
    args = _args(tmp_path, secret=["whsec_QUFB"], lines="# comment\n\nwhsec_QkJC\n")
    found = receiver.collect_secrets(args, {"LADING_RECEIVER_SECRETS": "whsec_Q0ND, whsec_RERE"})
    assert found == ["whsec_QUFB", "whsec_QkJC", "whsec_Q0ND", "whsec_RERE"]


def test_no_secret_or_a_bad_one_is_refused_naming_where_it_came_from_but_not_the_value(tmp_path: pathlib.Path) -> None:
    with pytest.raises(SystemExit, match="no signing secret"):
        receiver.collect_secrets(_args(tmp_path, secret=[]), {})
    with pytest.raises(SystemExit, match=r"secrets line 2") as caught:
        receiver.collect_secrets(_args(tmp_path, secret=[], lines="whsec_QUFB\nwhsec_s3cr3t!\n"), {})
    assert "s3cr3t" not in str(caught.value)
