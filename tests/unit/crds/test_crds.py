"""
The generated CRDs: up to date with the models, valid apiextensions.k8s.io/v1 objects, structural,
with the names, columns and list semantics users rely on.
"""

from __future__ import annotations

import pathlib
import re
from collections.abc import Iterator, Mapping
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
from lading_cli import main as cli
from lading_operator import crds, status

from lading.models import specs
from tests.support import crd_schema

REPO = crd_schema.REPO
CHART_CRD_DIR = REPO / "charts" / "lading" / "crds"

BUILTIN_SHORT_NAMES = frozenset(
    {
        "cm",
        "cs",
        "ds",
        "ep",
        "ev",
        "ns",
        "no",
        "po",
        "pv",
        "pvc",
        "rc",
        "sa",
        "svc",
        "limits",
        "quota",
        "deploy",
        "rs",
        "sts",
        "hpa",
        "cj",
        "crd",
        "crds",
        "csr",
        "ing",
        "netpol",
        "pdb",
        "psp",
        "pc",
        "sc",
        "csinode",
        "ipa",
        "vac",
        "rq",
        "jobs",
        "cronjobs",
        "apiservices",
        "lease",
        # Well-known add-ons people run next to Lading.
        "infpool",
        "infmodel",
        "so",
        "sj",
        "ta",
        "cta",
        "smon",
        "pmon",
        "prom",
        "promrule",
        "am",
    }
)
"""Short names of built-in kinds (kubectl api-resources) and of common add-ons (Gateway API
Inference Extension, KEDA, Prometheus operator): ours must not shadow any of them."""

KUBERNETES_VERSION = kubernetes_validate.latest_version()


@pytest.fixture(scope="module")
def generated() -> dict[str, dict[str, Any]]:
    return {kind.kind: crds.crd(kind) for kind in crds.KINDS}


@pytest.mark.parametrize("directory", [REPO / "crds", CHART_CRD_DIR], ids=["crds", "chart"])
def test_committed_crds_are_what_the_models_generate(directory: pathlib.Path) -> None:
    problems = crds.stale(directory)
    assert not problems, (
        "the CRD YAML differs from what lading/models/specs.py and lading_operator/status.py generate; "
        "run `make crds` (or `lading crds --output-dir crds --output-dir charts/lading/crds`):\n" + "\n".join(problems)
    )


def test_chart_crds_are_identical_to_crds_dir() -> None:
    ours = {path.name: path.read_bytes() for path in (REPO / "crds").glob("*.yaml")}
    chart = {path.name: path.read_bytes() for path in CHART_CRD_DIR.glob("*.yaml")}
    assert ours == chart, "charts/lading/crds/ must be a byte-identical copy of crds/ (run `make crds`)"


def test_every_lading_kind_has_exactly_one_crd(generated: dict[str, dict[str, Any]]) -> None:
    assert set(generated) == {kind.KIND for kind in specs.LADING_KINDS}
    assert set(crd_schema.load_crds()) == set(generated)


