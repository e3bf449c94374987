"""
What the API server would do with Lading objects, judged offline from the generated CRDs: the
examples are admitted (and load with `lading run`'s loader), bad objects are rejected by the schema,
and the CEL rules reject what the pydantic models reject (cross-field rules) plus changes to the
fields that affect results (immutability), evaluated for real with cel-python.
"""

from __future__ import annotations

import copy
import pathlib
import re
import typing
from collections.abc import Iterator
from typing import Any

import pydantic
import pytest
import yaml
from lading_operator import crds

from lading.models import manifests, specs
from tests.support import crd_schema

EXAMPLES = crd_schema.REPO / "examples"
CRDS = crd_schema.load_crds()
LADING_KIND_NAMES = {kind.KIND for kind in specs.LADING_KINDS}
SPEC_MODELS: dict[str, type[pydantic.BaseModel]] = {
    "ExtractionBatch": specs.ExtractionBatchSpec,
    "InferencePool": specs.InferencePoolSpec,
    "TenantQuota": specs.TenantQuotaSpec,
    "DeliveryEndpoint": specs.DeliveryEndpointSpec,
}


def _documents(path: pathlib.Path) -> list[dict[str, Any]]:
    return [document for document in yaml.safe_load_all(path.read_text(encoding="utf-8")) if document]


def _example_objects() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for path in sorted(EXAMPLES.rglob("*.yaml")):
        for index, document in enumerate(_documents(path)):
            if document.get("kind") in LADING_KIND_NAMES:
                found.append((f"{path.relative_to(EXAMPLES)}#{index}", document))
    return found


EXAMPLE_OBJECTS = _example_objects()


def test_every_kind_has_an_example() -> None:
    assert {document["kind"] for _, document in EXAMPLE_OBJECTS} == LADING_KIND_NAMES
    batches = [document["spec"] for _, document in EXAMPLE_OBJECTS if document["kind"] == "ExtractionBatch"]
    assert any("documents" in spec for spec in batches) and any("manifestUri" in spec for spec in batches)
    providers = {document["spec"]["provider"] for _, document in EXAMPLE_OBJECTS if document["kind"] == "InferencePool"}
    assert {"vllm", "openai-compatible"} <= providers


@pytest.mark.parametrize(("where", "document"), EXAMPLE_OBJECTS, ids=[where for where, _ in EXAMPLE_OBJECTS])
def test_example_is_admitted_by_its_crd(where: str, document: dict[str, Any]) -> None:
    assert crd_schema.admission_errors(CRDS[document["kind"]], document) == []


def test_examples_load_as_one_manifest_set() -> None:
    paths = [path for path in sorted(EXAMPLES.glob("*.yaml")) if path.name != "quickstart.yaml"]
    loaded = manifests.load_paths(paths)
    assert len(loaded.extraction_batches) == 2 and len(loaded.inference_pools) == 2
    assert len(loaded.tenant_quotas) == 1 and len(loaded.delivery_endpoints) == 1
    assert manifests.load_paths([EXAMPLES / "quickstart.yaml"]).extraction_batches


# --- Schema rejections.

BATCH: dict[str, Any] = {
    "apiVersion": "lading.dev/v1alpha1",
    "kind": "ExtractionBatch",
    "metadata": {"name": "b", "namespace": "acme"},
    "spec": {
        "schema": "invoice.v1",
        "inferencePoolRef": {"name": "qwen", "namespace": "lading-system"},
        "documents": [{"key": "inv-1", "text": "Invoice 1"}, {"key": "inv-2", "text": "Invoice 2"}],
    },
}
POOL: dict[str, Any] = {
    "apiVersion": "lading.dev/v1alpha1",
    "kind": "InferencePool",
    "metadata": {"name": "qwen", "namespace": "lading-system"},
    "spec": {
        "provider": "openai-compatible",
        "model": "Qwen/Qwen2.5-7B-Instruct",
        "endpoint": {"url": "https://x.example/v1"},
    },
}
QUOTA: dict[str, Any] = {
    "apiVersion": "lading.dev/v1alpha1",
    "kind": "TenantQuota",
    "metadata": {"name": "acme"},
    "spec": {"namespaces": ["acme"]},
}
ENDPOINT: dict[str, Any] = {
    "apiVersion": "lading.dev/v1alpha1",
    "kind": "DeliveryEndpoint",
    "metadata": {"name": "erp", "namespace": "acme"},
    "spec": {"url": "https://erp.example/hook", "secretRef": {"name": "erp-signing", "key": "secret"}},
}


