"""
README.md's cluster path, followed as written: its commands are read from the README, the chart is
rendered by `helm template` with the README's values, the README's Secrets and example objects are
applied to the emulator in the README's order with the real operator running, and a real `lading
worker` process, started with the command line and environment of the worker Deployment the
operator rendered, runs the batch to `Delivered`.

Where the emulator has no cluster, the test stands in, and says so: the Secrets' values are the
test database's; the endpoint's in-cluster URL (the chart's receiver Service) is checked against the
rendered Service, then pointed at a local receiver, which the workers may reach because loopback is
added to the rendered egress allow-list; the projected signing-secret volume is written to a
directory from the Secrets it projects.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import ipaddress
import pathlib
import re
import shlex
import sys
import urllib.parse
from typing import Any

import asyncpg
import pytest
import yaml
from lading_cli import operator as operator_cli
from lading_operator import kube

from tests.integration.chart import test_chart as chart
from tests.integration.operator import test_operator_process as operator_process
from tests.support import erp_stub, kube_emulator, processes

README = chart.REPO / "README.md"
BATCHES = "lading.dev/v1alpha1/extractionbatches"
DEPLOYMENTS = "apps/v1/deployments"
PLURALS = {"Secret": "secrets", "TenantQuota": "tenantquotas", "InferencePool": "inferencepools",
           "DeliveryEndpoint": "deliveryendpoints", "ExtractionBatch": "extractionbatches"}  # fmt: skip
KIND_ORDER = ["TenantQuota", "InferencePool", "DeliveryEndpoint", "ExtractionBatch"]


def readme_commands() -> list[list[str]]:
    """The commands of the README's Kubernetes section (the console block with `helm install`)."""
    section = README.read_text().split("## Kubernetes", 1)[1].split("\n## ", 1)[0]
    (block,) = [b for b in re.findall(r"```console\n(.*?)```", section, re.S) if "helm install" in b]
    lines = block.replace("\\\n", " ").splitlines()
    return [shlex.split(line) for line in lines if line.strip() and not line.lstrip().startswith("#")]