def test_check_command_fails_on_a_stale_directory_and_names_the_fix(
    tmp_path: pathlib.Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["crds", "--output-dir", str(tmp_path)]) == 0
    assert cli.main(["crds", "--check", "--output-dir", str(tmp_path)]) == 0
    victim = tmp_path / "inferencepools.lading.dev.yaml"
    victim.write_text(victim.read_text().replace("maximum: 1000", "maximum: 1001"))
    (tmp_path / "old.lading.dev.yaml").write_text("kind: CustomResourceDefinition\n")
    capsys.readouterr()
    assert cli.main(["crds", "--check", "--output-dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "inferencepools.lading.dev.yaml: out of date" in err
    assert "old.lading.dev.yaml: not a generated CRD any more" in err
    assert "make crds" in err
    assert cli.main(["crds", "--output-dir", str(tmp_path)]) == 0
    assert not crds.stale(tmp_path)
    assert not (tmp_path / "old.lading.dev.yaml").exists()


@pytest.mark.parametrize("kind", [kind.kind for kind in crds.KINDS])
def test_crd_is_valid_for_kubernetes(kind: str, generated: dict[str, dict[str, Any]]) -> None:
    kubernetes_validate.validate(generated[kind], KUBERNETES_VERSION, strict=True)


def _nodes(node: Mapping[str, Any], path: str = "") -> Iterator[tuple[str, Mapping[str, Any]]]:
    yield path, node
    for name, child in node.get("properties", {}).items():
        yield from _nodes(child, f"{path}.{name}")
    if isinstance(node.get("items"), Mapping):
        yield from _nodes(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), Mapping):
        yield from _nodes(node["additionalProperties"], f"{path}{{}}")


@pytest.mark.parametrize("kind", [kind.kind for kind in crds.KINDS])
def test_schema_is_structural(kind: str, generated: dict[str, dict[str, Any]]) -> None:
    schema = crd_schema.openapi_schema(generated[kind])
    for path, node in _nodes(schema):
        where = f"{kind} {path or '<root>'}"
        assert (
            "type" in node or node.get("x-kubernetes-preserve-unknown-fields") or node.get("x-kubernetes-int-or-string")
        ), f"{where}: no type"
        for keyword in ("$ref", "anyOf", "allOf", "oneOf", "not", "title", "const", "patternProperties"):
            assert keyword not in node, f"{where}: {keyword} is not allowed in a structural schema"
        assert not ("properties" in node and "additionalProperties" in node), f"{where}: both kinds of fields"
        assert node.get("additionalProperties", True) is not False, f"{where}: additionalProperties: false"
        if node.get("type") == "string" and path.rsplit(".", 1)[-1] not in ("apiVersion", "kind"):
            assert "maxLength" in node or "enum" in node, f"{where}: unbounded string"
        if node.get("type") == "array":
            assert "maxItems" in node, f"{where}: unbounded list"
        if node.get("type") == "object" and "additionalProperties" in node:
            assert "maxProperties" in node, f"{where}: unbounded map"
        if "default" in node:
            # The API server rejects a CRD whose defaults do not validate against their own schema.
            jsonschema.validate(node["default"], crd_schema.to_json_schema(node))
        assert not node.get("x-kubernetes-preserve-unknown-fields"), f"{where}: free-form field"


def test_bounds_of_the_models_reach_the_schema(generated: dict[str, dict[str, Any]]) -> None:
    batch = crd_schema.openapi_schema(generated["ExtractionBatch"])["properties"]["spec"]
    documents = batch["properties"]["documents"]
    assert documents["maxItems"] == specs.INLINE_DOCUMENTS_MAX
    assert documents["items"]["properties"]["text"]["maxLength"] == specs.INLINE_TEXT_MAX_BYTES
    assert documents["x-kubernetes-list-type"] == "map" and documents["x-kubernetes-list-map-keys"] == ["key"]
    assert batch["properties"]["manifestUri"]["pattern"] == specs.MANIFEST_URI_PATTERN
    assert batch["properties"]["priority"] == {
        "type": "string",
        "description": batch["properties"]["priority"]["description"],
        "default": "normal",
        "enum": ["high", "normal", "low"],
    }
    assert batch["required"] == ["schema", "inferencePoolRef"]
    pool = crd_schema.openapi_schema(generated["InferencePool"])["properties"]["spec"]["properties"]
    assert pool["endpoint"]["properties"]["url"]["pattern"] == specs.HTTP_URL_PATTERN
    # A default made by default_factory is in the schema, so the API server stores it.
    assert pool["limits"]["default"] == {
        "requestsPerMinute": 600, "tokensPerMinute": 200000, "maxConcurrency": 32, "tokenAccounting": "reserved"
    }
    quota = crd_schema.openapi_schema(generated["TenantQuota"])["properties"]["spec"]["properties"]
    assert quota["allowedPriorities"]["default"] == ["high", "normal", "low"]
    assert quota["namespaces"]["x-kubernetes-list-type"] == "set"


def test_worst_case_inline_batch_stays_far_below_etcds_limit() -> None:
    """Bytes of one ExtractionBatch at the schema's bounds, as JSON, with ASCII text (CEL counts characters)."""
    per_document_overhead = len('{"key":"","text":""},') + 256
    worst = specs.INLINE_TOTAL_TEXT_MAX_BYTES + specs.INLINE_DOCUMENTS_MAX * per_document_overhead
    assert specs.INLINE_DOCUMENTS_MAX * specs.INLINE_TEXT_MAX_BYTES > 1_500_000, "else no total rule is needed"
    assert worst < 1_000_000, worst


@pytest.mark.parametrize("kind", [kind.kind for kind in crds.KINDS])
def test_status_schema_comes_from_the_status_models(kind: str, generated: dict[str, dict[str, Any]]) -> None:
    version = generated[kind]["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    properties = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    model = status.STATUS_MODELS[kind]
    assert set(properties) == {field.alias or name for name, field in model.model_fields.items()}
    conditions = properties["conditions"]
    assert conditions["maxItems"] == status.CONDITIONS_MAX
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]


def test_status_written_by_the_operator_validates_against_the_crd(generated: dict[str, dict[str, Any]]) -> None:
    condition = status.Condition(
        type="Admitted",
        status="True",
        reason="Admitted",
        message="tenant acme",
        last_transition_time="2026-03-01T10:00:00Z",
    )
    written = status.ExtractionBatchStatus(
        phase="Running",
        observed_generation=1,
        batch_id="42",
        tenant="acme",
        total=3,
        succeeded=1,
        review_required=1,
        oldest_eligible_age_seconds=7,
        recent_failures=[
            status.RecentFailure(
                document_key="inv-1", reason="InvalidOutput", message="bad json", at="2026-03-01T10:00:01Z"
            )
        ],
        conditions=[condition],
    ).model_dump(mode="json", by_alias=True, exclude_none=True)
    batch = {
        "apiVersion": specs.API_VERSION,
        "kind": "ExtractionBatch",
        "metadata": {"name": "b", "namespace": "acme"},
        "spec": {"schema": "invoice.v1", "inferencePoolRef": {"name": "p"}, "manifestUri": "file:///m.jsonl"},
        "status": written,
    }
    assert crd_schema.schema_errors(generated["ExtractionBatch"], batch) == []
    batch["status"] = {**written, "phase": "Exploded"}
    assert any("status.phase" in error for error in crd_schema.schema_errors(generated["ExtractionBatch"], batch))


def test_names_scope_categories_and_short_names(generated: dict[str, dict[str, Any]]) -> None:
    expected = {
        "ExtractionBatch": ("extractionbatches", "Namespaced", ["xb"]),
        "InferencePool": ("inferencepools", "Namespaced", ["ipool"]),
        "TenantQuota": ("tenantquotas", "Cluster", ["tq"]),
        "DeliveryEndpoint": ("deliveryendpoints", "Namespaced", ["lde"]),
    }
    seen: set[str] = set()
    for kind, (plural, scope, short_names) in expected.items():
        spec = generated[kind]["spec"]
        assert generated[kind]["metadata"]["name"] == f"{plural}.lading.dev"
        assert spec["group"] == "lading.dev" and spec["scope"] == scope
        assert spec["names"]["plural"] == plural and spec["names"]["shortNames"] == short_names
        assert spec["names"]["categories"] == ["lading"]
        assert [version["name"] for version in spec["versions"]] == ["v1alpha1"]
        for name in short_names:
            assert name not in BUILTIN_SHORT_NAMES, f"{kind}: short name {name} shadows a built-in one"
            assert name not in seen
            seen.add(name)


def test_printer_columns(generated: dict[str, dict[str, Any]]) -> None:
    def columns(kind: str) -> list[tuple[str, str, str]]:
        return [
            (column["name"], column["type"], column["jsonPath"])
            for column in generated[kind]["spec"]["versions"][0]["additionalPrinterColumns"]
        ]

    assert columns("ExtractionBatch") == [
        ("Phase", "string", ".status.phase"),
        ("Total", "integer", ".status.total"),
        ("Succeeded", "integer", ".status.succeeded"),
        ("Review", "integer", ".status.reviewRequired"),
        ("Failed", "integer", ".status.failed"),
        ("Delivered", "integer", ".status.delivered"),
        ("Oldest", "integer", ".status.oldestEligibleAgeSeconds"),
        ("Age", "date", ".metadata.creationTimestamp"),
        # -o wide (priority 1):
        ("Cost", "string", ".status.cost.amount"),
        ("Currency", "string", ".status.cost.currency"),
        ("Position", "integer", ".status.queuePosition"),
        ("ETA", "integer", ".status.etaSeconds"),
        ("Pool", "string", ".spec.inferencePoolRef.name"),
        ("Tenant", "string", ".status.tenant"),
        ("Reason", "string", '.status.conditions[?(@.type=="Ready")].reason'),
    ]
    assert [name for name, _, _ in columns("InferencePool")] == [
        "Provider",
        "Model",
        "Ready",
        "Workers",
        "Headroom",
        "Age",
    ]
    # Every column's path exists in the schema (a typo shows an empty column, silently).
    for kind, crd in generated.items():
        schema = crd_schema.openapi_schema(crd)
        for name, _, json_path in columns(kind):
            node: Mapping[str, Any] = schema
            # A filter (`conditions[?(@.type=="Ready")]`) selects items of a list: its path goes through them.
            for step in re.sub(r"\[\?\(.*?\)\]", "[]", json_path).strip(".").split("."):
                if step == "metadata":
                    break
                node = node["properties"][step.removesuffix("[]")]
                if step.endswith("[]"):
                    node = node["items"]
            assert node, f"{kind} column {name}"
