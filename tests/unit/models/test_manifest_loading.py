"""Loading manifest sets: the DESIGN.md example, error messages that point at the YAML, cross-references."""

from __future__ import annotations

import base64
import pathlib
import textwrap

import pytest

from lading import errors
from lading.models import manifests, specs

# DESIGN.md §3, verbatim, plus the Secret its InferencePool's apiKeySecretRef names.
DESIGN_EXAMPLE = """\
apiVersion: lading.dev/v1alpha1
kind: TenantQuota                     # cluster-scoped
metadata: {name: acme}
spec:
  namespaces: [acme]                  # batches in these namespaces belong to tenant "acme"
  maxQueuedJobs: 50000
  maxInFlight: 64
  weight: 1
---
apiVersion: lading.dev/v1alpha1
kind: InferencePool
metadata: {name: qwen, namespace: lading-system}
spec:
  provider: openai-compatible         # builtin | openai-compatible | vllm
  model: Qwen/Qwen2.5-7B-Instruct
  endpoint:                           # openai-compatible only
    url: http://127.0.0.1:8000/v1
    apiKeySecretRef: {name: qwen-key, key: apiKey}   # optional
  limits: {requestsPerMinute: 600, tokensPerMinute: 200000, maxConcurrency: 32}
  workers: {minReplicas: 0, maxReplicas: 10, concurrency: 32, targetOldestAgeSeconds: 120}
---
apiVersion: v1
kind: Secret
metadata: {name: erp-signing, namespace: acme}
stringData: {secret: whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw}
---
apiVersion: lading.dev/v1alpha1
kind: DeliveryEndpoint
metadata: {name: erp, namespace: acme}
spec:
  url: https://erp.acme.example/webhooks/lading
  secretRef: {name: erp-signing, key: secret}
---
apiVersion: lading.dev/v1alpha1
kind: ExtractionBatch
metadata: {name: march-invoices, namespace: acme}
spec:
  schema: invoice.v1
  inferencePoolRef: {name: qwen, namespace: lading-system}
  deliveryEndpointRef: {name: erp}
  priority: normal                    # high | normal | low
  deadlineSeconds: 21600
  documents:                          # inline, small batches
    - {key: inv-0001, text: "..."}
  # manifestUri: file:///data/march/manifest.jsonl   # large batches
---
apiVersion: v1
kind: Secret
metadata: {name: qwen-key, namespace: lading-system}
data: {apiKey: c2stcXdlbi10b3Atc2VjcmV0}    # sk-qwen-top-secret
"""
QWEN_KEY = "sk-qwen-top-secret"
ERP_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

QUOTA = """\
apiVersion: lading.dev/v1alpha1
kind: TenantQuota
metadata: {name: acme}
spec: {namespaces: [acme]}
"""
POOL = """\
apiVersion: lading.dev/v1alpha1
kind: InferencePool
metadata: {name: fake, namespace: acme}
spec: {provider: builtin}
"""


def batch(name: str = "b1", *, namespace: str = "acme", extra: str = "") -> str:
    return textwrap.dedent(f"""\
        apiVersion: lading.dev/v1alpha1
        kind: ExtractionBatch
        metadata: {{name: {name}, namespace: {namespace}}}
        spec:
          schema: invoice.v1
          inferencePoolRef: {{name: fake, namespace: acme}}
          documents: [{{key: inv-1, text: hello}}]
        """) + textwrap.indent(extra, "  ")


def docs(*documents: str) -> str:
    return "---\n".join(documents)


def problems(text: str, *, source: str = "m.yaml") -> list[str]:
    with pytest.raises(errors.ManifestError) as caught:
        manifests.load_text(text, source=source)
    header, *lines = str(caught.value).splitlines()
    assert header == f"{len(lines)} problem{'s' if len(lines) != 1 else ''} in manifests:"
    return [line.removeprefix("  ") for line in lines]


