"""
Every chart value that shapes the worker Deployments reaches them: `helm template` renders the
operator's command line, `lading operator` parses it into its settings, and the operator renders a
pool's worker Deployment (and KEDA objects) from those settings: values -> args -> settings -> objects.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import kubernetes_validate
import pytest
from lading_cli import operator as operator_cli
from lading_operator import rendering, settings

from lading.models import specs
from tests.integration.chart import test_chart as chart

VALUES = chart.HERE / "values-workers.yaml"
UID = "00000000-0000-0000-0000-000000000001"


def _operator_settings(values: Any) -> settings.OperatorSettings:
    (deployment,) = [
        d for d in chart.objects(values, "Deployment")
        if d["metadata"]["labels"]["app.kubernetes.io/component"] == "operator"
    ]  # fmt: skip
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    parser = argparse.ArgumentParser(prog="lading operator", exit_on_error=False)
    operator_cli.add_arguments(parser)
    return operator_cli.settings_from(parser.parse_args(args[args.index("operator") + 1 :]))


def _pool(**spec: Any) -> specs.InferencePool:
    spec = {"provider": "vllm", "model": "Qwen/Qwen2.5-7B-Instruct", **spec}
    metadata = {"name": "qwen", "namespace": "lading-system"}
    return specs.InferencePool.model_validate({"metadata": metadata, "spec": spec})


@pytest.fixture(scope="module")
def worker() -> dict[str, Any]:
    config = _operator_settings(VALUES).render
    deployment = rendering.worker_deployment(_pool(), uid=UID, config=config, replicas=1)
    kubernetes_validate.validate(deployment, chart.KUBERNETES_VERSION, strict=True)
    return deployment


def test_pod_placement_pull_secrets_labels_and_annotations_reach_the_worker(worker: dict[str, Any]) -> None:
    pod = worker["spec"]["template"]
    assert pod["spec"]["imagePullSecrets"] == [{"name": "ghcr"}, {"name": "mirror"}]
    assert pod["spec"]["nodeSelector"] == {"kubernetes.io/os": "linux", "node-role/batch": "true"}
    assert pod["spec"]["tolerations"] == [{"key": "batch", "operator": "Exists", "effect": "NoSchedule"}]
    assert pod["metadata"]["labels"]["team"] == "finance-ml" and worker["metadata"]["labels"]["team"] == "finance-ml"
    assert pod["metadata"]["annotations"]["sidecar.istio.io/inject"] == "false"
    assert worker["metadata"]["annotations"] == {"sidecar.istio.io/inject": "false"}
    assert pod["metadata"]["annotations"]["prometheus.io/scrape"] == "true", "the operator's own stay"


def test_container_resources_env_volumes_and_document_roots_reach_the_worker(worker: dict[str, Any]) -> None:
    pod = worker["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["resources"] == {"limits": {"memory": "2Gi"}, "requests": {"cpu": "250m", "memory": "512Mi"}}
    env = {variable["name"]: variable for variable in container["env"]}
    assert env["LADING_EGRESS_ALLOW"]["value"] == "10.96.0.0/12,192.168.40.0/24"
    assert env["LADING_AMQP_URL"]["valueFrom"]["secretKeyRef"] == {"name": "lading-amqp", "key": "uri"}
    assert env["TZ"] == {"name": "TZ", "value": "Europe/Berlin"}
    assert env["LADING_LOG_LEVEL"]["value"] == "DEBUG"
    assert env["HTTPS_PROXY"]["valueFrom"]["secretKeyRef"] == {"name": "proxy", "key": "url"}
    assert {"name": "documents", "persistentVolumeClaim": {"claimName": "invoices", "readOnly": True}} in pod["volumes"]
    assert {"name": "documents", "mountPath": "/documents", "readOnly": True} in container["volumeMounts"]
    args = container["args"]
    assert args[args.index("--document-root") + 1] == "/documents"
    assert args[args.index("--processes") + 1] == "3"


def test_cleaner_and_retention_values_reach_the_worker_and_parse_as_lading_worker_flags(
    worker: dict[str, Any],
) -> None:
    args = worker["spec"]["template"]["spec"]["containers"][0]["args"]
    expected = {
        "--cleaner-interval": "120", "--cleaner-batch": "500", "--cleaner-max-batches": "20",
        "--retain-published-events-hours": "24", "--retain-inbox-hours": "48", "--retain-quarantine-hours": "72",
        "--retain-delivered-hours": "2160", "--retain-stale-completions-hours": "96", "--retain-limiter-hours": "2",
        "--retain-idempotency-keys-hours": "72", "--retain-gpu-intervals-hours": "4800",
    }  # fmt: skip
    assert set(expected) == set(rendering.WORKER_CLEANER_FLAGS), "every cleaner flag has a chart value"
    worker_flags = {f"--{a.dest.replace('_', '-')}" for a in _worker_parser()._actions}
    cleaner_flags = {f for f in worker_flags if f.startswith(("--retain-", "--cleaner-"))}
    assert cleaner_flags == set(rendering.WORKER_CLEANER_FLAGS), "the operator passes on every cleaner flag"
    assert {flag: args[args.index(flag) + 1] for flag in expected} == expected
    from lading_worker import main as worker_main  # the worker itself reads them back

    parser = argparse.ArgumentParser(prog="lading worker")
    worker_main.add_arguments(parser)
    cleaner = worker_main.cleaner_from(parser.parse_args(args[args.index("--pool") :]))
    assert (cleaner.interval_s, cleaner.batch_size, cleaner.max_batches) == (120, 500, 20)
    assert cleaner.inbox_s == 48 * 3600 and cleaner.delivered_s == 2160 * 3600 and cleaner.limiter_s == 2 * 3600
    assert cleaner.api_requests_s == 72 * 3600 and cleaner.gpu_intervals_s == 4800 * 3600


def _worker_parser() -> argparse.ArgumentParser:
    from lading_worker import main as worker_main

    parser = argparse.ArgumentParser(prog="lading worker")
    worker_main.add_arguments(parser)
    return parser


def test_keda_values_reach_the_trigger_authentication_and_scaled_object() -> None:
    config = _operator_settings(VALUES).render
    pool = _pool(workers={"scaling": "keda"})
    auth = rendering.keda_trigger_authentication(pool, uid=UID, config=config)
    assert auth["spec"]["secretTargetRef"] == [{"parameter": "connection", "name": "keda-pg", "key": "readonly"}]
    scaled = rendering.keda_scaled_object(pool, uid=UID, config=config)
    (prometheus,) = [t for t in scaled["spec"]["triggers"] if t["type"] == "prometheus"]
    assert prometheus["metadata"]["serverAddress"] == "http://prometheus.monitoring.svc:9090"


def test_defaults_render_the_worker_as_before() -> None:
    config = _operator_settings(None).render
    assert config == rendering.OperatorConfig(worker_image=config.worker_image)
    deployment = rendering.worker_deployment(_pool(), uid=UID, config=config, replicas=1)
    pod = deployment["spec"]["template"]["spec"]
    assert not {"imagePullSecrets", "nodeSelector", "tolerations"} & set(pod)
    assert "annotations" not in deployment["metadata"]
    args = pod["containers"][0]["args"]
    assert args[args.index("--processes") + 1] == "1", "the default pod (100m CPU, no CPU limit) runs one process"
    env = {variable["name"]: variable for variable in pod["containers"][0]["env"]}
    assert env["LADING_LOG_LEVEL"]["value"] == "INFO"


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("workers.egressAllow={erp.example}", "/workers/egressAllow/0"),
        ("workers.retentionHours.inbox=12", "/workers/retentionHours/inbox"),
        ("workers.documentRoots={documents}", "/workers/documentRoots/0"),
        ("keda.prometheusUrl=prometheus:9090", "/keda/prometheusUrl"),
        ("workers.processes=0", "/workers/processes"),
        ("workers.logLevel=verbose", "/workers/logLevel"),
    ],
)
def test_values_schema_rejects_bad_worker_values(override: str, expected: str) -> None:
    result = chart.run_helm("template", "lading", str(chart.CHART), "--set", override)
    assert result.returncode != 0 and expected in result.stderr, result.stderr


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--worker-env", '[{"name": "DATABASE_URL", "value": "x"}]'], "set by the operator"),
        (["--worker-volume-mounts", '[{"name": "nowhere", "mountPath": "/x"}]'], "needs a mountPath"),
        (["--worker-volumes", '[{"name": "tmp", "emptyDir": {}}]'], "is taken"),
        (["--worker-egress-allow", "erp.example"], "is not a CIDR"),
        (["--worker-retain-inbox-hours", "0"], "a positive number"),
        (["--worker-env", '[{"name": "LADING_LOG_LEVEL", "value": "DEBUG"}]'], "set by the operator"),
    ],
)
def test_bad_worker_flags_are_refused_by_name(flags: list[str], message: str) -> None:
    parser = argparse.ArgumentParser(prog="lading operator")
    operator_cli.add_arguments(parser)
    with pytest.raises(ValueError, match=message):
        operator_cli.settings_from(parser.parse_args(["--database-url", "x", *flags]))


def test_worker_json_flags_must_be_json_lists_of_objects() -> None:
    parser = argparse.ArgumentParser(prog="lading operator", exit_on_error=False)
    operator_cli.add_arguments(parser)
    with pytest.raises(argparse.ArgumentError, match="--worker-env must be JSON"):
        parser.parse_args(["--worker-env", "TZ=UTC"])
    with pytest.raises(argparse.ArgumentError, match="a JSON list of objects"):
        parser.parse_args(["--worker-tolerations", json.dumps(["batch"])])
