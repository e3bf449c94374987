"""Spec models of the custom resources: defaults, bounds, enums, patterns and cross-field rules."""

from __future__ import annotations

import base64
import copy
from typing import Any

import pydantic
import pytest

from lading.models import invoice, specs

TENANT_QUOTA: dict[str, Any] = {
    "namespaces": ["acme"],
    "maxQueuedJobs": 50000,
    "maxInFlight": 64,
    "weight": 1,
}
OPENAI_POOL: dict[str, Any] = {
    "provider": "openai-compatible",
    "model": "Qwen/Qwen2.5-7B-Instruct",
    "endpoint": {"url": "http://127.0.0.1:8000/v1", "apiKeySecretRef": {"name": "qwen-key", "key": "apiKey"}},
    "limits": {"requestsPerMinute": 600, "tokensPerMinute": 200000, "maxConcurrency": 32},
    "workers": {"minReplicas": 0, "maxReplicas": 10, "concurrency": 32, "targetOldestAgeSeconds": 120},
}
VLLM_POOL: dict[str, Any] = {"provider": "vllm", "model": "Qwen/Qwen2.5-7B-Instruct"}
BUILTIN_POOL: dict[str, Any] = {"provider": "builtin"}
DELIVERY_ENDPOINT: dict[str, Any] = {
    "url": "https://erp.acme.example/webhooks/lading",
    "secretRef": {"name": "erp-signing", "key": "secret"},
}
BATCH: dict[str, Any] = {
    "schema": "invoice.v1",
    "inferencePoolRef": {"name": "qwen", "namespace": "lading-system"},
    "deliveryEndpointRef": {"name": "erp"},
    "priority": "normal",
    "deadlineSeconds": 21600,
    "documents": [{"key": "inv-0001", "text": "..."}],
}

MANIFEST_BATCH: dict[str, Any] = {
    **{k: v for k, v in BATCH.items() if k != "documents"},
    "manifestUri": "file:///data/march/manifest.jsonl",
}

Case = tuple[type[pydantic.BaseModel], dict[str, Any]]
QUOTA: Case = (specs.TenantQuotaSpec, TENANT_QUOTA)
OPENAI: Case = (specs.InferencePoolSpec, OPENAI_POOL)
VLLM: Case = (specs.InferencePoolSpec, VLLM_POOL)
BUILTIN: Case = (specs.InferencePoolSpec, BUILTIN_POOL)
ENDPOINT: Case = (specs.DeliveryEndpointSpec, DELIVERY_ENDPOINT)
INLINE: Case = (specs.ExtractionBatchSpec, BATCH)
BY_MANIFEST: Case = (specs.ExtractionBatchSpec, MANIFEST_BATCH)


