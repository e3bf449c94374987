"""
The chart's HTTP intake (`api:` values): off by default; on, a Deployment whose readiness is the
database's (`/readyz`), a Service, and the optional Ingress and HorizontalPodAutoscaler, each valid
against Kubernetes' own schemas.
"""

from __future__ import annotations

import kubernetes_validate

from tests.integration.chart.test_chart import HERE, KUBERNETES_VERSION, objects, run_helm

API_VALUES = HERE / "values-api.yaml"


def _api_objects(values: object) -> dict[str, dict[str, object]]:
    return {
        d["kind"]: d for d in objects(values)  # type: ignore[arg-type]
        if d.get("metadata", {}).get("labels", {}).get("app.kubernetes.io/component") == "api"
    }


def test_the_intake_is_off_by_default() -> None:
    assert _api_objects(None) == {}


def test_the_intake_renders_valid_objects_ready_on_the_database() -> None:
    found = _api_objects(API_VALUES)
    assert set(found) == {"Deployment", "Service", "Ingress", "HorizontalPodAutoscaler", "ServiceAccount",
                          "ClusterRole", "ClusterRoleBinding"}
    for document in found.values():
        kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)
    deployment = found["Deployment"]
    assert "replicas" not in deployment["spec"], "the HPA owns the replica count"  # type: ignore[operator]
    container = deployment["spec"]["template"]["spec"]["containers"][0]  # type: ignore[index]
    assert container["args"][2:5] == ["api", "--host", "0.0.0.0"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert any(e["name"] == "DATABASE_URL" for e in container["env"])
    assert "--kubernetes-auth" in container["args"]
    pod = deployment["spec"]["template"]["spec"]  # type: ignore[index]
    assert pod["serviceAccountName"] == found["ServiceAccount"]["metadata"]["name"]  # type: ignore[index]
    # The reviews, and nothing else: who a token is, and whether it may create ExtractionBatches.
    assert found["ClusterRole"]["rules"] == [  # type: ignore[index]
        {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]},
        {"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"], "verbs": ["create"]},
    ]
    hpa = found["HorizontalPodAutoscaler"]
    assert hpa["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]  # type: ignore[index]


def test_an_ingress_without_a_host_is_refused() -> None:
    result = run_helm("template", "lading", str(HERE.parents[2] / "charts" / "lading"),
                      "--set", "api.enabled=true", "--set", "api.ingress.enabled=true")
    assert result.returncode != 0 and "api.ingress.host" in result.stderr
