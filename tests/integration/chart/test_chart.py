"""
The Helm chart, rendered by a real `helm` binary: it lints and renders with default and
non-default values, every object validates against Kubernetes' own schemas, RBAC is least
privilege, its CRDs are the generated ones, and values.schema.json rejects bad values.
"""

from __future__ import annotations

import functools
import json
import os
import pathlib
import shutil
import subprocess
from collections.abc import Iterator
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.support import crd_schema

REPO = crd_schema.REPO
CHART = REPO / "charts" / "lading"
HERE = pathlib.Path(__file__).resolve().parent
NON_DEFAULT = HERE / "values-nondefault.yaml"
BAD = HERE / "values-bad.yaml"
KUBERNETES_VERSION = kubernetes_validate.latest_version()
MONITORING_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}


@functools.cache
def helm() -> str:
    candidate = os.environ.get("LADING_HELM") or str(REPO / ".venv" / "tools" / "helm")
    if not (pathlib.Path(candidate).is_file() and os.access(candidate, os.X_OK)):
        found = shutil.which("helm")
        if found is None:
            pytest.fail(
                f"no helm binary at {candidate} ($LADING_HELM or .venv/tools/helm) nor on PATH; "
                "`make test` installs it (hack/install_helm.py)"
            )
        candidate = found
    return candidate


def run_helm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm(), *args], capture_output=True, text=True, timeout=60, check=False)


@functools.cache
def rendered(values: pathlib.Path | None) -> tuple[dict[str, Any], ...]:
    args = ["template", "lading", str(CHART), "--namespace", "lading-system", "--include-crds"]
    if values is not None:
        args += ["--values", str(values)]
    result = run_helm(*args)
    assert result.returncode == 0, result.stderr
    return tuple(document for document in yaml.safe_load_all(result.stdout) if document)


def objects(values: pathlib.Path | None, kind: str | None = None) -> Iterator[dict[str, Any]]:
    for document in rendered(values):
        if kind is None or document["kind"] == kind:
            yield document


VALUES = [None, NON_DEFAULT]
VALUE_IDS = ["default", "non-default"]


@pytest.mark.parametrize("values", VALUES, ids=VALUE_IDS)
def test_helm_lint(values: pathlib.Path | None) -> None:
    args = ["lint", str(CHART), "--strict"] + (["--values", str(values)] if values else [])
    result = run_helm(*args)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("values", VALUES, ids=VALUE_IDS)
def test_every_rendered_object_validates_against_kubernetes_schemas(values: pathlib.Path | None) -> None:
    kinds = []
    for document in objects(values):
        kinds.append(document["kind"])
        if document["kind"] in MONITORING_KINDS:
            _check_monitoring_shape(document)
            continue
        if document["kind"] == "ClusterKopfPeering":  # kopf's kind: its CRD declares no fields but status
            assert document["apiVersion"] == "kopf.dev/v1" and set(document) == {"apiVersion", "kind", "metadata"}
            continue
        try:
            kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{document['kind']} {document['metadata'].get('name')}: {exc.message}")
    assert {"Deployment", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition"} <= set(
        kinds
    )


def _check_monitoring_shape(document: dict[str, Any]) -> None:
    """monitoring.coreos.com kinds are not in kubernetes-validate: check the fields Prometheus operator needs."""
    assert document["apiVersion"] == "monitoring.coreos.com/v1"
    assert set(document) == {"apiVersion", "kind", "metadata", "spec"}
    assert document["metadata"]["name"] and document["metadata"]["namespace"]
    spec = document["spec"]
    if document["kind"] == "PrometheusRule":
        assert spec["groups"]
        for group in spec["groups"]:
            assert set(group) == {"name", "rules"}
            for rule in group["rules"]:
                assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}
                assert rule["alert"][0].isupper() and rule["expr"].strip()
                assert rule["labels"]["severity"] in ("warning", "critical")
                assert rule["annotations"]["summary"] and rule["annotations"]["description"]
    else:
        endpoints_key = "endpoints" if document["kind"] == "ServiceMonitor" else "podMetricsEndpoints"
        assert set(spec) == {"selector", "namespaceSelector", endpoints_key}
        assert spec["selector"]["matchLabels"]
        for endpoint in spec[endpoints_key]:
            assert endpoint["port"] == "http" and endpoint["path"] == "/metrics"