def test_design_example_loads() -> None:
    loaded = manifests.load_text(DESIGN_EXAMPLE, source="design.yaml")

    assert [q.resource.name for q in loaded.tenant_quotas] == ["acme"]
    assert [p.resource.display_name for p in loaded.inference_pools] == ["lading-system/qwen"]
    assert [e.resource.display_name for e in loaded.delivery_endpoints] == ["acme/erp"]
    assert [b.resource.display_name for b in loaded.extraction_batches] == ["acme/march-invoices"]
    secrets = sorted(s.resource.display_name for s in loaded.secrets)
    assert secrets == ["acme/erp-signing", "lading-system/qwen-key"]

    batch = loaded.extraction_batches[0]
    assert (batch.source, batch.document, batch.item) == ("design.yaml", 5, None)
    assert batch.where == "design.yaml: document 5 (ExtractionBatch acme/march-invoices)"
    assert batch.resource.spec.pool_key(batch_namespace="acme") == "lading-system/qwen"
    assert loaded.tenant_quotas[0].resource.namespace is None

    pool = loaded.inference_pools[0].resource.spec
    assert pool.endpoint is not None and pool.endpoint.api_key_secret_ref is not None
    assert loaded.secret_value(namespace="lading-system", ref=pool.endpoint.api_key_secret_ref) == QWEN_KEY
    endpoint = loaded.delivery_endpoints[0].resource
    assert loaded.secret_value(namespace="acme", ref=endpoint.spec.secret_ref) == ERP_SECRET


def test_secret_value_of_an_unknown_secret_or_key_is_a_key_error() -> None:
    loaded = manifests.load_text(DESIGN_EXAMPLE, source="design.yaml")
    with pytest.raises(KeyError, match="no Secret acme/nope"):
        loaded.secret_value(namespace="acme", ref=specs.SecretKeyRef(name="nope", key="x"))
    with pytest.raises(KeyError, match="has no key 'x'"):
        loaded.secret_value(namespace="acme", ref=specs.SecretKeyRef(name="erp-signing", key="x"))


def test_secret_values_never_appear_in_repr_or_str() -> None:
    loaded = manifests.load_text(DESIGN_EXAMPLE, source="design.yaml")
    encoded = base64.b64encode(QWEN_KEY.encode()).decode()
    shown = [repr(loaded), str(loaded)]
    shown += [f(s) for s in loaded.secrets for f in (repr, str)]
    shown += [f(s.resource) for s in loaded.secrets for f in (repr, str)]
    for text in shown:
        assert QWEN_KEY not in text
        assert encoded not in text
        assert ERP_SECRET not in text


def test_secret_values_never_appear_in_error_messages() -> None:
    text = docs(
        "apiVersion: v1\nkind: Secret\nmetadata: {name: s1}\n"
        "data: {apiKey: 'sk-live-not-base64!'}\nstringData: {'bad key': sk-live-other, port: 5432}\n",
        "apiVersion: v1\nkind: Secret\nmetadata: {name: s2}\n"
        "stringData: {k: sk-live-third}\nextra: sk-live-4\n",
    )
    found = problems(text)
    assert len(found) == 4
    assert not [line for line in found if "sk-live" in line]
    assert "m.yaml: document 1 (Secret default/s1): data.apiKey: not valid base64" in found[0]
    assert found[3] == "m.yaml: document 2 (Secret default/s2): extra: unknown field"


def test_error_names_file_document_kind_and_camel_case_path() -> None:
    text = DESIGN_EXAMPLE.replace("maxReplicas: 10", "maxReplicas: 0")
    assert problems(text, source="examples/acme.yaml") == [
        "examples/acme.yaml: document 2 (InferencePool lading-system/qwen): spec.workers.maxReplicas: "
        "Input should be greater than or equal to 1 (got 0)",
    ]


def test_cross_field_error_points_at_the_field_to_fix() -> None:
    text = DESIGN_EXAMPLE.replace("minReplicas: 0, maxReplicas: 10", "minReplicas: 5, maxReplicas: 2")
    assert problems(text) == [
        "m.yaml: document 2 (InferencePool lading-system/qwen): spec.workers.maxReplicas: "
        "maxReplicas (2) must be at least minReplicas (5)",
    ]


def test_list_index_appears_in_the_path() -> None:
    documents = "documents:\n" + "".join(f"  - {{key: inv-{i}, text: t}}\n" for i in range(3))
    documents += "  - {key: 'inv 3', text: t}\n"
    text = docs(QUOTA, POOL, batch(extra=documents).replace("  documents: [{key: inv-1, text: hello}]\n", ""))
    assert problems(text) == [
        "m.yaml: document 3 (ExtractionBatch acme/b1): spec.documents[3].key: must be a document key "
        "(letters, digits, '.', '_', '-' and '/', not starting with '/') (got 'inv 3')",
    ]


def test_duplicate_document_keys_are_reported_by_key() -> None:
    documents = "documents: [{key: a, text: x}, {key: b, text: y}, {key: a, text: z}]"
    text = docs(QUOTA, POOL, batch().replace("documents: [{key: inv-1, text: hello}]", documents))
    assert problems(text) == [
        "m.yaml: document 3 (ExtractionBatch acme/b1): spec.documents: "
        "duplicate document key 'a' at documents[0] and documents[2]",
    ]


