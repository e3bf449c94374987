"""`lading run`'s delivery plan: which endpoints get a local receiver and loopback egress."""

from __future__ import annotations

import argparse
import pathlib

import pytest
from lading_cli import local_delivery

from lading.models import manifests

MANIFEST = """\
apiVersion: v1
kind: Secret
metadata: {name: s, namespace: acme}
stringData: {secret: whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw}
---
apiVersion: lading.dev/v1alpha1
kind: DeliveryEndpoint
metadata: {name: local, namespace: acme}
spec: {url: "http://localhost:8787/webhooks/lading", secretRef: {name: s, key: secret}}
---
apiVersion: lading.dev/v1alpha1
kind: DeliveryEndpoint
metadata: {name: remote, namespace: acme}
spec: {url: "https://erp.example.com/webhooks/lading", secretRef: {name: s, key: secret}}
"""


def _args(*allow: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    local_delivery.add_arguments(parser)
    return parser.parse_args([a for cidr in allow for a in ("--egress-allow", cidr)])


def test_loopback_is_allowed_for_local_endpoints_only_and_egress_allow_for_all(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LADING_EGRESS_ALLOW", raising=False)
    (tmp_path / "m.yaml").write_text(MANIFEST)
    loaded = manifests.load_paths([tmp_path / "m.yaml"])
    plan = local_delivery.plan(loaded, _args("10.20.0.0/16"))
    assert [(e.name, e.host, e.port) for e in plan.local] == [("acme/local", "localhost", 8787)]
    assert set(plan.secrets) == {"acme/local", "acme/remote"}
    assert local_delivery.LOOPBACK[0] in plan.policy.allowance("acme/local")
    assert local_delivery.LOOPBACK[0] not in plan.policy.allowance("acme/remote")
    assert [str(n) for n in plan.policy.allowance("acme/remote")] == ["10.20.0.0/16"]
    assert "MfKQ" not in repr(plan)
