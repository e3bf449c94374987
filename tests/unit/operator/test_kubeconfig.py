"""Finding the cluster from a kubeconfig file: what `lading operator --kubeconfig` reads."""

from __future__ import annotations

import json
import pathlib

import kopf
import pytest
from lading_operator import conditions, kube


def _write(path: pathlib.Path, config: dict[str, object]) -> str:
    path.write_text(json.dumps(config))
    return str(path)


def test_the_current_context_picks_cluster_user_and_namespace(tmp_path: pathlib.Path) -> None:
    config = {
        "current-context": "prod",
        "contexts": [
            {"name": "dev", "context": {"cluster": "dev", "user": "dev"}},
            {"name": "prod", "context": {"cluster": "prod", "user": "ops", "namespace": "lading-system"}},
        ],
        "clusters": [
            {"name": "dev", "cluster": {"server": "https://dev.example:6443"}},
            {"name": "prod", "cluster": {"server": "https://prod.example:6443", "certificate-authority-data": "Q0E="}},
        ],
        "users": [{"name": "dev", "user": {}}, {"name": "ops", "user": {"token": "t0ken"}}],
    }
    info = kube.connection_info(_write(tmp_path / "config", config))
    assert info.server == "https://prod.example:6443"
    assert info.token == "t0ken"
    assert info.ca_data == "Q0E="
    assert info.default_namespace == "lading-system"


def test_a_missing_or_incomplete_kubeconfig_is_a_clear_error(tmp_path: pathlib.Path) -> None:
    with pytest.raises(kopf.LoginError, match="cannot read kubeconfig"):
        kube.connection_info(str(tmp_path / "absent"))
    with pytest.raises(kopf.LoginError, match="no current-context"):
        kube.connection_info(_write(tmp_path / "empty", {"clusters": []}))
    broken = {"current-context": "x", "contexts": [{"name": "x", "context": {"cluster": "gone", "user": "u"}}]}
    with pytest.raises(kopf.LoginError, match="context 'x' or its cluster is not defined"):
        kube.connection_info(_write(tmp_path / "broken", broken))


def test_paths_of_collections_objects_and_subresources() -> None:
    assert kube.path("v1", "secrets", namespace="acme", name="s") == "/api/v1/namespaces/acme/secrets/s"
    assert kube.path("lading.dev/v1alpha1", "tenantquotas", namespace=None) == "/apis/lading.dev/v1alpha1/tenantquotas"
    assert (
        kube.path("apps/v1", "deployments", namespace="a", name="w", sub="status")
        == "/apis/apps/v1/namespaces/a/deployments/w/status"
    )


def test_a_condition_keeps_its_transition_time_while_its_status_holds() -> None:
    first = conditions.condition(None, type="Ready", value=False, reason="SecretMissing")
    old = [{"type": "Ready", "status": "False", "lastTransitionTime": "2020-01-01T00:00:00Z"}]
    same = conditions.condition(old, type="Ready", value=False, reason="SecretMissing", message="still")
    flipped = conditions.condition(old, type="Ready", value=True, reason="Registered")
    assert same.last_transition_time == "2020-01-01T00:00:00Z"
    assert flipped.last_transition_time != "2020-01-01T00:00:00Z"
    assert first.status == "False" and flipped.status == "True"
    assert not conditions.changed({"a": 1, "b": 2}, {"a": 1, "b": 2})
    assert conditions.changed({"a": 1}, {"a": 2})


def test_a_status_field_that_went_away_is_removed_and_unchanged_ones_are_not_sent() -> None:
    live = {"phase": "Running", "pausedUntil": "2026-01-01T00:00:00Z", "total": 5}
    assert conditions.status_patch(live, {"phase": "Running", "total": 6}) == {"total": 6, "pausedUntil": None}
    assert conditions.changed(live, {"phase": "Running", "total": 5})
    assert conditions.status_patch(live, dict(live)) is None
    assert conditions.status_patch(None, {"phase": "Pending"}) == {"phase": "Pending"}