def test_all_problems_of_all_files_are_reported_together(tmp_path: pathlib.Path) -> None:
    first = tmp_path / "a.yaml"
    first.write_text(docs(QUOTA, POOL.replace("builtin", "ollama"), batch(extra="priority: urgent\n")))
    second = tmp_path / "b.yaml"
    second.write_text(batch("b2", extra="deadlineSeconds: 10\nsuspend: maybe\n"))

    with pytest.raises(errors.ManifestError) as caught:
        manifests.load_paths([first, second])

    message = str(caught.value)
    assert message.startswith("4 problems in manifests:\n")
    assert f"{first}: document 2 (InferencePool acme/fake): spec.provider: Input should be" in message
    assert f"{first}: document 3 (ExtractionBatch acme/b1): spec.priority: Input should be" in message
    assert f"{second}: document 1 (ExtractionBatch acme/b2): spec.deadlineSeconds: Input should be" in message
    assert f"{second}: document 1 (ExtractionBatch acme/b2): spec.suspend: Input should be a valid" in message


def test_several_problems_in_one_document_are_all_reported() -> None:
    spec = "schema: invoice.v2\n  priority: low\n  weight: 3"
    text = docs(QUOTA, batch().replace("schema: invoice.v1", spec))
    found = problems(text)
    assert [line.split(": ")[2] for line in found] == ["spec.schema", "spec.weight"]


def test_unknown_kind_or_api_version_names_both() -> None:
    text = docs(
        "apiVersion: lading.dev/v1beta1\nkind: ExtractionBatch\nmetadata: {name: x}\n",
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\n",
        "kind: TenantQuota\nmetadata: {name: x}\n",
    )
    found = problems(text)
    assert found[0].startswith(
        "m.yaml: document 1: unknown apiVersion lading.dev/v1beta1 with kind ExtractionBatch; "
        "this version of Lading reads lading.dev/v1alpha1 TenantQuota"
    )
    assert found[1].startswith("m.yaml: document 2: unknown apiVersion apps/v1 with kind Deployment")
    assert found[2].startswith("m.yaml: document 3: apiVersion missing")


def test_missing_metadata_name_is_an_error() -> None:
    text = docs(QUOTA, POOL.replace("name: fake, ", ""))
    assert problems(text) == [
        "m.yaml: document 2 (InferencePool acme/<no name>): metadata.name: required field is missing",
    ]


def test_namespaced_kinds_default_to_the_default_namespace() -> None:
    text = docs(
        QUOTA.replace("[acme]", "[default]"),
        POOL.replace(", namespace: acme", ""),
        batch(namespace="default").replace("{name: fake, namespace: acme}", "{name: fake}"),
    )
    loaded = manifests.load_text(text, source="m.yaml")
    assert loaded.inference_pools[0].resource.namespace == "default"
    assert loaded.extraction_batches[0].resource.metadata.namespace == "default"
    assert loaded.tenant_quotas[0].resource.namespace is None


def test_tenant_quota_is_cluster_scoped() -> None:
    text = QUOTA.replace("{name: acme}", "{name: acme, namespace: acme}")
    assert problems(text) == [
        "m.yaml: document 1 (TenantQuota acme/acme): metadata.namespace: TenantQuota is cluster-scoped; "
        "remove metadata.namespace",
    ]


def test_duplicate_objects_across_files_are_errors(tmp_path: pathlib.Path) -> None:
    (tmp_path / "1-base.yaml").write_text(docs(QUOTA, POOL))
    (tmp_path / "2-again.yml").write_text(docs(POOL, POOL.replace("namespace: acme", "namespace: other")))
    (tmp_path / "notes.txt").write_text("not yaml: [")

    with pytest.raises(errors.ManifestError) as caught:
        manifests.load_paths([tmp_path])

    assert str(caught.value).splitlines()[1:] == [
        f"  {tmp_path}/2-again.yml: document 1 (InferencePool acme/fake): metadata.name: duplicate "
        f"InferencePool acme/fake, first defined at {tmp_path}/1-base.yaml: document 2",
    ]


def test_same_name_in_another_kind_or_namespace_is_fine() -> None:
    text = docs(
        QUOTA,
        POOL,
        POOL.replace("namespace: acme", "namespace: other"),
        "apiVersion: v1\nkind: Secret\nmetadata: {name: fake, namespace: acme}\n",
    )
    loaded = manifests.load_text(text, source="m.yaml")
    assert len(loaded.inference_pools) == 2