def with_(base: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A deep copy of `base` with the dotted `path` set to `value` (`...` deletes it)."""
    data = copy.deepcopy(base)
    *parents, last = path.split(".")
    node: Any = data
    for part in parents:
        node = node[int(part)] if part.isdigit() else node.setdefault(part, {})
    if value is ...:
        del node[last]
    else:
        node[last] = value
    return data


def errors_of(model: type[pydantic.BaseModel], data: dict[str, Any]) -> dict[str, str]:
    """'camel.path' -> message of every error, or {} when the data is valid."""
    try:
        model.model_validate(data)
    except pydantic.ValidationError as exc:
        return {".".join(str(part) for part in error["loc"]): error["msg"] for error in exc.errors()}
    return {}


def test_design_example_specs_validate_with_defaults_filled_in() -> None:
    quota = specs.TenantQuotaSpec.model_validate(TENANT_QUOTA)
    pool = specs.InferencePoolSpec.model_validate(OPENAI_POOL)
    endpoint = specs.DeliveryEndpointSpec.model_validate(DELIVERY_ENDPOINT)
    batch = specs.ExtractionBatchSpec.model_validate(BATCH)

    assert quota.allowed_priorities == ["high", "normal", "low"]
    assert quota.daily_token_budget is None
    assert pool.endpoint is not None and pool.endpoint.api_key_secret_ref == specs.SecretKeyRef(
        name="qwen-key", key="apiKey"
    )
    assert pool.workers.scale_down_stabilization_seconds == 300
    assert pool.paused is False
    assert endpoint.retry_budget is None
    assert batch.extraction_schema == invoice.SCHEMA_NAME
    assert batch.validation_policy == "invoice-strict-v2"
    assert batch.suspend is False


def test_defaults_of_an_almost_empty_pool() -> None:
    pool = specs.InferencePoolSpec.model_validate(BUILTIN_POOL)
    assert pool.model is None
    assert pool.limits == specs.PoolLimits(
        requests_per_minute=600, tokens_per_minute=200_000, max_concurrency=32
    )
    assert pool.workers.min_replicas == 0
    assert pool.workers.concurrency == 32
    assert pool.workers.target_oldest_age_seconds == 120


def test_schema_field_round_trips_under_its_yaml_name() -> None:
    batch = specs.ExtractionBatchSpec.model_validate(BATCH)
    dumped = batch.model_dump(by_alias=True, exclude_none=True)
    assert dumped["schema"] == "invoice.v1"
    assert "extractionSchema" not in dumped and "extraction_schema" not in dumped
    assert specs.ExtractionBatchSpec.model_validate(dumped) == batch
    assert batch.model_dump()["extraction_schema"] == "invoice.v1"


def test_spec_fields_dump_in_camel_case_and_parse_back() -> None:
    pool = specs.InferencePoolSpec.model_validate(OPENAI_POOL)
    dumped = pool.model_dump(by_alias=True, exclude_none=True)
    assert dumped["workers"]["targetOldestAgeSeconds"] == 120
    assert dumped["endpoint"]["apiKeySecretRef"] == {"name": "qwen-key", "key": "apiKey"}
    assert specs.InferencePoolSpec.model_validate(dumped) == pool


def test_python_names_are_accepted_too() -> None:
    workers = specs.WorkerSettings.model_validate({"min_replicas": 1, "max_replicas": 2})
    assert (workers.min_replicas, workers.max_replicas) == (1, 2)


def test_pool_key_defaults_to_the_batch_namespace() -> None:
    explicit = specs.ExtractionBatchSpec.model_validate(BATCH)
    implicit = specs.ExtractionBatchSpec.model_validate(with_(BATCH, "inferencePoolRef", {"name": "qwen"}))
    assert explicit.pool_key(batch_namespace="acme") == "lading-system/qwen"
    assert implicit.pool_key(batch_namespace="acme") == "acme/qwen"


@pytest.mark.parametrize(
    ("case", "path", "value", "field", "message"),
    [
        # TenantQuota
        (QUOTA, "namespaces", [], "namespaces", "at least 1 item"),
        (QUOTA, "namespaces", [f"n{i}" for i in range(257)], "namespaces",
         "at most 256 items"),
        (QUOTA, "namespaces", ["Acme"], "namespaces.0", "pattern"),
        (QUOTA, "namespaces", ["a" * 64], "namespaces.0", "at most 63"),
        (QUOTA, "namespaces", ["acme", "acme"], "namespaces", "duplicate entries: acme"),
        (QUOTA, "maxQueuedJobs", -1, "maxQueuedJobs", "greater than or equal to 0"),
        (QUOTA, "maxQueuedBytes", -1, "maxQueuedBytes", "greater than or equal to 0"),
        (QUOTA, "maxInFlight", 0, "maxInFlight", "greater than or equal to 1"),
        (QUOTA, "maxInFlight", "64", "maxInFlight", "valid integer"),
        (QUOTA, "dailyTokenBudget", -5, "dailyTokenBudget", "greater than or equal"),
        (QUOTA, "weight", 0, "weight", "greater than or equal to 1"),
        (QUOTA, "weight", 1001, "weight", "less than or equal to 1000"),
        (QUOTA, "allowedPriorities", ["urgent"], "allowedPriorities.0",
         "'high', 'normal' or 'low'"),
        (QUOTA, "allowedPriorities", [], "allowedPriorities", "at least 1 item"),
        (QUOTA, "allowedPools", ["qwen"], "allowedPools.0", "pattern"),
        (QUOTA, "spare", 1, "spare", "Extra inputs are not permitted"),
        # InferencePool: enums and cross-field rules
        (OPENAI, "provider", "ollama", "provider", "'builtin', 'openai-compatible'"),
        (VLLM, "model", ..., "model", "model is required when provider is vllm"),
        (OPENAI, "model", ..., "model",
         "model is required when provider is openai-compatible"),
        (OPENAI, "model", "bad model name", "model", "pattern"),
        (OPENAI, "endpoint", ..., "endpoint",
         "endpoint (with url) is required when provider is openai-compatible"),
        (VLLM, "endpoint", {"url": "http://x:8000/v1"}, "endpoint",
         "endpoint is only for provider openai-compatible, not vllm"),
        (BUILTIN, "endpoint", {"url": "http://x:8000/v1"}, "endpoint",
         "not builtin"),
        (OPENAI, "vllm", {}, "vllm", "only for provider vllm"),
        (VLLM, "builtin", {}, "builtin", "only for provider builtin"),
        # InferencePool: endpoint
        (OPENAI, "endpoint.url", "ftp://x/v1", "endpoint.url", "pattern"),
        (OPENAI, "endpoint.url", "https://user:pw@x/v1", "endpoint.url",
         "must not carry credentials"),
        (OPENAI, "endpoint.url", "http://x:99999/v1", "endpoint.url", "invalid port"),
        (OPENAI, "endpoint.apiKeySecretRef", {"name": "k"},
         "endpoint.apiKeySecretRef.key", "Field required"),
        (OPENAI, "endpoint.apiKeySecretRef.key", "a key", "endpoint.apiKeySecretRef.key",
         "pattern"),
        # InferencePool: vllm
        (VLLM, "vllm", {"gpus": 0}, "vllm.gpus", "greater than or equal to 1"),
        (VLLM, "vllm", {"gpus": 17}, "vllm.gpus", "less than or equal to 16"),
        (VLLM, "vllm", {"image": "bad image"}, "vllm.image", "pattern"),
        (VLLM, "vllm", {"engineArgs": {"gpuMemoryUtilization": 0.05}},
         "vllm.engineArgs.gpuMemoryUtilization", "greater than or equal to 0.1"),
        (VLLM, "vllm", {"engineArgs": {"gpuMemoryUtilization": 1}},
         "vllm.engineArgs.gpuMemoryUtilization", "less than or equal to 0.99"),
        (VLLM, "vllm", {"engineArgs": {"maxNumSeqs": 0}},
         "vllm.engineArgs.maxNumSeqs", "greater than or equal to 1"),
        (VLLM, "vllm", {"engineArgs": {"maxNumSeqs": 256, "maxNumBatchedTokens": 128}},
         "vllm.engineArgs.maxNumBatchedTokens", "must be at least maxNumSeqs (256)"),
        (VLLM, "vllm", {"engineArgs": {"maxModelLen": 0}},
         "vllm.engineArgs.maxModelLen", "greater than or equal to 1"),
        (VLLM, "vllm", {"engineArgs": {"maxNumSeqs": 8, "bogus": 1}},
         "vllm.engineArgs.bogus", "Extra inputs"),
        (BUILTIN, "builtin", {"latencyMs": 600_001}, "builtin.latencyMs",
         "less than or equal to 600000"),
        (BUILTIN, "builtin", {"latencyMs": -1}, "builtin.latencyMs",
         "greater than or equal to 0"),
        # InferencePool: limits and workers
        (OPENAI, "limits.requestsPerMinute", 0, "limits.requestsPerMinute",
         "greater than or equal to 1"),
        (OPENAI, "limits.tokensPerMinute", 0, "limits.tokensPerMinute",
         "greater than or equal to 1"),
        (OPENAI, "limits.maxConcurrency", 0, "limits.maxConcurrency",
         "greater than or equal to 1"),
        (OPENAI, "workers.minReplicas", -1, "workers.minReplicas",
         "greater than or equal to 0"),
        (OPENAI, "workers.maxReplicas", 0, "workers.maxReplicas",
         "greater than or equal to 1"),
        ((specs.InferencePoolSpec, with_(OPENAI_POOL, "workers.minReplicas", 5)), "workers.maxReplicas", 2,
         "workers.maxReplicas", "maxReplicas (2) must be at least minReplicas (5)"),
        (OPENAI, "workers.concurrency", 1025, "workers.concurrency",
         "less than or equal to 1024"),
        (OPENAI, "workers.targetOldestAgeSeconds", 0,
         "workers.targetOldestAgeSeconds", "greater than or equal to 1"),
        (OPENAI, "workers.scaleDownStabilizationSeconds", -1,
         "workers.scaleDownStabilizationSeconds", "greater than or equal to 0"),
        (OPENAI, "paused", "yes", "paused", "valid boolean"),
        # DeliveryEndpoint
        (ENDPOINT, "url", ..., "url", "Field required"),
        (ENDPOINT, "url", "erp.acme.example/hook", "url", "pattern"),
        (ENDPOINT, "secretRef", ..., "secretRef", "Field required"),
        (ENDPOINT, "secretRef.name", "Erp", "secretRef.name", "pattern"),
        (ENDPOINT, "keyId", "key id", "keyId", "pattern"),
        (ENDPOINT, "retryBudget", {"maxAttempts": 0},
         "retryBudget.maxAttempts", "greater than or equal to 1"),
        (ENDPOINT, "retryBudget", {"maxAttempts": 101},
         "retryBudget.maxAttempts", "less than or equal to 100"),
        (ENDPOINT, "retryBudget", {"maxAgeSeconds": 0},
         "retryBudget.maxAgeSeconds", "greater than or equal to 1"),
        (BUILTIN, "defaultCurrency", "eur", "defaultCurrency", "pattern"),
        (BUILTIN, "defaultCurrency", "EURO", "defaultCurrency", "at most 3 characters"),
        (BUILTIN, "defaultCurrency", "", "defaultCurrency", "at least 3 characters"),
        # ExtractionBatch
        (INLINE, "schema", "invoice.v2", "schema", "'invoice.v1'"),
        (INLINE, "schema", ..., "schema", "Field required"),
        (INLINE, "inferencePoolRef", ..., "inferencePoolRef", "Field required"),
        (INLINE, "inferencePoolRef.namespace", "Lading", "inferencePoolRef.namespace",
         "pattern"),
        (INLINE, "deliveryEndpointRef", {"name": "erp", "namespace": "x"},
         "deliveryEndpointRef.namespace", "Extra inputs"),
        (INLINE, "priority", "urgent", "priority", "'high', 'normal' or 'low'"),
        (INLINE, "deadlineSeconds", 59, "deadlineSeconds", "greater than or equal to 60"),
        (INLINE, "deadlineSeconds", 30 * 86400 + 1, "deadlineSeconds",
         "less than or equal to 2592000"),
        (INLINE, "validationPolicy", "strict", "validationPolicy", "pattern"),
        (INLINE, "suspend", 1, "suspend", "valid boolean"),
        (INLINE, "documents", [], "documents", "at least 1 item"),
        (INLINE, "documents", [{"key": f"k{i}", "text": "t"} for i in range(1001)],
         "documents", "at most 1000 items"),
        (INLINE, "documents", [{"key": f"k{i}", "text": "é" * 30_000} for i in range(9)],
         "documents", "540000 bytes of text in UTF-8, more than 524288"),
        (INLINE, "documents", [{"key": "", "text": "t"}], "documents.0.key",
         "at least 1 character"),
        (INLINE, "documents", [{"key": "k" * 257, "text": "t"}], "documents.0.key",
         "at most 256 characters"),
        (INLINE, "documents", [{"key": "inv 1", "text": "t"}], "documents.0.key",
         "pattern"),
        (INLINE, "documents", [{"key": "/etc/passwd", "text": "t"}], "documents.0.key",
         "pattern"),
        (INLINE, "documents", [{"key": "a/../b", "text": "t"}], "documents.0.key",
         "'..' path segments"),
        (INLINE, "documents", [{"key": 1, "text": "t"}], "documents.0.key",
         "valid string"),
        (INLINE, "documents", [{"key": "k", "text": ""}], "documents.0.text",
         "at least 1 character"),
        (INLINE, "documents", [{"key": "k", "text": "é" * 40_000}], "documents.0.text",
         "80000 bytes in UTF-8"),
        (INLINE, "documents", [{"key": "k", "text": "t", "uri": "x"}],
         "documents.0.uri", "Extra inputs"),
        (INLINE, "manifestUri", "file:///data/m.jsonl", "manifestUri",
         "either documents or manifestUri, not both"),
        (INLINE, "documents", ..., "",
         "one of documents (inline) or manifestUri is required"),
        (BY_MANIFEST, "manifestUri", "ftp://h/m.jsonl", "manifestUri",
         "pattern"),
        (BY_MANIFEST, "manifestUri", "file://relative/m.jsonl",
         "manifestUri", "absolute path"),
        (BY_MANIFEST, "manifestUri", "https://", "manifestUri",
         "pattern"),
    ],
)
def test_bad_value_is_rejected_naming_the_field(
        case: Case,
        path: str,
        value: Any,
        field: str,
        message: str,
) -> None:
    model, base = case
    assert errors_of(model, base) == {}, "the base example must be valid"
    found = errors_of(model, with_(base, path, value))
    assert field in found, found
    assert message in found[field]


@pytest.mark.parametrize(
    ("model", "base", "path", "value", "field"),
    [
        (specs.ExtractionBatchSpec, BATCH, "documents", [{"key": "a", "text": "ok"}, {"key": "b", "text": "x\x00y"}],
         "documents.1.text"),
        (specs.ExtractionBatchSpec, BATCH, "documents", [{"key": "a", "text": "x\ud800y"}], "documents.0.text"),
        (specs.ExtractionBatchSpec, BATCH, "documents", [{"key": "a\x00", "text": "t"}], "documents.0.key"),
        (specs.ExtractionBatchSpec, {k: v for k, v in BATCH.items() if k != "documents"}, "manifestUri",
         "https://files.example/m\x00.jsonl", "manifestUri"),
        (specs.ExtractionBatchSpec, {k: v for k, v in BATCH.items() if k != "documents"}, "manifestUri",
         "file:///data/\udc80.jsonl", "manifestUri"),
        (specs.InferencePoolSpec, OPENAI_POOL, "endpoint", {"url": "https://x.example/v1\x00"}, "endpoint.url"),
        (specs.DeliveryEndpointSpec, DELIVERY_ENDPOINT, "url", "https://erp.example/\x00", "url"),
        (specs.InferencePoolSpec, OPENAI_POOL, "model", "qwen\x00", "model"),
    ],
)
def test_what_postgresql_cannot_store_is_an_invalid_spec_naming_the_field(
        model: type[pydantic.BaseModel],
        base: dict[str, Any],
        path: str,
        value: Any,
        field: str,
) -> None:
    """U+0000 and lone surrogates are refused by the model, saying so (not "must be a URL"), so the
    operator sets InvalidSpec instead of retrying a COPY that can never succeed."""
    with pytest.raises(pydantic.ValidationError) as caught:
        model.model_validate({**base, path: value})
    errors = caught.value.errors()
    assert len(errors) == 1, errors
    assert ".".join(str(part) for part in errors[0]["loc"]) == field
    assert errors[0]["type"] == "unstorable"
    assert "U+0000 (NUL)" in errors[0]["msg"] or "lone surrogate" in errors[0]["msg"]


def test_an_unstorable_text_names_its_document_key() -> None:
    documents = [{"key": "inv-1", "text": "fine"}, {"key": "inv-2", "text": "Total\x00 12.00"}]
    with pytest.raises(pydantic.ValidationError) as caught:
        specs.ExtractionBatchSpec.model_validate({**BATCH, "documents": documents})
    (error,) = caught.value.errors()
    assert error["msg"] == "document 'inv-2' contains U+0000 (NUL), which PostgreSQL text cannot store"
    assert "Total" not in error["msg"], "the text itself is never repeated"


def test_an_unstorable_uid_is_refused() -> None:
    with pytest.raises(pydantic.ValidationError) as caught:
        specs.Metadata.model_validate({"name": "b", "uid": "u\x00"})
    (error,) = caught.value.errors()
    assert error["loc"] == ("uid",) and error["type"] == "unstorable"


def test_duplicate_document_keys_are_named_with_their_positions() -> None:
    documents = [{"key": k, "text": "t"} for k in ("a", "b", "a", "c", "b", "a")]
    found = errors_of(specs.ExtractionBatchSpec, with_(BATCH, "documents", documents))
    assert found == {
        "documents": "Value error, duplicate document key "
        "'a' at documents[0] and documents[2] and documents[5]; 'b' at documents[1] and documents[4]"
    }


@pytest.mark.parametrize(
    ("model", "data"),
    [
        (specs.InferencePoolSpec, VLLM_POOL),
        (specs.InferencePoolSpec, with_(VLLM_POOL, "vllm", {"gpus": 2, "engineArgs": {"maxNumSeqs": 64}})),
        (specs.InferencePoolSpec, with_(BUILTIN_POOL, "builtin", {"latencyMs": 250})),
        (specs.InferencePoolSpec, with_(BUILTIN_POOL, "defaultCurrency", "EUR")),
        (specs.InferencePoolSpec, with_(OPENAI_POOL, "endpoint", {"url": "https://api.example.com/v1"})),
        (specs.ExtractionBatchSpec, with_(MANIFEST_BATCH, "manifestUri", "file:///d/m.jsonl")),
        (specs.ExtractionBatchSpec, with_(MANIFEST_BATCH, "manifestUri", "https://s.example/m")),
        (specs.ExtractionBatchSpec, with_(BATCH, "documents", [{"key": "2024/03/inv-1", "text": "é" * 99}])),
        (specs.DeliveryEndpointSpec, with_(DELIVERY_ENDPOINT, "retryBudget", {"maxAttempts": 100})),
        (specs.TenantQuotaSpec, with_(TENANT_QUOTA, "allowedPools", ["lading-system/qwen"])),
    ],
)
def test_good_variants_are_accepted(model: type[pydantic.BaseModel], data: dict[str, Any]) -> None:
    assert errors_of(model, data) == {}


def test_a_pools_default_currency_is_stored_under_its_yaml_name_and_read_back() -> None:
    spec = specs.InferencePoolSpec.model_validate(with_(BUILTIN_POOL, "defaultCurrency", "TRY"))
    stored = spec.model_dump(mode="json", by_alias=True)
    assert stored["defaultCurrency"] == "TRY"
    assert specs.stored_default_currency(stored) == "TRY"
    assert specs.stored_default_currency(specs.InferencePoolSpec.model_validate(BUILTIN_POOL).model_dump(
        mode="json", by_alias=True)) is None
    assert specs.stored_default_currency({}) is None  # a pool stored before the field existed


def test_a_stored_default_currency_that_is_no_iso_code_is_an_error_naming_it() -> None:
    with pytest.raises(ValueError, match="defaultCurrency 'euro', not an ISO 4217 code"):
        specs.stored_default_currency({"defaultCurrency": "euro"})


def test_retry_budget_defaults() -> None:
    budget = specs.RetryBudget.model_validate({})
    assert budget.max_attempts == 12
    assert budget.max_age_seconds == 86_400


def test_specs_are_immutable() -> None:
    batch = specs.ExtractionBatchSpec.model_validate(BATCH)
    with pytest.raises(pydantic.ValidationError):
        batch.suspend = True


def test_metadata_ignores_server_fields_and_requires_a_name() -> None:
    metadata = specs.Metadata.model_validate(
        {"name": "a.b", "resourceVersion": "42", "creationTimestamp": "2024-03-01T00:00:00Z"}
    )
    assert metadata.name == "a.b"
    assert errors_of(specs.Metadata, {"namespace": "acme"}) == {"name": "Field required"}
    assert "name" in errors_of(specs.Metadata, {"name": "Not_A_Name"})
    assert "name" in errors_of(specs.Metadata, {"name": "a" * 254})


def test_secret_merges_data_and_string_data_and_hides_both() -> None:
    secret = specs.Secret.model_validate(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "creds", "namespace": "acme"},
            "data": {
                "apiKey": base64.b64encode(b"sk-from-data").decode(),
                "shared": base64.b64encode(b"old").decode(),
            },
            "stringData": {"shared": "sk-from-string-data"},
        }
    )
    assert secret.values == {"apiKey": "sk-from-data", "shared": "sk-from-string-data"}
    assert secret.keys() == {"apiKey", "shared"}
    for text in (repr(secret), str(secret), repr(secret.data), str(secret.model_dump())):
        assert "sk-from" not in text
        assert base64.b64encode(b"sk-from-data").decode() not in text


def test_secret_errors_never_echo_the_value() -> None:
    with pytest.raises(pydantic.ValidationError) as caught:
        specs.Secret.model_validate({"metadata": {"name": "s"}, "data": {"apiKey": "sk-live-123!!"}})
    assert "sk-live-123" not in str(caught.value)
    assert "data.apiKey" in str(caught.value)


def test_secret_key_names_are_checked() -> None:
    found = errors_of(specs.Secret, {"metadata": {"name": "s"}, "stringData": {"bad key": "v"}})
    assert list(found) == ["stringData.bad key.[key]"]


def test_kind_constants_agree_with_the_literal_fields() -> None:
    kinds: tuple[type[specs.Resource], ...] = (*specs.LADING_KINDS, specs.Secret)
    for cls in kinds:
        assert cls.model_fields["api_version"].default == cls.API_VERSION
        assert cls.model_fields["kind"].default == cls.KIND
    assert {cls.KIND for cls in specs.LADING_KINDS} == {
        "TenantQuota", "InferencePool", "DeliveryEndpoint", "ExtractionBatch"
    }
    assert [cls.NAMESPACED for cls in specs.LADING_KINDS] == [False, True, True, True]


def _properties(schema: dict[str, Any], defs: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    found: list[tuple[str, dict[str, Any]]] = []
    for name, prop in schema.get("properties", {}).items():
        found.append((name, prop))
        for ref in _refs(prop):
            found.extend(_properties(defs[ref.rsplit("/", 1)[1]], defs))
    return found


def _refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        return ([node["$ref"]] if "$ref" in node else []) + [r for v in node.values() for r in _refs(v)]
    if isinstance(node, list):
        return [r for v in node for r in _refs(v)]
    return []


@pytest.mark.parametrize(
    "model",
    [specs.TenantQuotaSpec, specs.InferencePoolSpec, specs.DeliveryEndpointSpec, specs.ExtractionBatchSpec],
)
def test_every_spec_field_has_a_description_for_the_crd(model: type[pydantic.BaseModel]) -> None:
    schema = model.model_json_schema(by_alias=True)
    properties = _properties(schema, schema.get("$defs", {}))
    assert properties
    undocumented = [name for name, prop in properties if not prop.get("description")]
    assert undocumented == []
    assert all(not name.count("_") for name, _ in properties), "YAML names are camelCase"


def test_min_replicas_above_the_default_max_is_rejected() -> None:
    # The CRD's CEL rule sees the defaulted maxReplicas (10); the model must agree.
    with pytest.raises(pydantic.ValidationError, match=r"maxReplicas \(10\) must be at least minReplicas \(11\)"):
        specs.WorkerSettings.model_validate({"minReplicas": 11})


# --- InferencePool: vLLM deployment and scaling fields


def test_vllm_deployment_and_scaling_defaults() -> None:
    pool = specs.InferencePoolSpec.model_validate(VLLM_POOL)
    vllm = pool.vllm or specs.VllmSettings()
    assert (vllm.replicas, vllm.shm_size, vllm.node_selector, vllm.tolerations) == (1, "8Gi", None, None)
    assert vllm.model_cache == specs.ModelCache(claim_name=None, size_limit="100Gi")
    assert (pool.workers.idle_seconds, pool.workers.scaling) == (600, "builtin")


def test_vllm_deployment_fields_round_trip_in_camel_case() -> None:
    data = with_(VLLM_POOL, "vllm", {
        "replicas": 2,
        "shmSize": "16Gi",
        "modelCache": {"claimName": "hf-cache"},
        "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    })
    data = with_(data, "workers", {"scaling": "keda", "idleSeconds": 0})
    pool = specs.InferencePoolSpec.model_validate(data)
    dumped = pool.model_dump(by_alias=True, exclude_none=True)
    assert dumped["vllm"]["modelCache"] == {"claimName": "hf-cache", "sizeLimit": "100Gi"}
    assert dumped["workers"]["idleSeconds"] == 0 and dumped["workers"]["scaling"] == "keda"
    assert specs.InferencePoolSpec.model_validate(dumped) == pool


@pytest.mark.parametrize(
    ("path", "value", "field", "message"),
    [
        ("vllm.replicas", 0, "vllm.replicas", "greater than or equal to 1"),
        ("vllm.replicas", 65, "vllm.replicas", "less than or equal to 64"),
        ("vllm.shmSize", "lots", "vllm.shmSize", "pattern"),
        ("vllm.modelCache", {"claimName": "Bad_Name"}, "vllm.modelCache.claimName", "pattern"),
        ("vllm.modelCache", {"sizeLimit": "1 TB"}, "vllm.modelCache.sizeLimit", "pattern"),
        ("vllm.nodeSelector", {"gpu": "x" * 64}, "vllm.nodeSelector.gpu", "at most 63"),
        ("vllm.tolerations", [{"key": "gpu", "operator": "Exists", "value": "yes"}], "vllm.tolerations.0.value",
         "operator Exists takes no value"),
        ("vllm.tolerations", [{"operator": "Sometimes"}], "vllm.tolerations.0.operator", "'Exists' or 'Equal'"),
        ("vllm.tolerations", [{"effect": "NoWay"}], "vllm.tolerations.0.effect", "NoSchedule"),
        ("vllm.tolerations", [{"key": "k"}] * 33, "vllm.tolerations", "at most 32 items"),
        ("workers.idleSeconds", -1, "workers.idleSeconds", "greater than or equal to 0"),
        ("workers.idleSeconds", 86_401, "workers.idleSeconds", "less than or equal to 86400"),
        ("workers.scaling", "hpa", "workers.scaling", "'builtin' or 'keda'"),
    ],
)
def test_bad_vllm_deployment_or_scaling_value_is_rejected(path: str, value: Any, field: str, message: str) -> None:
    found = errors_of(specs.InferencePoolSpec, with_(VLLM_POOL, path, value))
    assert field in found, found
    assert message in found[field]