@pytest.mark.parametrize("values", VALUES, ids=VALUE_IDS)
def test_chart_crds_are_the_generated_ones(values: pathlib.Path | None) -> None:
    ours = {crd["metadata"]["name"]: crd for crd in crd_schema.load_crds().values()}
    crds = list(objects(values, "CustomResourceDefinition"))
    chart = {crd["metadata"]["name"]: crd for crd in crds if crd["spec"]["group"] == "lading.dev"}
    assert chart == ours, "charts/lading/crds/ differs from crds/: run `make crds`"
    others = {crd["metadata"]["name"] for crd in crds} - set(chart)
    assert others == {"clusterkopfpeerings.kopf.dev"}, "besides Lading's own, only kopf's peering kind"


@pytest.mark.parametrize("values", VALUES, ids=VALUE_IDS)
def test_rbac_is_least_privilege(values: pathlib.Path | None) -> None:
    for document in objects(values):
        if document["kind"] not in ("ClusterRole", "Role"):
            continue
        for rule in document["rules"]:
            for field in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule[field], f"{document['metadata']['name']}: wildcard {field}"
            assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"])
            if "secrets" in rule["resources"] or "customresourcedefinitions" in rule["resources"]:
                assert "deletecollection" not in rule["verbs"]
            if "customresourcedefinitions" in rule["resources"]:
                assert set(rule["verbs"]) == {"get", "list", "watch"}, "the operator never changes CRDs"