@pytest.mark.parametrize(
    ("replace", "by", "expected"),
    [
        (
            "inferencePoolRef: {name: qwen, namespace: lading-system}",
            "inferencePoolRef: {name: qwen}",
            "m.yaml: document 5 (ExtractionBatch acme/march-invoices): spec.inferencePoolRef: "
            "InferencePool acme/qwen is not in the manifests",
        ),
        (
            "deliveryEndpointRef: {name: erp}",
            "deliveryEndpointRef: {name: sap}",
            "m.yaml: document 5 (ExtractionBatch acme/march-invoices): spec.deliveryEndpointRef: "
            "DeliveryEndpoint acme/sap is not in the manifests",
        ),
        (
            "secretRef: {name: erp-signing, key: secret}",
            "secretRef: {name: erp-signing, key: signingSecret}",
            "m.yaml: document 4 (DeliveryEndpoint acme/erp): spec.secretRef: "
            "Secret acme/erp-signing has no key 'signingSecret' (keys: secret)",
        ),
        (
            "apiKeySecretRef: {name: qwen-key, key: apiKey}",
            "apiKeySecretRef: {name: openai-key, key: apiKey}",
            "m.yaml: document 2 (InferencePool lading-system/qwen): spec.endpoint.apiKeySecretRef: "
            "Secret lading-system/openai-key is not in the manifests",
        ),
        (
            "namespaces: [acme]",
            "namespaces: [globex]",
            "m.yaml: document 5 (ExtractionBatch acme/march-invoices): metadata.namespace: "
            "namespace acme is not covered by any TenantQuota",
        ),
    ],
)
def test_broken_reference_is_an_error(replace: str, by: str, expected: str) -> None:
    assert replace in DESIGN_EXAMPLE
    assert problems(DESIGN_EXAMPLE.replace(replace, by)) == [expected]


@pytest.mark.parametrize(
    "rule", ["allowedPriorities: [high, low]", "allowedPools: [lading-system/llama]"]
)
def test_what_a_quota_allows_is_left_to_admission(rule: str) -> None:
    # lading.applying.check_batch enforces a quota's rules, once, for every intake.
    loaded = manifests.load_text(DESIGN_EXAMPLE.replace("weight: 1", f"weight: 1\n  {rule}"), source="m.yaml")
    assert len(loaded.extraction_batches) == 1


def test_vllm_hf_token_secret_is_checked() -> None:
    pool = POOL.replace(
        "spec: {provider: builtin}",
        "spec: {provider: vllm, model: m, vllm: {hfTokenSecretRef: {name: hf, key: token}}}",
    )
    assert problems(docs(QUOTA, pool)) == [
        "m.yaml: document 2 (InferencePool acme/fake): spec.vllm.hfTokenSecretRef: "
        "Secret acme/hf is not in the manifests",
    ]


def test_a_namespace_belongs_to_one_tenant_quota() -> None:
    text = docs(QUOTA, QUOTA.replace("{name: acme}", "{name: acme-2}").replace("[acme]", "[beta, acme]"))
    assert problems(text) == [
        "m.yaml: document 2 (TenantQuota acme-2): spec.namespaces[1]: namespace acme is already covered "
        "by TenantQuota acme (m.yaml: document 1); a namespace belongs to one tenant",
    ]


def test_reference_to_an_invalid_object_reports_only_the_invalid_object() -> None:
    text = docs(QUOTA.replace("spec: {", "spec: {weight: 0, "), POOL.replace("builtin", "nope"), batch())
    found = problems(text)
    assert len(found) == 2
    assert found[0].startswith("m.yaml: document 1 (TenantQuota acme): spec.weight:")
    assert found[1].startswith("m.yaml: document 2 (InferencePool acme/fake): spec.provider:")


def test_yaml_syntax_error_names_file_and_line() -> None:
    text = docs(QUOTA, "apiVersion: v1\nkind: Secret\nmetadata: {name: [unclosed\n")
    found = problems(text, source="bad.yaml")
    assert len(found) == 1
    assert found == [
        "bad.yaml: line 9, column 1: invalid YAML: expected ',' or ']', but got '<stream end>' "
        "(while parsing a flow sequence at line 8, column 18)",
    ]


def test_repeated_mapping_key_is_an_error_not_a_silent_overwrite() -> None:
    text = docs(QUOTA, POOL + "spec: {provider: vllm}\n")
    assert problems(text) == [
        "m.yaml: line 10, column 1: invalid YAML: found duplicate key 'spec' "
        "(while constructing a mapping at line 6, column 1)",
    ]


def test_yaml_merge_keys_still_work() -> None:
    merged = "x: &base {provider: builtin}\nspec: {<<: *base}"
    text = docs(QUOTA, POOL.replace("spec: {provider: builtin}", merged))
    assert "x: unknown field" in problems(text)[0]