def _option(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def test_the_readme_creates_namespaces_first_builds_and_loads_the_image_and_applies_in_order() -> None:
    commands = readme_commands()
    verbs = [" ".join(c[:3]) for c in commands]
    namespaces = [c[3] for c in commands if c[:3] == ["kubectl", "create", "namespace"]]
    assert {"lading-system", "acme"} <= set(namespaces)
    last_namespace = max(i for i, v in enumerate(verbs) if v == "kubectl create namespace")
    assert all(i > last_namespace for i, v in enumerate(verbs) if v in ("kubectl create secret", "helm install lading"))

    (build,) = [c for c in commands if c[:2] == ["docker", "build"]]
    (load,) = [c for c in commands if c[:3] == ["kind", "load", "docker-image"]]
    (install,) = [c for c in commands if c[:2] == ["helm", "install"]]
    assert verbs.index(" ".join(build[:3])) < verbs.index(" ".join(load[:3])) < verbs.index("helm install lading")
    image = _option(build, "-t")
    assert load[3] == image
    operator = _deployment(_render(install), "operator")
    assert operator["spec"]["template"]["spec"]["containers"][0]["image"] == image, "the chart runs the built image"

    kinds = [document["kind"] for path in _applied(commands) for document in _documents(path)]
    lading_kinds = [kind for kind in kinds if kind in KIND_ORDER]
    assert lading_kinds == sorted(lading_kinds, key=KIND_ORDER.index) and set(lading_kinds) == set(KIND_ORDER)
    (wait,) = [c for c in commands if c[:2] == ["kubectl", "wait"]]
    assert "--for=condition=Delivered" in wait


def test_the_endpoint_reaches_the_charts_receiver_through_the_egress_allow_list() -> None:
    commands = readme_commands()
    (install,) = [c for c in commands if c[:2] == ["helm", "install"]]
    rendered = _render(install)
    endpoint, signing = _endpoint_and_secret(commands)
    url = urllib.parse.urlsplit(endpoint["spec"]["url"])
    service_name, service_namespace, _ = (url.hostname or "").split(".", 2)
    (service,) = [d for d in rendered if d["kind"] == "Service" and d["metadata"]["name"] == service_name]
    assert service["metadata"]["namespace"] == service_namespace and service["spec"]["ports"][0]["port"] == (
        url.port or 80
    )
    receiver = _deployment(rendered, "receiver")["spec"]["template"]["spec"]["containers"][0]
    secrets_ref = next(e for e in receiver["env"] if e["name"] == "LADING_RECEIVER_SECRETS")["valueFrom"]
    created = _created_secrets(commands)
    ref = secrets_ref["secretKeyRef"]
    assert created[(service_namespace, ref["name"])][ref["key"]] == signing, "receiver and endpoint share the secret"

    settings = _operator_settings(rendered)
    allowed = [ipaddress.ip_network(cidr) for cidr in settings.render.egress_allow]
    assert allowed and all(network.is_private for network in allowed), "the Service range, a private one"


@pytest.mark.slow
async def test_the_readme_path_runs_the_example_batch_to_delivered(
    emulator: kube_emulator.KubeEmulator,
    api: kube.Client,
    db: asyncpg.Connection,
    operator_factory: Any,
    database_url: str,
    tmp_path: pathlib.Path,
    unused_tcp_port: int,
) -> None:
    commands = readme_commands()
    (install,) = [c for c in commands if c[:2] == ["helm", "install"]]
    chart_settings = _operator_settings(_render(install))  # what the chart's operator renders workers with
    with operator_factory(render=chart_settings.render, pool_namespaces=chart_settings.pool_namespaces) as handle:
        await asyncio.get_running_loop().run_in_executor(None, handle.ready.wait, 30)
        await _follow_the_readme(emulator, api, commands, database_url, tmp_path, unused_tcp_port)


async def _follow_the_readme(
    emulator: kube_emulator.KubeEmulator,
    api: kube.Client,
    commands: list[list[str]],
    database_url: str,
    tmp_path: pathlib.Path,
    port: int,
) -> None:
    for (namespace, name), data in _created_secrets(commands).items():
        values = {key: (database_url if key == "url" else value) for key, value in data.items()}
        await api.create(kube.path("v1", "secrets", namespace=namespace), {
            "apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": namespace},
            "data": {key: base64.b64encode(value.encode()).decode() for key, value in values.items()},
        })  # fmt: skip
    async with erp_stub.running() as erp:
        for path in _applied(commands):
            for document in _documents(path):
                if document["kind"] == "DeliveryEndpoint":
                    document["spec"]["url"] = erp.webhook_url  # the receiver Service, here on loopback
                await _apply(api, document)
        batch = next(d for p in _applied(commands) for d in _documents(p) if d["kind"] == "ExtractionBatch")
        name, namespace = batch["metadata"]["name"], batch["metadata"]["namespace"]
        pool = batch["spec"]["inferencePoolRef"]
        deployment = await kube_emulator.wait_for(
            emulator, DEPLOYMENTS, pool["namespace"], f"{pool['name']}-worker", _projects_secrets
        )
        worker = await _start_rendered_worker(emulator, deployment, database_url, tmp_path, port=port)
        try:
            done = await kube_emulator.wait_for(
                emulator, BATCHES, namespace, name, lambda o: _condition(o, "Delivered") == "True", timeout_s=60
            )
        finally:
            worker.terminate()
            assert await asyncio.wait_for(worker.wait(), 30) == 0, (tmp_path / "worker.log").read_text()[-3000:]
    documents = len(batch["spec"]["documents"])
    assert done["status"]["succeeded"] == done["status"]["delivered"] == documents
    assert len({request.headers["webhook-id"] for request in erp.requests}) == documents


# --- Helpers.


def _render(install: list[str]) -> list[dict[str, Any]]:
    release, chart_path = install[2], install[3]
    args = ["template", release, str(chart.REPO / chart_path), "--namespace", _option(install, "-n")]
    args += [arg for i, arg in enumerate(install) if arg == "--set" or (i and install[i - 1] == "--set")]
    result = chart.run_helm(*args)
    assert result.returncode == 0, result.stderr
    return [document for document in yaml.safe_load_all(result.stdout) if document]


def _deployment(rendered: list[dict[str, Any]], component: str) -> dict[str, Any]:
    return next(
        d for d in rendered
        if d["kind"] == "Deployment" and d["metadata"]["labels"].get("app.kubernetes.io/component") == component
    )  # fmt: skip


