"""Drift of owned objects (`lading_operator.drift`) and the quantities it compares by value."""

from __future__ import annotations

import decimal
from typing import Any

import pytest
from lading_operator import drift, quantities


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1Gi", 1024**3), ("1024Mi", 1024**3), ("100m", decimal.Decimal("0.1")), ("0.1", decimal.Decimal("0.1")),
        ("1", 1), (1, 1), ("1000m", 1), ("1k", 1000), ("1e3", 1000), ("1E3", 1000), ("2.5Gi", int(2.5 * 1024**3)),
        (".5", decimal.Decimal("0.5")), ("+1M", 10**6), ("500u", decimal.Decimal("0.0005")),
        (0.25, decimal.Decimal("0.25")),
    ],
)  # fmt: skip
def test_quantities_parse_to_their_exact_value(text: Any, value: Any) -> None:
    assert quantities.parse(text) == value


@pytest.mark.parametrize("text", ["", "Gi", "1 Gi", "1gi", "1.2.3", "ten", "1e999", True, None, [1]])
def test_what_is_not_a_quantity_parses_to_none(text: Any) -> None:
    assert quantities.parse(text) is None


def _deployment(**pod: Any) -> dict[str, Any]:
    container = {"name": "w", "image": "lading:1", "resources": {"requests": {"cpu": "100m", "memory": "1024Mi"},
                                                                "limits": {"memory": "1Gi"}}}  # fmt: skip
    return {
        "metadata": {"name": "p-worker", "labels": {"app": "lading"}},
        "spec": {"replicas": 2, "template": {"spec": {"containers": [container], "volumes": [
            {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}}], **pod}}},
    }  # fmt: skip


def test_a_quantity_spelt_canonically_by_the_api_server_is_not_drift() -> None:
    desired = _deployment()
    live = _deployment()
    container = live["spec"]["template"]["spec"]["containers"][0]
    container["resources"] = {"requests": {"cpu": "0.1", "memory": "1Gi"}, "limits": {"memory": "1073741824"}}
    live["spec"]["template"]["spec"]["volumes"][0]["emptyDir"]["sizeLimit"] = "65536Ki"
    assert not drift.differs(desired, live)
    # A different amount is drift, and outside resources a string is compared as a string.
    container["resources"]["limits"]["memory"] = "2Gi"
    assert drift.differs(desired, live)
    assert drift.differs({"metadata": {"labels": {"v": "1"}}}, {"metadata": {"labels": {"v": "1.0"}}})


def test_a_new_rendering_is_applied_and_the_same_one_only_when_someone_changed_it() -> None:
    rendered = _deployment(nodeSelector={"gpu": "h100"})
    live = drift.stamped(rendered)
    assert drift.up_to_date(rendered, live)
    # Removing the node selector is a new rendering (server-side apply then removes it from the live object).
    assert not drift.up_to_date(_deployment(), live)
    assert drift.applied_hash(_deployment()) != drift.applied_hash(rendered)
    # The same rendering, edited by someone: applied again.
    live["spec"]["template"]["spec"]["containers"][0]["image"] = "other:1"
    assert not drift.up_to_date(rendered, live)
    # Never applied by this operator (no hash): applied.
    assert not drift.up_to_date(rendered, rendered)
    # The hash does not depend on itself or on key order.
    assert drift.applied_hash(drift.stamped(rendered)) == drift.applied_hash(rendered)
    assert drift.applied_hash(dict(reversed(list(rendered.items())))) == drift.applied_hash(rendered)


def test_fields_we_do_not_render_and_the_replicas_are_left_alone() -> None:
    live = _deployment(dnsPolicy="ClusterFirst", schedulerName="default-scheduler", nodeSelector={"zone": "a"})
    live["metadata"]["labels"]["team"] = "x"
    live["metadata"]["resourceVersion"] = "7"
    live["spec"]["replicas"] = 5
    assert not drift.differs(_deployment(), live)