def test_kind_list_items_are_loaded() -> None:
    text = textwrap.dedent("""\
        apiVersion: v1
        kind: List
        metadata: {resourceVersion: ""}
        items:
        - {apiVersion: lading.dev/v1alpha1, kind: TenantQuota, metadata: {name: acme},
           spec: {namespaces: [acme]}}
        - {apiVersion: lading.dev/v1alpha1, kind: InferencePool, metadata: {name: fake, namespace: acme},
           spec: {provider: builtin, workers: {concurrency: 0}}}
        - {apiVersion: v1, kind: List, items: []}
        """)
    assert problems(text) == [
        "m.yaml: document 1, items[1] (InferencePool acme/fake): spec.workers.concurrency: "
        "Input should be greater than or equal to 1 (got 0)",
        "m.yaml: document 1, items[2]: a List inside a List is not supported",
    ]
    valid = text.replace("concurrency: 0", "concurrency: 1").rsplit("- {apiVersion: v1", 1)[0]
    loaded = manifests.load_text(valid, source="m.yaml")
    assert loaded.inference_pools[0].item == 1
    assert loaded.inference_pools[0].location == "m.yaml: document 1, items[1]"


def test_empty_documents_are_skipped_but_counted() -> None:
    text = "---\n# only a comment\n---\n" + QUOTA + "---\n---\n" + POOL.replace("builtin", "vllm") + "---\n"
    assert problems(text) == [
        "m.yaml: document 4 (InferencePool acme/fake): spec.model: model is required when provider is vllm",
    ]
    assert manifests.load_text("", source="empty.yaml") == manifests.Manifests()


def test_document_that_is_not_a_mapping_is_an_error() -> None:
    assert problems("- a\n- b\n") == [
        "m.yaml: document 1: expected a mapping with apiVersion and kind, got a list",
    ]


def test_snake_case_and_misspelt_fields_are_unknown_with_a_hint() -> None:
    spec = "{provider: builtin, workers: {max_replicas: 2}, pasued: true}"
    text = docs(QUOTA, POOL.replace("{provider: builtin}", spec))
    assert problems(text) == [
        "m.yaml: document 2 (InferencePool acme/fake): spec.workers.max_replicas: unknown field "
        "(did you mean maxReplicas?)",
        "m.yaml: document 2 (InferencePool acme/fake): spec.pasued: unknown field (did you mean paused?)",
    ]


def test_yaml_types_are_taken_literally() -> None:
    quota = QUOTA.replace("spec: {", "spec: {maxInFlight: '64', ")
    text = docs(quota, batch().replace("key: inv-1", "key: 0001"))
    found = problems(text)
    assert "spec.maxInFlight: Input should be a valid integer (got '64')" in found[0]
    assert "spec.documents[0].key: Input should be a valid string (got 1)" in found[1]


def test_manifest_uri_batch_loads() -> None:
    text = docs(QUOTA, POOL, batch().replace("documents: [{key: inv-1, text: hello}]",
                                             "manifestUri: file:///data/march/manifest.jsonl"))
    loaded = manifests.load_text(text, source="m.yaml")
    assert loaded.extraction_batches[0].resource.spec.manifest_uri == "file:///data/march/manifest.jsonl"


def test_both_or_neither_document_source_is_an_error() -> None:
    both = batch(extra="manifestUri: https://files.example/m.jsonl\n")
    neither = batch("b2").replace("  documents: [{key: inv-1, text: hello}]\n", "")
    assert problems(docs(QUOTA, POOL, both, neither)) == [
        "m.yaml: document 3 (ExtractionBatch acme/b1): spec.manifestUri: "
        "set either documents or manifestUri, not both",
        "m.yaml: document 4 (ExtractionBatch acme/b2): spec: "
        "one of documents (inline) or manifestUri is required",
    ]


def test_unreadable_path_is_reported(tmp_path: pathlib.Path) -> None:
    with pytest.raises(errors.ManifestError, match=r"missing\.yaml: cannot read: .*No such file"):
        manifests.load_paths([tmp_path / "missing.yaml"])


def test_a_flood_of_problems_is_cut_short() -> None:
    text = docs(*(f"apiVersion: v1\nkind: Nope\nmetadata: {{name: n{i}}}\n" for i in range(250)))
    with pytest.raises(errors.ManifestError) as caught:
        manifests.load_text(text, source="m.yaml")
    lines = str(caught.value).splitlines()
    assert lines[0] == "250 problems in manifests:"
    assert len(lines) == 1 + manifests.MAX_PROBLEMS_SHOWN + 1
    assert lines[-1] == "  … and 50 more"