def _with(obj: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A copy of `obj` with spec field `path` ('a.b', '-a.b' deletes) set to `value`."""
    result = copy.deepcopy(obj)
    delete = path.startswith("-")
    *parents, last = path.lstrip("-").split(".")
    node = result["spec"]
    for step in parents:
        node = node[int(step)] if isinstance(node, list) else node[step]
    if delete:
        del node[last]
    elif isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
    return result


SCHEMA_REJECTS = [
    ("missing required", _with(BATCH, "-schema", None), "'schema' is a required property"),
    ("missing pool ref", _with(BATCH, "-inferencePoolRef", None), "'inferencePoolRef' is a required property"),
    ("wrong enum", _with(BATCH, "priority", "urgent"), "spec.priority: 'urgent' is not one of"),
    ("unknown schema", _with(BATCH, "schema", "receipt.v9"), "spec.schema: 'receipt.v9' is not one of"),
    ("wrong provider", _with(POOL, "provider", "llama"), "spec.provider: 'llama' is not one of"),
    ("key too long", _with(BATCH, "documents.0.key", "k" * 257), "spec.documents.0.key: 'kkkk"),
    ("text too long", _with(BATCH, "documents.0.text", "t" * (specs.INLINE_TEXT_MAX_BYTES + 1)), "is too long"),
    (
        "too many documents",
        _with(BATCH, "documents", [{"key": f"k{i}", "text": "t"} for i in range(1001)]),
        "spec.documents: [{",
    ),
    ("empty documents", _with(BATCH, "documents", []), "spec.documents: [] should be non-empty"),
    (
        "bad url pattern",
        _with(POOL, "endpoint.url", "ftp://x.example/v1"),
        "spec.endpoint.url: 'ftp://x.example/v1' does not match",
    ),
    (
        "url with space",
        _with(ENDPOINT, "url", "https://erp.example/a b"),
        "spec.url: 'https://erp.example/a b' does not match",
    ),
    (
        "bad manifest uri",
        _with(_with(BATCH, "-documents", None), "manifestUri", "s3://bucket/m.jsonl"),
        "spec.manifestUri",
    ),
    ("bad namespace", _with(QUOTA, "namespaces", ["Acme"]), "spec.namespaces.0: 'Acme' does not match"),
    (
        "duplicate namespace",
        _with(QUOTA, "namespaces", ["acme", "acme"]),
        "spec.namespaces: ['acme', 'acme'] has non-unique",
    ),
    ("below minimum", _with(BATCH, "deadlineSeconds", 59), "spec.deadlineSeconds: 59 is less than the minimum of 60"),
    ("above maximum", _with(QUOTA, "weight", 1001), "spec.weight: 1001 is greater than the maximum of 1000"),
    ("wrong type", _with(QUOTA, "maxInFlight", "64"), "spec.maxInFlight: '64' is not of type 'integer'"),
    (
        "price as a number",
        _with(POOL, "pricing", {"currency": "USD", "inputPerMillionTokens": 0.15, "outputPerMillionTokens": "1"}),
        "spec.pricing.inputPerMillionTokens: 0.15 is not of type 'string'",
    ),
    (
        "price with an exponent",
        _with(POOL, "pricing", {"currency": "USD", "inputPerMillionTokens": "1e-3", "outputPerMillionTokens": "1"}),
        "spec.pricing.inputPerMillionTokens: '1e-3' does not match",
    ),
    ("negative budget", _with(QUOTA, "budget", {"currency": "EUR", "monthly": "-5"}), "spec.budget.monthly: '-5'"),
    ("budget currency", _with(QUOTA, "budget", {"currency": "euro", "monthly": "5"}), "spec.budget.currency: 'euro'"),
    (
        "extra field",
        _with(BATCH, "documents.0.uri", "file:///x"),
        "Additional properties are not allowed ('uri' was unexpected)",
    ),
    ("extra spec field", _with(ENDPOINT, "signingSecret", "whsec_x"), "('signingSecret' was unexpected)"),
    ("bad secret key", _with(ENDPOINT, "secretRef", {"name": "erp", "key": "a b"}), "spec.secretRef.key"),
    (
        "engine args bound",
        _with(
            _with(_with(POOL, "provider", "vllm"), "-endpoint", None),
            "vllm",
            {"engineArgs": {"gpuMemoryUtilization": 1.5}},
        ),
        "spec.vllm.engineArgs.gpuMemoryUtilization: 1.5 is greater than the maximum of 0.99",
    ),
    # U+0000: valid JSON ("\u0000"), but PostgreSQL text cannot store it; the API server must refuse it.
    ("NUL in text", _with(BATCH, "documents.1.text", "Invoice\x00 2"), "spec.documents.1.text: 'Invoice\\x00 2'"),
    ("NUL in key", _with(BATCH, "documents.0.key", "inv\x001"), "spec.documents.0.key: 'inv\\x001' does not match"),
    (
        "NUL in manifest uri",
        _with(_with(BATCH, "-documents", None), "manifestUri", "https://files.example/m\x00.jsonl"),
        "spec.manifestUri: 'https://files.example/m\\x00.jsonl' does not match",
    ),
    (
        "NUL in pool url",
        _with(POOL, "endpoint.url", "https://x.example/v1\x00"),
        "spec.endpoint.url: 'https://x.example/v1\\x00' does not match",
    ),
    ("NUL in endpoint url", _with(ENDPOINT, "url", "https://erp\x00.example/hook"), "spec.url: 'https://erp\\x00"),
]


@pytest.mark.parametrize(("case", "obj", "expected"), SCHEMA_REJECTS, ids=[case for case, _, _ in SCHEMA_REJECTS])
def test_schema_rejects(case: str, obj: dict[str, Any], expected: str) -> None:
    errors = crd_schema.schema_errors(CRDS[obj["kind"]], obj)
    assert any(expected in error for error in errors), errors
    # The pydantic model, which `lading run` and the operator use, rejects the same object.
    with pytest.raises(pydantic.ValidationError):
        SPEC_MODELS[obj["kind"]].model_validate(obj["spec"])


def test_invalid_manifest_files_are_rejected(tmp_path: pathlib.Path) -> None:
    """Whole manifest files, as a user writes them: each rejected by the CRD and by the loader."""
    for case, obj, _ in SCHEMA_REJECTS[:6]:
        path = tmp_path / f"{case.replace(' ', '-')}.yaml"
        path.write_text(yaml.safe_dump(obj, allow_unicode=True))
        document = _documents(path)[0]
        assert crd_schema.schema_errors(CRDS[document["kind"]], document), case


# --- CEL: cross-field rules.

VLLM_POOL = _with(_with(POOL, "provider", "vllm"), "-endpoint", None)
BUILTIN_POOL = _with(_with(_with(POOL, "provider", "builtin"), "-endpoint", None), "-model", None)

CEL_CROSS_FIELD = [
    ("vllm without model", _with(VLLM_POOL, "-model", None), "model is required"),
    ("external without model", _with(POOL, "-model", None), "model is required"),
    ("external without endpoint", _with(POOL, "-endpoint", None), "endpoint (with url) is required"),
    ("vllm with endpoint", _with(VLLM_POOL, "endpoint", {"url": "https://x.example/v1"}), "endpoint is only for"),
    ("builtin with endpoint", _with(BUILTIN_POOL, "endpoint", {"url": "https://x.example/v1"}), "endpoint is only for"),
    ("external with vllm settings", _with(POOL, "vllm", {"gpus": 2}), "vllm settings are only for provider vllm"),
    ("vllm with builtin settings", _with(VLLM_POOL, "builtin", {"latencyMs": 5}), "builtin settings are only for"),
    (
        "external priced by the GPU hour",
        _with(POOL, "pricing", {"currency": "USD", "gpuHourPrice": "2.50"}),
        "gpuHourPrice is only for provider vllm",
    ),
    (
        "GPU-hour and per-token prices",
        _with(VLLM_POOL, "pricing", {"currency": "USD", "gpuHourPrice": "2.50", "inputPerMillionTokens": "1"}),
        "gpuHourPrice prices the pool by GPU time",
    ),
    (
        "one per-token price only",
        _with(POOL, "pricing", {"currency": "USD", "inputPerMillionTokens": "1"}),
        "a pool is priced per token",
    ),
    (
        "max below min replicas",
        _with(POOL, "workers", {"minReplicas": 5, "maxReplicas": 2}),
        "maxReplicas must be at least minReplicas",
    ),
    ("min above default max", _with(POOL, "workers", {"minReplicas": 11}), "maxReplicas must be at least minReplicas"),
    (
        "batched tokens below seqs",
        _with(VLLM_POOL, "vllm", {"engineArgs": {"maxNumSeqs": 256, "maxNumBatchedTokens": 128}}),
        "maxNumBatchedTokens must be at least maxNumSeqs",
    ),
    (
        "vllm env with a value and a source",
        _with(VLLM_POOL, "vllm", {"env": [{"name": "A", "value": "1",
                                           "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]}),
        "give exactly one of value and valueFrom",
    ),
    (
        "toleration Exists with a value",
        _with(VLLM_POOL, "vllm", {"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "value": "x"}]}),
        "a toleration with operator Exists takes no value",
    ),
    (
        "results kept without a document retention",
        _with(QUOTA, "retention", {"resultsDays": 30}),
        "resultsDays requires documentsDays",
    ),
    (
        "results deleted before the documents",
        _with(QUOTA, "retention", {"documentsDays": 30, "resultsDays": 7}),
        "resultsDays must be at least documentsDays",
    ),
    ("budget without an amount", _with(QUOTA, "budget", {"currency": "EUR"}), "a budget needs monthly, daily or both"),
    (
        "daily budget above monthly",
        _with(QUOTA, "budget", {"currency": "EUR", "monthly": "10.00", "daily": "10.50"}),
        "daily must not exceed monthly",
    ),
    ("no documents source", _with(BATCH, "-documents", None), "exactly one of documents (inline) or manifestUri"),
    (
        "both sources",
        _with(BATCH, "manifestUri", "file:///data/m.jsonl"),
        "exactly one of documents (inline) or manifestUri",
    ),
    (
        "too much inline text",
        _with(BATCH, "documents", [{"key": f"k{i}", "text": "a" * 60_000} for i in range(9)]),
        "at most 524288 characters of text in all",
    ),
]


@pytest.mark.parametrize(("case", "obj", "expected"), CEL_CROSS_FIELD, ids=[case for case, _, _ in CEL_CROSS_FIELD])
def test_cel_restates_the_cross_field_rules_of_the_models(case: str, obj: dict[str, Any], expected: str) -> None:
    crd = CRDS[obj["kind"]]
    assert crd_schema.schema_errors(crd, obj) == [], "the schema alone accepts it: only a rule can catch it"
    errors = crd_schema.cel_errors(crd, obj)
    assert len(errors) == 1 and expected in errors[0], errors
    with pytest.raises(pydantic.ValidationError):
        SPEC_MODELS[obj["kind"]].model_validate(obj["spec"])


CEL_ACCEPTS = [
    ("builtin pool without model", BUILTIN_POOL),
    ("vllm pool with all defaults", VLLM_POOL),
    (
        "vllm pool with engine args",
        _with(VLLM_POOL, "vllm", {"gpus": 2, "engineArgs": {"maxNumSeqs": 8, "maxNumBatchedTokens": 8}}),
    ),
    ("external pool", POOL),
    ("manifest batch", _with(_with(BATCH, "-documents", None), "manifestUri", "https://files.example/m.jsonl")),
    (
        "inline batch at the text limit",
        _with(BATCH, "documents", [{"key": f"k{i}", "text": "a" * 65_536} for i in range(8)]),
    ),
    ("quota", QUOTA),
    ("quota with a budget", _with(QUOTA, "budget", {"currency": "EUR", "monthly": "500.00", "daily": "500"})),
    ("quota with a retention", _with(QUOTA, "retention", {"documentsDays": 30, "resultsDays": 30})),
    ("quota keeping only results", _with(QUOTA, "retention", {"documentsDays": 7})),
    (
        "priced pool",
        _with(POOL, "pricing", {"currency": "USD", "inputPerMillionTokens": "0.15", "outputPerMillionTokens": "0.6"}),
    ),
    ("vllm pool priced by the GPU hour", _with(VLLM_POOL, "pricing", {"currency": "EUR", "gpuHourPrice": "2.50"})),
    ("endpoint", ENDPOINT),
]


@pytest.mark.parametrize(("case", "obj"), CEL_ACCEPTS, ids=[case for case, _ in CEL_ACCEPTS])
def test_cel_accepts_valid_objects(case: str, obj: dict[str, Any]) -> None:
    assert crd_schema.admission_errors(CRDS[obj["kind"]], obj) == []
    SPEC_MODELS[obj["kind"]].model_validate(obj["spec"])


# --- CEL: immutability of what affects results.

BATCH_CHANGES_ALLOWED = [
    ("suspend", _with(BATCH, "suspend", True)),
    ("priority", _with(BATCH, "priority", "high")),
    ("status only", {**BATCH, "status": {"phase": "Running"}}),
    ("labels", {**BATCH, "metadata": {**BATCH["metadata"], "labels": {"team": "ap"}}}),
]
BATCH_CHANGES_FORBIDDEN = [
    # invoice.v1 is the only schema today: the old object stands for a batch of an earlier schema.
    ("schema", BATCH, "schema is immutable"),
    ("pool name", _with(BATCH, "inferencePoolRef.name", "other"), "inferencePoolRef is immutable"),
    ("pool namespace", _with(BATCH, "-inferencePoolRef.namespace", None), "inferencePoolRef is immutable"),
    ("deadline", _with(BATCH, "deadlineSeconds", 600), "deadlineSeconds is immutable"),
    ("validation policy", _with(BATCH, "validationPolicy", "invoice-lenient-v1"), "validationPolicy is immutable"),
    ("result reuse turned off", _with(BATCH, "reuse", False), "reuse is immutable"),
    (
        "delivery endpoint added",
        _with(BATCH, "deliveryEndpointRef", {"name": "erp"}),
        "deliveryEndpointRef is immutable",
    ),
    (
        "document text",
        _with(BATCH, "documents.1", {"key": "inv-2", "text": "Invoice 2, corrected"}),
        "documents is immutable",
    ),
    (
        "document added",
        _with(BATCH, "documents", [*BATCH["spec"]["documents"], {"key": "inv-3", "text": "3"}]),
        "documents is immutable",
    ),
    (
        "documents replaced by a manifest",
        _with(_with(BATCH, "-documents", None), "manifestUri", "file:///m.jsonl"),
        "documents is immutable",
    ),
]


@pytest.mark.parametrize(("case", "new"), BATCH_CHANGES_ALLOWED, ids=[case for case, _ in BATCH_CHANGES_ALLOWED])
def test_batch_fields_that_may_change(case: str, new: dict[str, Any]) -> None:
    assert crd_schema.cel_errors(CRDS["ExtractionBatch"], new, old=BATCH) == []


@pytest.mark.parametrize(
    ("case", "new", "expected"), BATCH_CHANGES_FORBIDDEN, ids=[case for case, _, _ in BATCH_CHANGES_FORBIDDEN]
)
def test_batch_fields_that_affect_results_are_immutable(case: str, new: dict[str, Any], expected: str) -> None:
    crd = CRDS["ExtractionBatch"]
    assert crd_schema.cel_errors(crd, new) == [], "valid on its own: only the transition is refused"
    errors = crd_schema.cel_errors(crd, new, old=_old_of(case))
    assert any(expected in error for error in errors), errors
    assert crd_schema.cel_errors(crd, new, old=new) == [], "an unchanged object is always accepted"


def _old_of(case: str) -> dict[str, Any]:
    return _with(BATCH, "schema", "invoice.v0") if case == "schema" else BATCH


def test_every_batch_spec_field_is_either_mutable_or_guarded_by_a_rule() -> None:
    """A new spec field must be classified: added to the immutability rules, or listed here as mutable."""
    mutable = {"suspend", "priority"}
    spec = crd_schema.openapi_schema(CRDS["ExtractionBatch"])["properties"]["spec"]
    guarded = {
        rule["message"].split(" is immutable")[0]
        for rule in spec["x-kubernetes-validations"]
        if "is immutable" in rule["message"]
    }
    assert set(spec["properties"]) == guarded | mutable
    assert not guarded & mutable


def test_every_rule_compiles_and_is_exercised() -> None:
    """Each CEL rule of every CRD parses, and the cases above make each one fail at least once."""
    failures = [case for case in CEL_CROSS_FIELD] + [
        (case, new, expected) for case, new, expected in BATCH_CHANGES_FORBIDDEN
    ]
    seen_messages: set[str] = set()
    for _, new, _ in CEL_CROSS_FIELD:
        seen_messages.update(error.split(": ", 1)[1] for error in crd_schema.cel_errors(CRDS[new["kind"]], new))
    for case, new, _ in BATCH_CHANGES_FORBIDDEN:
        seen_messages.update(
            error.split(": ", 1)[1] for error in crd_schema.cel_errors(CRDS["ExtractionBatch"], new, old=_old_of(case))
        )
    assert failures
    for kind in crds.KINDS:
        for path, rule in crd_schema.rules(crd_schema.openapi_schema(CRDS[kind.kind])):
            crd_schema._program(rule["rule"])
            assert rule["message"] in seen_messages, f"{kind.kind} {path}: rule never exercised: {rule['rule']}"


def _spec_models(model: type[pydantic.BaseModel]) -> Iterator[type[pydantic.BaseModel]]:
    yield model
    for annotation in typing.get_type_hints(model).values():  # resolved, unlike model_fields' forward references
        for argument in (annotation, *getattr(annotation, "__args__", ())):
            for candidate in (argument, *getattr(argument, "__args__", ())):
                if isinstance(candidate, type) and issubclass(candidate, pydantic.BaseModel):
                    yield from _spec_models(candidate)


VALIDATORS_RESTATED_IN_CEL = {
    "InferencePoolSpec._model_required_unless_builtin": "model is required",
    "InferencePoolSpec._endpoint_only_for_external": "endpoint",
    "InferencePoolSpec._vllm_only_for_vllm": "vllm settings are only for provider vllm",
    "InferencePoolSpec._builtin_only_for_builtin": "builtin settings are only for provider builtin",
    "EngineArgs._batched_tokens_cover_sequences": "maxNumBatchedTokens must be at least maxNumSeqs",
    "WorkerSettings._max_covers_min": "maxReplicas must be at least minReplicas",
    "Toleration._no_value_with_exists": "a toleration with operator Exists takes no value",
    "EnvVar._value_or_source": "give exactly one of value and valueFrom",
    "ExtractionBatchSpec._not_both_sources": "exactly one of documents (inline) or manifestUri",
    "ExtractionBatchSpec._some_source": "exactly one of documents (inline) or manifestUri",
    "ExtractionBatchSpec._unique_keys": "characters of text in all",
    "MoneyBudget._some_limit": "a budget needs monthly, daily or both",
    "InferencePoolSpec._gpu_hour_price_only_for_vllm": "gpuHourPrice is only for provider vllm",
    "Pricing._per_token_or_per_gpu_hour": "a pool is priced per token",
    "RetentionSpec._text_before_result": "the document text is deleted before the result",
}
VALIDATORS_IN_THE_SCHEMA_OR_CODE_ONLY = {
    "TenantQuotaSpec._no_duplicates": "x-kubernetes-list-type: set",
    "ExtractionBatchSpec._unique_keys": "x-kubernetes-list-type: map keyed by key (total size: CEL above)",
    "InlineDocument._key_segments": "code only: '.'/'..' segments (the pattern bounds the alphabet)",
    "InlineDocument._text_size": "code only: UTF-8 bytes (maxLength bounds characters)",
    "VllmSettings._no_rendered_args": "code only: the operator's own vllm serve flags, also as --flag=value",
    "VllmSettings._no_rendered_env": "code only: the operator's own variables; duplicates: list-type map by name",
    "Pricing._absent_prices_checked": "code only: an absent per-token price is checked, so its error names it",
}


def test_every_model_validator_is_restated_or_deliberately_left_to_code() -> None:
    """A new cross-field validator in specs.py must get a CEL rule here, or a reason it cannot have one."""
    found = set()
    for kind in specs.LADING_KINDS:
        spec_model = kind.model_fields["spec"].annotation
        assert isinstance(spec_model, type) and issubclass(spec_model, pydantic.BaseModel)
        for model in _spec_models(spec_model):
            decorators = model.__pydantic_decorators__
            found.update(
                f"{model.__name__}.{name}"
                for name in [*decorators.field_validators, *decorators.model_validators]
                if name != "_storable"  # every model's, restated by patterns: see the test below
            )
    assert found == set(VALIDATORS_RESTATED_IN_CEL) | set(VALIDATORS_IN_THE_SCHEMA_OR_CODE_ONLY)
    messages = [
        rule["message"]
        for kind in crds.KINDS
        for _, rule in crd_schema.rules(crd_schema.openapi_schema(CRDS[kind.kind]))
    ]
    for validator, fragment in VALIDATORS_RESTATED_IN_CEL.items():
        assert any(fragment in message for message in messages), f"{validator}: no CEL rule says {fragment!r}"


def _string_nodes(node: dict[str, Any], path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    if node.get("type") == "string":
        yield path, node
    for name, child in node.get("properties", {}).items():
        yield from _string_nodes(child, f"{path}.{name}")
    for key, suffix in (("items", "[]"), ("additionalProperties", "{}")):
        if isinstance(node.get(key), dict):
            yield from _string_nodes(node[key], path + suffix)


@pytest.mark.parametrize("kind", sorted(CRDS))
def test_every_free_string_of_a_spec_refuses_nul(kind: str) -> None:
    """PostgreSQL text cannot store U+0000: every string a user writes in a spec (keys, texts, URLs,
    names) has a pattern or an enum that refuses it, so the API server refuses the object at
    `kubectl apply` instead of the operator retrying a COPY that can never succeed."""
    spec = crd_schema.openapi_schema(CRDS[kind])["properties"]["spec"]
    strings = list(_string_nodes(spec, "spec"))
    assert strings
    for path, node in strings:
        if "enum" in node:
            continue
        assert "pattern" in node, f"{kind} {path}: a free string without a pattern"
        for value in ("\x00", "inv-1\x00", "https://x.example/v1\x00", "Invoice\x00 text"):
            assert re.search(node["pattern"], value) is None, f"{kind} {path}: {node['pattern']} lets U+0000 through"
    # The model has the same rule, before any pattern, and says what is wrong.
    for model in _spec_models(SPEC_MODELS[kind]):
        assert "_storable" in model.__pydantic_decorators__.field_validators, model.__name__
