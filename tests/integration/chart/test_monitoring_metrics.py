"""
Every metric the chart's Grafana dashboard and PrometheusRule query is one Lading exports: a
renamed metric must not leave an empty panel or an alert that can never fire.
"""

from __future__ import annotations

import json
import re
from typing import Any

import prometheus_client
import pytest

from lading import metrics
from tests.integration.chart import test_chart

METRIC_NAME = re.compile(r"\blading_[a-z0-9_]+\b")
"""Lading's metric names in PromQL (label names never start with `lading_`)."""


def _exported_names() -> set[str]:
    """Every series name lading.metrics' registry can produce, suffixes included."""
    suffixes = {
        "counter": ("_total", "_created"),
        "gauge": ("",),
        "histogram": ("_bucket", "_count", "_sum", "_created"),
        "summary": ("", "_count", "_sum", "_created"),
        "info": ("_info",),
    }
    names = set()
    for family in metrics.REGISTRY.collect():  # a labelled family with no child yet still has its name and type
        names.update(family.name + suffix for suffix in suffixes.get(family.type, ("",)))
    return names


def _dashboard_expressions() -> list[tuple[str, str]]:
    dashboard = json.loads((test_chart.CHART / "files" / "dashboards" / "lading.json").read_text())
    found = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            found.append((f"panel {panel['title']!r}", target["expr"]))
    for variable in dashboard["templating"]["list"]:
        if variable.get("type") == "query":
            found.append((f"variable {variable['name']}", variable["query"]))
    return found


def _rule_expressions() -> list[tuple[str, str]]:
    found = []
    (rule,) = test_chart.objects(test_chart.NON_DEFAULT, "PrometheusRule")
    for group in rule["spec"]["groups"]:
        for alert in group["rules"]:
            found.append((f"alert {alert['alert']}", alert["expr"]))
    return found


def test_lading_metrics_are_registered() -> None:
    exported = _exported_names()
    assert "lading_jobs_claimed_total" in exported and "lading_provider_latency_seconds_bucket" in exported
    assert "lading_jobs_claimed" not in exported, "a counter is only exported with its suffix"
    assert isinstance(metrics.REGISTRY, prometheus_client.CollectorRegistry)


@pytest.mark.parametrize("source", ["dashboard", "alerts"])
def test_every_queried_metric_is_exported(source: str) -> None:
    expressions: list[tuple[str, str]] = _dashboard_expressions() if source == "dashboard" else _rule_expressions()
    assert expressions
    exported = _exported_names()
    missing: dict[str, Any] = {}
    for where, expression in expressions:
        names = METRIC_NAME.findall(expression)
        assert names, f"{where}: queries no Lading metric: {expression}"
        for name in names:
            if name not in exported:
                missing.setdefault(name, []).append(where)
    assert not missing, f"queried but not in lading.metrics: {missing}"


def test_a_renamed_metric_would_be_caught() -> None:
    assert "lading_jobs_claimed_totals" not in _exported_names()
    assert METRIC_NAME.findall('sum(rate(lading_jobs_claimed_totals{pool="a"}[5m]))') == ["lading_jobs_claimed_totals"]