def _rules(values: pathlib.Path | None, kind: str) -> list[tuple[str, str, str]]:
    return [
        (group, resource, verb)
        for document in objects(values, kind)
        for rule in document["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    ]


def test_default_rbac_is_cluster_wide_and_namespaced_rbac_follows_watch_namespaces() -> None:
    cluster = _rules(None, "ClusterRole")
    assert ("lading.dev", "extractionbatches/status", "patch") in cluster
    assert ("lading.dev", "tenantquotas", "watch") in cluster
    assert ("apps", "deployments", "create") in cluster and ("", "secrets", "get") in cluster
    assert not any(group == "keda.sh" for group, _, _ in cluster), "KEDA rights only when asked for"
    assert not list(objects(None, "Role"))

    cluster = _rules(NON_DEFAULT, "ClusterRole")
    assert not any(resource in ("deployments", "secrets", "services") for _, resource, _ in cluster)
    roles = list(objects(NON_DEFAULT, "Role"))
    assert sorted(role["metadata"]["namespace"] for role in roles) == ["acme", "lading-system"]
    namespaced = _rules(NON_DEFAULT, "Role")
    assert ("keda.sh", "scaledobjects", "create") in namespaced
    assert ("", "secrets", "watch") in namespaced
    bindings = list(objects(NON_DEFAULT, "RoleBinding"))
    assert {binding["subjects"][0]["namespace"] for binding in bindings} == {"lading-system"}


def _deployment(values: pathlib.Path | None, component: str) -> dict[str, Any]:
    for document in objects(values, "Deployment"):
        if document["metadata"]["labels"]["app.kubernetes.io/component"] == component:
            return document
    raise AssertionError(f"no {component} Deployment")


@pytest.mark.parametrize("values", VALUES, ids=VALUE_IDS)
def test_operator_deployment(values: pathlib.Path | None) -> None:
    deployment = _deployment(values, "operator")
    assert deployment["spec"]["replicas"] == 2 and deployment["spec"]["strategy"]["type"] == "RollingUpdate"
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    args = container["args"]
    assert args[2:9] == ["operator", "--http", "0.0.0.0:8080", "--peering", "--peering-name", "lading",
                         "--peering-lifetime"]  # fmt: skip
    assert args[args.index("--db-secret") + 1] == "lading-database:url"
    assert args[args.index("--worker-image") + 1] == container["image"], "workers run the operator's image"
    env = {variable["name"]: variable for variable in container["env"]}
    assert env["DATABASE_URL"]["valueFrom"]["secretKeyRef"] == {"name": "lading-database", "key": "url"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert container["ports"] == [{"name": "http", "containerPort": 8080, "protocol": "TCP"}]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert "initContainers" not in pod, "the operator never migrates: the hook Job does"
    (job,) = [job for job in objects(values, "Job") if job["metadata"]["name"].endswith("-migrate")]
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    (migrate,) = job["spec"]["template"]["spec"]["containers"]
    assert migrate["args"][-1] == "migrate" and migrate["image"] == container["image"]
    assert job["spec"]["template"]["spec"]["automountServiceAccountToken"] is False
    tag = "0.1.0-rc1" if values else yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    assert container["image"] == f"ghcr.io/lading-dev/lading:{tag}"
    services = {service["metadata"]["name"]: service for service in objects(values, "Service")}
    metrics = next(service for name, service in services.items() if name.endswith("-metrics"))
    assert metrics["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]


def test_the_migration_job_applies_the_receivers_migrations_when_the_chart_deploys_it() -> None:
    (job,) = objects(NON_DEFAULT, "Job")
    (first,) = job["spec"]["template"]["spec"]["initContainers"]
    assert first["args"][-2:] == ["migrate", "--receiver"]
    env = {variable["name"]: variable for variable in first["env"]}
    receiver = _deployment(NON_DEFAULT, "receiver")["spec"]["template"]["spec"]["containers"][0]
    receiver_env = {variable["name"]: variable for variable in receiver["env"]}
    assert env["LADING_RECEIVER_DATABASE_URL"] == receiver_env["LADING_RECEIVER_DATABASE_URL"]
    (default_job,) = [job for job in objects(None, "Job") if job["metadata"]["name"].endswith("-migrate")]
    assert "initContainers" not in default_job["spec"]["template"]["spec"], "no receiver, nothing of its to migrate"


def test_non_default_parts() -> None:
    operator = _deployment(NON_DEFAULT, "operator")["spec"]["template"]["spec"]["containers"][0]
    assert operator["args"].count("--namespace") == 2
    env = {variable["name"]: variable for variable in operator["env"]}
    assert env["LADING_AMQP_URL"]["valueFrom"]["secretKeyRef"] == {"name": "lading-amqp", "key": "url"}
    receiver = _deployment(NON_DEFAULT, "receiver")["spec"]["template"]["spec"]
    assert receiver["automountServiceAccountToken"] is False
    assert receiver["containers"][0]["args"][:5] == ["receiver", "--host", "0.0.0.0", "--port", "8080"]
    relay = _deployment(NON_DEFAULT, "relay")["spec"]["template"]["spec"]["containers"][0]
    assert relay["args"][2:] == ["relay", "--http", "0.0.0.0:8080"]
    assert relay["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    hooks = [s for s in objects(NON_DEFAULT, "Secret") if "helm.sh/hook" in s["metadata"].get("annotations", {})]
    secrets = [s for s in objects(NON_DEFAULT, "Secret") if s not in hooks]
    assert sorted(secret["metadata"]["namespace"] for secret in secrets) == ["acme", "lading-system"]
    # The release's Secret does not exist yet when the pre-install migration Job runs: it has its own.
    (hook_secret,) = hooks
    assert hook_secret["metadata"]["annotations"]["helm.sh/hook-weight"] == "-10"
    assert hook_secret["stringData"] == {"url": "postgresql://lading:pw@pg:5432/lading"}
    (job,) = objects(NON_DEFAULT, "Job")
    (migrate,) = job["spec"]["template"]["spec"]["containers"]
    env = {variable["name"]: variable for variable in migrate["env"]}
    assert env["DATABASE_URL"]["valueFrom"]["secretKeyRef"]["name"] == hook_secret["metadata"]["name"]
    (dashboard,) = objects(NON_DEFAULT, "ConfigMap")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert dashboard["metadata"]["namespace"] == "monitoring"
    shipped = json.loads((CHART / "files" / "dashboards" / "lading.json").read_text())
    assert json.loads(dashboard["data"]["lading.json"]) == shipped
    (rule,) = objects(NON_DEFAULT, "PrometheusRule")
    alerts = {alert["alert"] for group in rule["spec"]["groups"] for alert in group["rules"]}
    assert {
        "LadingOldestEligibleAgeHigh",
        "LadingOutboxStuck",
        "LadingDeliveryUnknownExternal",
        "LadingReviewQueueAgeing",
        "LadingDeliveryFailing",
        "LadingWorkerLeasesLostSpiking",
        "LadingPoolCoolingDown",
        "LadingTenantBudgetExhausted",
    } <= alerts
    assert {"ServiceMonitor", "PodMonitor"} <= {document["kind"] for document in objects(NON_DEFAULT)}


def test_optional_parts_are_off_by_default() -> None:
    kinds = {document["kind"] for document in objects(None)}
    assert not kinds & (MONITORING_KINDS | {"ConfigMap", "Secret"})
    components = {
        document["metadata"]["labels"]["app.kubernetes.io/component"] for document in objects(None, "Deployment")
    }
    assert components == {"operator"}


def test_values_schema_rejects_bad_values() -> None:
    lint = run_helm("lint", str(CHART), "--values", str(BAD))
    assert lint.returncode != 0
    output = lint.stdout + lint.stderr
    assert "/operator/logLevel" in output and "watchNamespace" in output and "/database/extraNamespaces/0" in output
    template = run_helm("template", "lading", str(CHART), "--values", str(BAD))
    assert template.returncode != 0 and "/operator/logLevel" in template.stderr


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("relay.enabled=true", "/amqp/secretName"),
        ("receiver.enabled=true", "/receiver/database/secretName"),
        ("database.create=true", "/database"),
        ("image.tag=latest", "/image/tag"),
        ("metrics.port=0", "/metrics/port"),
    ],
)
def test_values_schema_rejects_incomplete_combinations(override: str, expected: str) -> None:
    result = run_helm("template", "lading", str(CHART), "--set", override)
    assert result.returncode != 0 and expected in result.stderr, result.stderr


@pytest.mark.parametrize("values", VALUES, ids=VALUE_IDS)
def test_every_container_command_line_parses_with_the_lading_cli(values: pathlib.Path | None) -> None:
    """A flag renamed in the CLI must not leave the chart starting a process that exits at once."""
    from lading_cli import main as cli

    parser = cli.build_parser()
    for deployment in objects(values, "Deployment"):
        pod = deployment["spec"]["template"]["spec"]
        for container in pod.get("initContainers", []) + pod["containers"]:
            try:
                parser.parse_args(container["args"])
            except SystemExit:
                command = " ".join(container["args"])
                pytest.fail(f"{deployment['metadata']['name']}/{container['name']}: `lading {command}` does not parse")


def _operator_args(*extra: str) -> list[str]:
    result = run_helm("template", "lading", str(CHART), *extra)
    assert result.returncode == 0, result.stderr
    for document in yaml.safe_load_all(result.stdout):
        if document and document["kind"] == "Deployment" and document["metadata"]["name"].endswith("-operator"):
            return list(document["spec"]["template"]["spec"]["containers"][0]["args"])
    raise AssertionError("no operator Deployment")


def test_pools_are_served_only_in_the_release_namespace_unless_pool_namespaces_are_given() -> None:
    from lading_cli import main as cli

    args = _operator_args("--namespace", "platform")
    assert args[args.index("--pool-namespaces") + 1] == "platform"
    args = _operator_args("--namespace", "platform", "--set", "operator.poolNamespaces={lading-system,gpu}")
    assert args[args.index("--pool-namespaces") + 1] == "lading-system,gpu"
    assert cli.build_parser().parse_args(args).pool_namespaces == ("lading-system", "gpu")
    refused = run_helm("template", "lading", str(CHART), "--set", "operator.poolNamespaces={Tenant_A}")
    assert refused.returncode != 0 and "/operator/poolNamespaces/0" in refused.stderr


@pytest.mark.parametrize("values", VALUES, ids=VALUE_IDS)
def test_the_operator_may_finalize_tenant_quotas(values: pathlib.Path | None) -> None:
    """Deleting a TenantQuota waits for the operator to revoke it (a finalizer on the object)."""
    cluster = _rules(values, "ClusterRole")
    assert ("lading.dev", "tenantquotas", "patch") in cluster
    assert ("lading.dev", "tenantquotas/finalizers", "update") in cluster


def test_manifest_downloads_are_bounded_by_a_value() -> None:
    from lading_cli import main as cli

    args = _operator_args()
    assert args[args.index("--max-concurrent-manifests") + 1] == "4"
    args = _operator_args("--set", "operator.maxConcurrentManifests=9")
    assert cli.build_parser().parse_args(args).max_concurrent_manifests == 9
    refused = run_helm("template", "lading", str(CHART), "--set", "operator.maxConcurrentManifests=0")
    assert refused.returncode != 0 and "maxConcurrentManifests" in refused.stderr


def test_two_operator_replicas_peer_through_the_charts_cluster_peering_and_a_disruption_budget() -> None:
    deployment = _deployment(None, "operator")
    (peering,) = objects(None, "ClusterKopfPeering")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--peering-name") + 1] == peering["metadata"]["name"] == "lading"
    env = {variable["name"]: variable for variable in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["POD_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name", "kopf names each replica by pod"
    (budget,) = objects(None, "PodDisruptionBudget")
    assert budget["spec"]["minAvailable"] == 1
    assert budget["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    assert ("kopf.dev", "clusterkopfpeerings", "patch") in _rules(None, "ClusterRole")

    single = run_helm("template", "lading", str(CHART), "--set", "operator.replicas=1")
    assert single.returncode == 0, single.stderr
    documents = [document for document in yaml.safe_load_all(single.stdout) if document]
    kinds = {document["kind"] for document in documents}
    assert not kinds & {"ClusterKopfPeering", "PodDisruptionBudget"}
    (operator,) = [d for d in documents if d["kind"] == "Deployment" and d["metadata"]["name"].endswith("-operator")]
    assert operator["spec"]["strategy"] == {"type": "Recreate"}
    assert "--standalone" in operator["spec"]["template"]["spec"]["containers"][0]["args"]
    rules = [rule for d in documents if d["kind"] == "ClusterRole" for rule in d["rules"]]
    assert not any("kopf.dev" in rule["apiGroups"] for rule in rules), "peering rights only with peering"


def test_an_image_given_by_digest_renders_as_repository_at_digest() -> None:
    digest = "sha256:" + "ab" * 32
    args = _operator_args("--set", f"image.tag={digest}")
    assert args[args.index("--worker-image") + 1] == f"ghcr.io/lading-dev/lading@{digest}"


def test_the_pod_monitor_scrapes_vllm_pods_besides_workers_and_the_relay() -> None:
    (monitor,) = objects(NON_DEFAULT, "PodMonitor")
    (expression,) = monitor["spec"]["selector"]["matchExpressions"]
    assert expression["key"] == "app.kubernetes.io/component" and set(expression["values"]) == {
        "worker", "relay", "vllm"
    }  # fmt: skip
    # The operator labels and names the vLLM pods' port so: the PodMonitor's endpoint finds it.
    from lading_operator import rendering

    from lading.models import specs

    pool = specs.InferencePool.model_validate({"metadata": {"name": "q", "namespace": "lading-system"},
                                               "spec": {"provider": "vllm", "model": "m"}})  # fmt: skip
    pod = rendering.vllm_deployment(pool, uid="u")["spec"]["template"]
    assert pod["metadata"]["labels"]["app.kubernetes.io/component"] == "vllm"
    assert pod["metadata"]["labels"]["app.kubernetes.io/name"] == monitor["spec"]["selector"]["matchLabels"][
        "app.kubernetes.io/name"
    ]
    assert pod["spec"]["containers"][0]["ports"][0]["name"] == monitor["spec"]["podMetricsEndpoints"][0]["port"]