def _operator_settings(rendered: list[dict[str, Any]]) -> Any:
    args = _deployment(rendered, "operator")["spec"]["template"]["spec"]["containers"][0]["args"]
    parser = argparse.ArgumentParser(prog="lading operator")
    operator_cli.add_arguments(parser)
    return operator_cli.settings_from(parser.parse_args(args[args.index("operator") + 1 :]))


def _applied(commands: list[list[str]]) -> list[pathlib.Path]:
    return [chart.REPO / _option(c, "-f") for c in commands if c[:2] == ["kubectl", "apply"]]


def _documents(path: pathlib.Path) -> list[dict[str, Any]]:
    return [document for document in yaml.safe_load_all(path.read_text()) if document]


def _created_secrets(commands: list[list[str]]) -> dict[tuple[str, str], dict[str, str]]:
    created = {}
    for command in commands:
        if command[:4] == ["kubectl", "create", "secret", "generic"]:
            literals = [arg.removeprefix("--from-literal=") for arg in command if arg.startswith("--from-literal=")]
            created[(_option(command, "-n"), command[4])] = dict(item.split("=", 1) for item in literals)
    return created


def _endpoint_and_secret(commands: list[list[str]]) -> tuple[dict[str, Any], str]:
    documents = [d for path in _applied(commands) for d in _documents(path)]
    endpoint = next(d for d in documents if d["kind"] == "DeliveryEndpoint")
    ref = endpoint["spec"]["secretRef"]
    secret = next(d for d in documents if d["kind"] == "Secret" and d["metadata"]["name"] == ref["name"])
    return endpoint, secret["stringData"][ref["key"]]


async def _apply(api: kube.Client, document: dict[str, Any]) -> None:
    group_version = document["apiVersion"]
    plural = PLURALS[document["kind"]]
    if document["kind"] == "Secret" and "stringData" in document:
        data = {k: base64.b64encode(v.encode()).decode() for k, v in document.pop("stringData").items()}
        document = {**document, "data": data}
    await api.create(kube.path(group_version, plural, namespace=document["metadata"].get("namespace")), document)


def _condition(obj: dict[str, Any], type_: str) -> str | None:
    found = [c["status"] for c in obj.get("status", {}).get("conditions", []) if c["type"] == type_]
    return found[0] if found else None


def _projects_secrets(deployment: dict[str, Any]) -> bool:
    return any(v["name"] == "endpoint-secrets" for v in deployment["spec"]["template"]["spec"]["volumes"])


async def _start_rendered_worker(
    emulator: kube_emulator.KubeEmulator,
    deployment: dict[str, Any],
    database_url: str,
    tmp_path: pathlib.Path,
    *,
    port: int,
) -> asyncio.subprocess.Process:
    """`lading worker` with the rendered container's arguments and environment, as the pod would run."""
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    namespace = deployment["metadata"]["namespace"]
    env: dict[str, str] = {}
    for variable in container["env"]:
        if "value" in variable:
            env[variable["name"]] = variable["value"]
        else:
            ref = variable["valueFrom"]["secretKeyRef"]
            secret = emulator.stored("v1/secrets", namespace, ref["name"])
            assert secret is not None, f"the worker needs Secret {namespace}/{ref['name']}"
            env[variable["name"]] = base64.b64decode(secret["data"][ref["key"]]).decode()
    assert env["DATABASE_URL"] == database_url
    env["LADING_EGRESS_ALLOW"] += ",127.0.0.0/8"  # the local receiver standing in for the Service
    secrets_dir = tmp_path / "endpoint-secrets"
    secrets_dir.mkdir()
    (volume,) = [v for v in pod["volumes"] if v["name"] == "endpoint-secrets"]
    for source in volume["projected"]["sources"]:
        stored = emulator.stored("v1/secrets", namespace, source["secret"]["name"])
        assert stored is not None
        for item in source["secret"]["items"]:
            (secrets_dir / item["path"]).write_bytes(base64.b64decode(stored["data"][item["key"]]))
    env["LADING_ENDPOINT_SECRETS_DIR"] = str(secrets_dir)
    args = list(container["args"])
    args[args.index("--http") + 1] = f"127.0.0.1:{port}"
    log = (tmp_path / "worker.log").open("ab")
    try:
        return await asyncio.create_subprocess_exec(
            sys.executable, "-c", operator_process.LAUNCH, *args,
            env=processes.environment(**env), stdout=log, stderr=log,
        )  # fmt: skip
    finally:
        log.close()

