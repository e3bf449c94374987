"""
Spec models of Lading's custom resources (group `lading.dev`, version `v1alpha1`) and of the
core Kubernetes objects a manifest set may carry (Secret).

These models are the one definition of what a user may write: the CRDs' openAPIV3Schema is
generated from them (so every bound and every `description` here ends up in `kubectl explain`),
the operator parses `spec` with them, and `lading run` loads manifest files with them
(`lading.models.manifests`). Field names are the public contract of DESIGN.md §3: Python uses
snake_case, YAML uses camelCase (the alias generator), and unknown fields are errors.

What this module does not own:
- reading files, YAML, cross-resource references (a batch naming a pool that exists, a Secret
  that has the key, a namespace some TenantQuota covers): `lading.models.manifests`;
- status: written by the operator, modelled next to its reconcilers;
- defaulting of `metadata.namespace`: done by whoever knows the context (the loader, the API
  server).

Rules that involve two fields (maxReplicas >= minReplicas, "model is required for vllm") are
field validators on the later field, so an error points at the field to fix
(`spec.workers.maxReplicas`), not at the whole spec. The CRD generator must restate them as CEL
`x-kubernetes-validations`; they cannot be derived from the JSON schema.
"""

from __future__ import annotations

import base64
import binascii
import collections
import collections.abc
import re
import urllib.parse
from typing import Annotated, ClassVar, Literal

import pydantic
import pydantic.alias_generators
import pydantic_core

from lading import costing, storable

GROUP = "lading.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"

# --- Patterns. Kubernetes' own where one exists, so a manifest valid here is valid in a cluster.

DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
SECRET_KEY_PATTERN = r"^[-._a-zA-Z0-9]+$"
POOL_KEY_PATTERN = (
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?/[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)
HTTP_URL_PATTERN = r"^https?://[^\s/?#\x00]+[^\s\x00]*$"
MANIFEST_URI_PATTERN = r"^(file://|https?://)[^\s\x00]+$"
STORABLE_TEXT_PATTERN = r"^[^\x00]*$"
"""Free text: anything but U+0000, which PostgreSQL `text` cannot store. The CRD carries it so the
API server refuses such an object at `kubectl apply`; the models also refuse lone surrogates (which
the API server's JSON decoder replaces, but a YAML file given to `lading run` can hold)."""
DOCUMENT_KEY_PATTERN = r"^[A-Za-z0-9._-][A-Za-z0-9._/-]*$"
VALIDATION_POLICY_PATTERN = r"^[a-z0-9-]+-v\d+$"
CURRENCY_CODE_PATTERN = r"^[A-Z]{3}$"
"""An ISO 4217 alphabetic code (`EUR`, `TRY`), upper case as the standard writes it."""
MODEL_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]*$"
IMAGE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._/:@-]*$"
KEY_ID_PATTERN = r"^[A-Za-z0-9._-]+$"
LABEL_KEY_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$"
QUANTITY_PATTERN = r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|k|M|G|T|P)?$"
CPU_QUANTITY_PATTERN = r"^([0-9]+m|[0-9]+(\.[0-9]{1,3})?)$"
"""CPUs as Kubernetes writes them: whole or decimal cores (`4`, `0.5`) or millicores (`500m`)."""
ENV_NAME_PATTERN = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"
VLLM_RENDERED_ARGS = frozenset({"--host", "--port", "--served-model-name", "--tensor-parallel-size"})
"""`vllm serve` flags the operator renders itself: the Service and the workers depend on them."""
VLLM_RENDERED_ENV = frozenset({"HF_HOME", "HF_TOKEN", "VLLM_NO_USAGE_STATS", "DO_NOT_TRACK"})
"""Environment variables of the vLLM container the operator renders itself."""
DECIMAL_AMOUNT_PATTERN = costing.DECIMAL_PATTERN
"""A price or an amount of money as a decimal string (`"0.15"`, `"500.00"`): exact, never a float."""

PATTERN_HINTS: dict[str, str] = {
    DNS_LABEL_PATTERN: "a DNS-1123 label (lowercase letters, digits and '-', starting and ending "
    "with a letter or digit)",
    DNS_SUBDOMAIN_PATTERN: "a DNS-1123 subdomain (lowercase letters, digits, '-' and '.', starting "
    "and ending with a letter or digit)",
    SECRET_KEY_PATTERN: "a Secret key (letters, digits, '-', '_' and '.')",
    POOL_KEY_PATTERN: "'namespace/name' of an InferencePool",
    HTTP_URL_PATTERN: "an http:// or https:// URL with a host and no spaces",
    MANIFEST_URI_PATTERN: "a file://, http:// or https:// URI with no spaces",
    STORABLE_TEXT_PATTERN: "text without U+0000 (NUL), which PostgreSQL cannot store",
    DOCUMENT_KEY_PATTERN: "a document key (letters, digits, '.', '_', '-' and '/', not starting with '/')",
    VALIDATION_POLICY_PATTERN: "a versioned policy name such as 'invoice-strict-v1'",
    MODEL_NAME_PATTERN: "a model name (letters, digits and . _ : / @ + -)",
    IMAGE_PATTERN: "a container image reference such as 'vllm/vllm-openai:v0.8.5'",
    KEY_ID_PATTERN: "a key id (letters, digits, '.', '_' and '-')",
    LABEL_KEY_PATTERN: "a label key ('prefix/name', name at most 63 characters)",
    LABEL_VALUE_PATTERN: "a label value (at most 63 letters, digits, '-', '_' and '.', starting and "
    "ending with a letter or digit)",
    QUANTITY_PATTERN: "a size such as '8Gi' or '500Mi'",
    DECIMAL_AMOUNT_PATTERN: "a decimal amount such as '0.15' (digits, an optional '.' and at most 9 decimal "
    "places, at most 12 digits before it, no sign or exponent)",
}
"""A human phrase for each pattern above, so error messages say "must be a DNS-1123 label"
instead of printing a regular expression. The loader completes it to "must be <hint>"."""

# --- Defaults, and why.

MAX_QUEUED_JOBS_DEFAULT = 100_000
"""Room for twenty large batches per tenant before admission says "quota exhausted"."""
MAX_IN_FLIGHT_DEFAULT = 64
"""Two workers at the default concurrency: enough for one tenant to saturate a small pool."""
REQUESTS_PER_MINUTE_DEFAULT = 600
"""Ten requests a second: a conservative start; raise it to what the provider really allows."""
TOKENS_PER_MINUTE_DEFAULT = 200_000
"""About 130 invoice extractions a minute at ~1,500 tokens each."""
MAX_CONCURRENCY_DEFAULT = 32
"""One worker's worth of requests in flight against the model at once."""
WORKER_CONCURRENCY_DEFAULT = 32
"""Model calls are I/O-bound for a worker; 32 keeps a vLLM replica's batch busy."""
TARGET_OLDEST_AGE_S_DEFAULT = 120
"""Scale up once the oldest eligible job has waited two minutes."""
SCALE_DOWN_STABILIZATION_S_DEFAULT = 300
"""Five minutes, like the HorizontalPodAutoscaler's default: do not flap between bursts."""
DEADLINE_S_DEFAULT = 21_600
"""Six hours: an overnight-batch style deadline that still fails loudly within a working day."""
DEADLINE_S_MAX = 30 * 24 * 3600
"""Thirty days: longer than any retry budget; a batch that old is abandoned, not slow."""
VALIDATION_POLICY_DEFAULT = "invoice-strict-v2"
"""New batches are judged by the strictest policy; a batch stores its policy's name, so batches
admitted under invoice-strict-v1 keep it (docs/validation.md)."""
RETRY_MAX_ATTEMPTS_DEFAULT = 12
"""With backoff, enough attempts to ride out an ERP maintenance window; maxAgeSeconds bounds the time."""
RETRY_MAX_AGE_S_DEFAULT = 86_400
"""One day; after that the delivery goes terminal and needs a human."""
VLLM_IMAGE_DEFAULT = "vllm/vllm-openai:v0.19.1"
"""Pinned, never `latest`: an image change restarts every model server."""
GPU_MEMORY_UTILIZATION_DEFAULT = 0.9
"""vLLM's own default."""
SHM_SIZE_DEFAULT = "8Gi"
"""/dev/shm for vLLM's worker processes (NCCL, tensor parallelism); the container runtime's 64 MiB
default makes multi-GPU replicas crash at start."""
MODEL_CACHE_SIZE_DEFAULT = "100Gi"
"""Room for a 7B-32B model's weights in the scratch cache when no PersistentVolumeClaim is named."""
IDLE_S_DEFAULT = 600
"""Ten minutes without eligible jobs or running calls before an idle pool scales to zero: long
enough that a trickle of batches does not pay a model load (minutes for vLLM) every time."""

INLINE_DOCUMENTS_MAX = 1000
"""Above this, use manifestUri: the whole ExtractionBatch object must fit in etcd (~1.5 MiB)."""
INLINE_TEXT_MAX_BYTES = 64 * 1024
"""One document's OCR text, UTF-8 encoded: a long invoice is ~20 KiB; larger documents go by manifestUri."""
INLINE_TOTAL_TEXT_MAX_BYTES = 512 * 1024
"""All inline texts of one batch together. The per-item bounds alone would allow 64 MiB; this keeps
an ExtractionBatch (texts, keys, JSON escaping, status) far below etcd's 1.5 MiB object limit.
The CRD restates it as a CEL rule on the sum of text lengths (in characters: CEL has no cheap byte count)."""

# --- Reusable constrained types.

Priority = Literal["high", "normal", "low"]
PRIORITIES: tuple[Priority, ...] = ("high", "normal", "low")
ResultReuse = Literal["tenant", "none"]
"""TenantQuota spec.resultReuse: where a document may take an earlier accepted result from (docs/reuse.md)."""
ProviderName = Literal["builtin", "openai-compatible", "vllm"]
SchemaName = Literal["invoice.v1"]


def _check_http_url(value: str) -> str:
    parts = urllib.parse.urlsplit(value)
    try:
        parts.port  # noqa: B018 - parsing the port is the check
    except ValueError as exc:
        raise ValueError(f"invalid port in URL: {exc}") from None
    if not parts.hostname:
        raise ValueError("the URL has no host")
    if parts.username is not None or parts.password is not None:
        raise ValueError("the URL must not carry credentials; reference a Secret instead")
    return value


def _check_manifest_uri(value: str) -> str:
    parts = urllib.parse.urlsplit(value)
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
            raise ValueError("a file:// URI needs an absolute path, e.g. file:///data/manifest.jsonl")
        return value
    return _check_http_url(value)


def _check_document_key(value: str) -> str:
    if any(segment in ("", ".", "..") for segment in value.split("/")):
        raise ValueError("a document key must not contain empty, '.' or '..' path segments")
    return value


def _check_text_size(value: str) -> str:
    size = len(value) if value.isascii() else len(value.encode("utf-8"))
    if size > INLINE_TEXT_MAX_BYTES:
        raise ValueError(
            f"text is {size} bytes in UTF-8, more than {INLINE_TEXT_MAX_BYTES}; "
            "use manifestUri for large documents"
        )
    return value


def _check_base64(value: pydantic.SecretStr) -> pydantic.SecretStr:
    # The message never repeats the value: it is secret even when malformed.
    try:
        base64.b64decode(value.get_secret_value(), validate=True).decode("utf-8")
    except (binascii.Error, ValueError):
        raise ValueError("not valid base64 of UTF-8 text (use stringData for plain text)") from None
    return value


def _refuse_unstorable(value: object, *, prefix: str = "") -> object:
    """`value` unchanged, or PydanticCustomError `unstorable` when it is a string PostgreSQL cannot
    store (U+0000, a lone surrogate). Runs before patterns, so the message names the real problem
    instead of "must be a URL"; it never repeats the value (document text, perhaps a secret URL)."""
    if isinstance(value, str):
        reason = storable.unstorable_reason(value, where="")
        if reason is not None:
            raise pydantic_core.PydanticCustomError(
                "unstorable", "{prefix}{reason}", {"prefix": prefix, "reason": reason.removeprefix(": ")}
            )
    return value


def _duplicates(items: list[str]) -> list[str]:
    return [item for item, count in collections.Counter(items).items() if count > 1]


def _exact_amount(value: object) -> object:
    """A price or money amount must be a quoted decimal string: YAML `0.1` is a float, which is not
    0.1, so it is refused by name instead of rounded (`lading.costing.parse_amount`)."""
    if not isinstance(value, str):
        raise pydantic_core.PydanticCustomError(
            "decimal_string",
            "must be a decimal string such as \"0.15\" (quoted, so it stays exact), not a {kind}",
            {"kind": type(value).__name__},
        )
    return value


DecimalAmount = Annotated[
    str,
    pydantic.Field(min_length=1, max_length=22, pattern=DECIMAL_AMOUNT_PATTERN),
    pydantic.BeforeValidator(_exact_amount),  # after the constraints: it runs first, and keeps them in the schema
]
"""Money as a decimal string (`DECIMAL_AMOUNT_PATTERN`); `lading.costing.parse_amount` reads it exactly."""

DnsLabel = Annotated[str, pydantic.StringConstraints(min_length=1, max_length=63, pattern=DNS_LABEL_PATTERN)]
DnsSubdomain = Annotated[
    str, pydantic.StringConstraints(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN)
]
SecretKey = Annotated[
    str, pydantic.StringConstraints(min_length=1, max_length=253, pattern=SECRET_KEY_PATTERN)
]
PoolKey = Annotated[str, pydantic.StringConstraints(min_length=3, max_length=317, pattern=POOL_KEY_PATTERN)]
HttpUrl = Annotated[
    str,
    pydantic.StringConstraints(min_length=8, max_length=2048, pattern=HTTP_URL_PATTERN),
    pydantic.AfterValidator(_check_http_url),
]
LabelKey = Annotated[str, pydantic.StringConstraints(min_length=1, max_length=317, pattern=LABEL_KEY_PATTERN)]
LabelValue = Annotated[str, pydantic.StringConstraints(max_length=63, pattern=LABEL_VALUE_PATTERN)]
AnnotationValue = Annotated[str, pydantic.StringConstraints(max_length=256 * 1024)]
SecretValue = Annotated[pydantic.SecretStr, pydantic.StringConstraints(max_length=1024 * 1024)]
Base64SecretValue = Annotated[
    pydantic.SecretStr,
    pydantic.StringConstraints(max_length=1024 * 1024 * 4 // 3 + 4),
    pydantic.AfterValidator(_check_base64),
]


class _Spec(pydantic.BaseModel):
    """camelCase in YAML, snake_case in Python, unknown fields rejected, YAML types taken literally.

    `strict`: the API server would reject `maxInFlight: "64"`, so we do too; it also stops YAML's
    `key: 0001` from silently becoming the document key "1".
    """

    model_config = pydantic.ConfigDict(
        alias_generator=pydantic.alias_generators.to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        strict=True,
    )

    @pydantic.field_validator("*", mode="before")
    @classmethod
    def _storable(cls, value: object, info: pydantic.ValidationInfo) -> object:
        """Every string field of every spec may reach the database (keys, texts, URLs, names): one
        PostgreSQL cannot store is an invalid spec here, not a COPY that fails and is retried."""
        if not isinstance(value, str) or (value.isascii() and "\x00" not in value):
            return value  # storable: ASCII has no surrogates (the usual case, checked in C: 1,000s of documents)
        return _refuse_unstorable(value, prefix=cls._unstorable_prefix(info))

    @classmethod
    def _unstorable_prefix(cls, info: pydantic.ValidationInfo) -> str:
        """What the unstorable error says before the reason (a model may name its item)."""
        return ""


# --- References.


class SecretKeyRef(_Spec):
    """One key of a Secret in the referring object's namespace."""

    name: DnsSubdomain = pydantic.Field(description="Name of the Secret, in the same namespace.")
    key: SecretKey = pydantic.Field(description="Key inside the Secret's data or stringData.")


class LocalObjectRef(_Spec):
    """An object of a known kind in the referring object's namespace."""

    name: DnsSubdomain = pydantic.Field(description="Name of the object, in the same namespace.")


class PoolRef(_Spec):
    """An InferencePool, possibly shared from another namespace (e.g. `lading-system`)."""

    name: DnsSubdomain = pydantic.Field(description="Name of the InferencePool.")
    namespace: DnsLabel | None = pydantic.Field(
        default=None,
        description="Namespace of the InferencePool; defaults to the ExtractionBatch's own namespace.",
    )


# --- TenantQuota.


class RetentionSpec(_Spec):
    """How long a tenant's personal data is kept after its job ends (the cleaner, lading_worker.cleaning)."""

    documents_days: int | None = pydantic.Field(
        default=None,
        ge=1,
        le=36_500,
        description="Days after a job ends (succeeded, failed or cancelled) that its document text or URI "
        "is deleted. The job keeps its digests, states, attempts and verdict. Unset: kept.",
    )
    results_days: int | None = pydantic.Field(
        default=None,
        ge=1,
        le=36_500,
        description="Days after a job ends that its extracted result is deleted (the verdict stays). "
        "Requires documentsDays, and no fewer days: the text goes first. A result whose delivery is "
        "still pending is kept until the delivery settles. Unset: kept.",
    )

    @pydantic.model_validator(mode="after")
    def _text_before_result(self) -> RetentionSpec:
        if self.results_days is not None:
            if self.documents_days is None:
                raise ValueError("resultsDays requires documentsDays: the document text is deleted before the result")
            if self.results_days < self.documents_days:
                raise ValueError(f"resultsDays ({self.results_days}) must be at least documentsDays "
                                 f"({self.documents_days}): the document text is deleted before the result")
        return self


class MoneyBudget(_Spec):
    """What a tenant may spend on model calls, in one currency (docs/cost.md)."""

    currency: str = pydantic.Field(
        min_length=3,
        max_length=3,
        pattern=CURRENCY_CODE_PATTERN,
        description="ISO 4217 code of the budget (EUR, USD, ...). Only pools priced in this currency count "
        "against it; a batch naming a pool priced in another currency is not admitted (no exchange rates).",
    )
    monthly: DecimalAmount | None = pydantic.Field(
        default=None,
        description="Most the tenant may spend per calendar month (UTC), as a decimal string such as "
        "\"500.00\". When spent, its jobs wait (never fail) until the month ends or the budget is raised.",
    )
    daily: DecimalAmount | None = pydantic.Field(
        default=None,
        description="Most the tenant may spend per UTC day, as a decimal string. When spent, its jobs wait "
        "until the next UTC day. At most monthly.",
    )

    @pydantic.model_validator(mode="after")
    def _some_limit(self) -> MoneyBudget:
        if self.monthly is None and self.daily is None:
            raise ValueError("a budget needs monthly, daily or both")
        if self.monthly is not None and self.daily is not None:
            if costing.parse_amount(self.daily, field="daily") > costing.parse_amount(self.monthly, field="monthly"):
                raise ValueError(f"daily ({self.daily}) must not exceed monthly ({self.monthly})")
        return self


class TenantQuotaSpec(_Spec):
    """What a tenant (a set of namespaces) may queue and consume. Cluster-scoped, owned by platform teams."""

    namespaces: list[DnsLabel] = pydantic.Field(
        min_length=1,
        max_length=256,
        description="Namespaces that belong to this tenant. Every ExtractionBatch in one of them is "
        "admitted and billed under this quota; a namespace may belong to one TenantQuota only.",
    )
    max_queued_jobs: int = pydantic.Field(
        default=MAX_QUEUED_JOBS_DEFAULT,
        ge=0,
        le=1_000_000_000,
        description="Most jobs the tenant may have waiting or running at once. A batch that would "
        "exceed it is not admitted (its Admitted condition says why) until older work drains.",
    )
    max_queued_bytes: int | None = pydantic.Field(
        default=None,
        ge=0,
        le=2**50,
        description="Most bytes of document text the tenant may have queued at once. Unset: no byte limit.",
    )
    max_in_flight: int = pydantic.Field(
        default=MAX_IN_FLIGHT_DEFAULT,
        ge=1,
        le=100_000,
        description="Most model calls the tenant may have running at once, across all pools and workers.",
    )
    daily_token_budget: int | None = pydantic.Field(
        default=None,
        ge=0,
        le=10**13,
        description="Most model tokens (prompt + completion) the tenant may use per UTC day; jobs wait "
        "for the next day once it is spent. Unset: no budget.",
    )
    weight: int = pydantic.Field(
        default=1,
        ge=1,
        le=1000,
        description="Fair-share weight: under contention a tenant with weight 2 gets twice the model "
        "calls of a tenant with weight 1.",
    )
    allowed_priorities: list[Priority] = pydantic.Field(
        default_factory=lambda: list(PRIORITIES),
        min_length=1,
        max_length=3,
        description="Priority classes the tenant's batches may use (high, normal, low). Default: all.",
    )
    allowed_pools: list[PoolKey] | None = pydantic.Field(
        default=None,
        max_length=256,
        description="InferencePools the tenant's batches may use, as 'namespace/name'. Unset: any pool.",
    )
    retention: RetentionSpec | None = pydantic.Field(
        default=None,
        description="How long the tenant's document texts and results are kept after their jobs end. "
        "Unset: kept until deleted by hand.",
    )
    result_reuse: ResultReuse = pydantic.Field(
        default="tenant",
        description="tenant: a document takes an earlier accepted result of this tenant with the same SHA-256, "
        "schema, model, prompt version and validation policy instead of calling the model (unless its "
        "ExtractionBatch says reuse: false). none: every document calls the model. Results are never "
        "shared between tenants.",
    )
    budget: MoneyBudget | None = pydantic.Field(
        default=None,
        description="What the tenant may spend on model calls per month and/or day, priced by the pools' "
        "spec.pricing. When spent, claims of its jobs stop (they wait, never fail) until the period ends. "
        "Unset: no money budget.",
    )

    @pydantic.field_validator("namespaces", "allowed_priorities", "allowed_pools")
    @classmethod
    def _no_duplicates(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and (duplicates := _duplicates(value)):
            raise ValueError(f"duplicate entries: {', '.join(duplicates)}")
        return value


# --- InferencePool.


class ExternalEndpoint(_Spec):
    """An OpenAI-compatible HTTP API the operator does not run."""

    url: HttpUrl = pydantic.Field(
        description="Base URL of the OpenAI-compatible API, up to and including the version, e.g. "
        "https://api.example.com/v1. Workers POST to <url>/chat/completions.",
    )
    api_key_secret_ref: SecretKeyRef | None = pydantic.Field(
        default=None,
        description="Secret key holding the API key, sent as 'Authorization: Bearer <key>'. "
        "Unset: no Authorization header.",
    )


class EngineArgs(_Spec):
    """vLLM engine arguments the operator passes on the command line. Unset: vLLM's own default."""

    max_num_seqs: int | None = pydantic.Field(
        default=None,
        ge=1,
        le=4096,
        description="--max-num-seqs: most sequences one replica batches together.",
    )
    max_num_batched_tokens: int | None = pydantic.Field(
        default=None,
        ge=1,
        le=10_000_000,
        description="--max-num-batched-tokens: most tokens one scheduler step processes. "
        "Must be at least maxNumSeqs.",
    )
    max_model_len: int | None = pydantic.Field(
        default=None,
        ge=1,
        le=10_000_000,
        description="--max-model-len: context length (prompt + output) in tokens.",
    )
    gpu_memory_utilization: float = pydantic.Field(
        default=GPU_MEMORY_UTILIZATION_DEFAULT,
        ge=0.1,
        le=0.99,
        description="--gpu-memory-utilization: share of each GPU's memory vLLM may use (0.1 to 0.99).",
    )

    @pydantic.field_validator("max_num_batched_tokens")
    @classmethod
    def _batched_tokens_cover_sequences(
            cls,
            value: int | None,
            info: pydantic.ValidationInfo,
    ) -> int | None:
        max_num_seqs = info.data.get("max_num_seqs")
        if value is not None and max_num_seqs is not None and value < max_num_seqs:
            raise ValueError(
                f"maxNumBatchedTokens ({value}) must be at least maxNumSeqs ({max_num_seqs}); "
                "vLLM refuses to start otherwise"
            )
        return value


class VllmSettings(_Spec):
    """A vLLM Deployment owned by the operator. Absent on a vllm pool: all defaults."""

    image: str = pydantic.Field(
        default=VLLM_IMAGE_DEFAULT,
        min_length=1,
        max_length=512,
        pattern=IMAGE_PATTERN,
        description="vLLM server image. Pin a tag or digest.",
    )
    gpus: int = pydantic.Field(
        default=1,
        ge=1,
        le=16,
        description="GPUs per replica (nvidia.com/gpu); also the tensor-parallel size.",
    )
    engine_args: EngineArgs = pydantic.Field(
        default_factory=EngineArgs,
        description="Engine arguments passed to the vLLM server.",
    )
    hf_token_secret_ref: SecretKeyRef | None = pydantic.Field(
        default=None,
        description="Secret key holding a Hugging Face token, for gated models. Unset: anonymous download.",
    )
    replicas: int = pydantic.Field(
        default=1,
        ge=1,
        le=64,
        description="vLLM replicas while the pool has work. With workers.minReplicas 0 the operator "
        "scales the Deployment to zero after workers.idleSeconds without work, and back up on demand.",
    )
    shm_size: str = pydantic.Field(
        default=SHM_SIZE_DEFAULT,
        max_length=32,
        pattern=QUANTITY_PATTERN,
        description="Size of the memory-backed /dev/shm volume (NCCL and tensor parallelism need more "
        "than the container runtime's 64Mi).",
    )
    model_cache: ModelCache = pydantic.Field(
        default_factory=lambda: ModelCache(),
        description="Where downloaded model weights are kept. Default: a scratch volume per pod.",
    )
    node_selector: dict[LabelKey, LabelValue] | None = pydantic.Field(
        default=None,
        max_length=32,
        description="Node labels a vLLM pod requires, e.g. {nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3}. "
        "Unset: any node with free nvidia.com/gpu.",
    )
    tolerations: list[Toleration] | None = pydantic.Field(
        default=None,
        max_length=32,
        description="Taints the vLLM pods tolerate. Unset: the usual GPU node taint "
        "(nvidia.com/gpu, Exists, NoSchedule).",
    )
    resources: VllmResources = pydantic.Field(
        default_factory=lambda: VllmResources(),
        description="CPU, memory and ephemeral-storage requests of the vLLM container (its GPUs are `gpus`).",
    )
    extra_args: list[Annotated[str, pydantic.StringConstraints(min_length=1, max_length=1024,
                                                           pattern=STORABLE_TEXT_PATTERN)]] | None = (
        pydantic.Field(
            default=None,
            max_length=64,
            description="More `vllm serve` arguments, after the rendered ones, e.g. [--enable-prefix-caching, "
            "--kv-cache-dtype, fp8]. --host, --port, --served-model-name and --tensor-parallel-size are the "
            "operator's and refused.",
        )
    )
    env: list[EnvVar] | None = pydantic.Field(
        default=None,
        max_length=64,
        description="More environment variables of the vLLM container (a value, or a key of a Secret in the "
        "pool's namespace). HF_HOME, HF_TOKEN, VLLM_NO_USAGE_STATS and DO_NOT_TRACK are the operator's and refused.",
    )
    runtime_class_name: DnsSubdomain | None = pydantic.Field(
        default=None, description="RuntimeClass of the vLLM pods, e.g. nvidia. Unset: the cluster's default."
    )
    priority_class_name: DnsSubdomain | None = pydantic.Field(
        default=None,
        description="PriorityClass of the vLLM pods, e.g. one that may preempt batch work for scarce GPUs.",
    )
    affinity: Affinity | None = pydantic.Field(
        default=None,
        description="Node affinity of the vLLM pods, as in a pod spec: required and preferred node selector "
        "terms (e.g. GPU products a model fits on). Combines with nodeSelector.",
    )

    @pydantic.field_validator("extra_args")
    @classmethod
    def _no_rendered_args(cls, value: list[str] | None) -> list[str] | None:
        for arg in value or []:
            flag = arg.split("=", 1)[0]
            if flag in VLLM_RENDERED_ARGS:
                raise ValueError(f"extraArgs: {flag} is rendered by the operator (the Service depends on it)")
        return value

    @pydantic.field_validator("env")
    @classmethod
    def _no_rendered_env(cls, value: list[EnvVar] | None) -> list[EnvVar] | None:
        names = [variable.name for variable in value or []]
        for name in names:
            if name in VLLM_RENDERED_ENV:
                raise ValueError(f"env: {name} is rendered by the operator")
            if names.count(name) > 1:
                raise ValueError(f"env: {name} is given twice")
        return value


class VllmResources(_Spec):
    """Requests of the vLLM container besides its GPUs. Unset: none (the scheduler then places a pod on
    any node with a free GPU, however little CPU or memory it has left)."""

    cpu: str | None = pydantic.Field(
        default=None, max_length=32, pattern=CPU_QUANTITY_PATTERN, description="CPU request, e.g. 8 or 7500m."
    )
    memory: str | None = pydantic.Field(
        default=None, max_length=32, pattern=QUANTITY_PATTERN, description="Memory request, e.g. 64Gi."
    )
    ephemeral_storage: str | None = pydantic.Field(
        default=None,
        max_length=32,
        pattern=QUANTITY_PATTERN,
        description="Ephemeral-storage request, e.g. 120Gi when the model cache is an emptyDir on the node's disk.",
    )


class EnvVar(_Spec):
    """An environment variable: a value, or a key of a Secret in the pool's namespace."""

    name: str = pydantic.Field(min_length=1, max_length=256, pattern=ENV_NAME_PATTERN, description="Variable name.")
    value: str | None = pydantic.Field(
        default=None, max_length=32 * 1024, pattern=STORABLE_TEXT_PATTERN, description="Literal value."
    )
    value_from: EnvVarSource | None = pydantic.Field(default=None, description="Where the value comes from.")

    @pydantic.model_validator(mode="after")
    def _value_or_source(self) -> EnvVar:
        if (self.value is None) == (self.value_from is None):
            raise ValueError(f"env {self.name}: give exactly one of value and valueFrom")
        return self


class Affinity(_Spec):
    """The scheduling affinity of the vLLM pods (Kubernetes `Affinity`, node affinity only)."""

    node_affinity: NodeAffinity = pydantic.Field(description="Nodes the vLLM pods must or should run on.")


class NodeAffinity(_Spec):
    """Kubernetes `NodeAffinity`: hard requirements and weighted preferences on node labels."""

    required_during_scheduling_ignored_during_execution: NodeSelector | None = pydantic.Field(
        default=None, description="A node must match one of these terms."
    )
    preferred_during_scheduling_ignored_during_execution: list[PreferredSchedulingTerm] | None = pydantic.Field(
        default=None, max_length=16, description="Nodes matching these terms are preferred, by weight."
    )


class NodeSelector(_Spec):
    """Terms ORed: a node matching any of them qualifies."""

    node_selector_terms: list[NodeSelectorTerm] = pydantic.Field(min_length=1, max_length=16, description="Terms.")


class PreferredSchedulingTerm(_Spec):
    """A preference for nodes matching `preference`, weighted 1 to 100."""

    weight: int = pydantic.Field(ge=1, le=100, description="Weight of this preference (1 to 100).")
    preference: NodeSelectorTerm = pydantic.Field(description="The nodes preferred.")


class NodeSelectorTerm(_Spec):
    """Requirements ANDed."""

    match_expressions: list[NodeSelectorRequirement] = pydantic.Field(
        min_length=1, max_length=16, description="Requirements on node labels, all of which must hold."
    )


class NodeSelectorRequirement(_Spec):
    """A requirement on one node label."""

    key: LabelKey = pydantic.Field(description="The label key, e.g. nvidia.com/gpu.product.")
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"] = pydantic.Field(
        description="In, NotIn, Exists, DoesNotExist, Gt or Lt."
    )
    values: list[LabelValue] | None = pydantic.Field(
        default=None, max_length=64, description="Values for In and NotIn (one number for Gt and Lt)."
    )


class EnvVarSource(_Spec):
    """The source of an environment variable's value."""

    secret_key_ref: SecretKeyRef = pydantic.Field(description="A key of a Secret in the pool's namespace.")


class ModelCache(_Spec):
    """The volume vLLM downloads model weights into (HF_HOME)."""

    claim_name: DnsSubdomain | None = pydantic.Field(
        default=None,
        description="PersistentVolumeClaim (same namespace) to keep weights across restarts; ReadWriteMany "
        "when replicas > 1. Unset: an emptyDir of sizeLimit per pod, downloaded again at every start.",
    )
    size_limit: str = pydantic.Field(
        default=MODEL_CACHE_SIZE_DEFAULT,
        max_length=32,
        pattern=QUANTITY_PATTERN,
        description="Size limit of the emptyDir cache; ignored with claimName.",
    )


class Toleration(_Spec):
    """A Kubernetes toleration for the vLLM pods (the fields of core/v1 Toleration)."""

    key: LabelKey | None = pydantic.Field(default=None, description="Taint key; unset with Exists matches all.")
    operator: Literal["Exists", "Equal"] = pydantic.Field(default="Equal", description="Exists or Equal.")
    value: LabelValue | None = pydantic.Field(default=None, description="Taint value (Equal only).")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = pydantic.Field(
        default=None, description="Taint effect to tolerate; unset: all effects."
    )
    toleration_seconds: int | None = pydantic.Field(
        default=None, ge=0, le=10**9, description="NoExecute only: how long the pod stays bound after the taint."
    )

    @pydantic.field_validator("value")
    @classmethod
    def _no_value_with_exists(cls, value: str | None, info: pydantic.ValidationInfo) -> str | None:
        if value and info.data.get("operator") == "Exists":
            raise ValueError("a toleration with operator Exists takes no value")
        return value


class BuiltinSettings(_Spec):
    """The builtin provider: a deterministic offline extractor for demos and tests, no model at all."""

    latency_ms: int = pydantic.Field(
        default=0,
        ge=0,
        le=600_000,
        description="Simulated model latency per call, in milliseconds, to make demos and load tests "
        "behave like a real model.",
    )


class Pricing(_Spec):
    """What the pool's model calls cost, in one currency (docs/cost.md): per million tokens, or, for a
    vllm pool, per GPU hour. Exactly one of the two: both per-token prices, or gpuHourPrice alone."""

    currency: str = pydantic.Field(
        min_length=3,
        max_length=3,
        pattern=CURRENCY_CODE_PATTERN,
        description="ISO 4217 code of the prices (USD, EUR, ...). Fixed once set: a priced pool's currency "
        "does not change (create another pool).",
    )
    gpu_hour_price: DecimalAmount | None = pydantic.Field(
        default=None,
        description="Price of one GPU for one hour, as a decimal string such as \"2.50\"; only for provider "
        "vllm, instead of the per-token prices. The GPU time of the pool's ready replicas in each 60 s "
        "interval is split among the attempts that finished in it by their tokens (docs/cost.md).",
    )
    input_per_million_tokens: DecimalAmount | None = pydantic.Field(
        default=None,
        description="Price of a million prompt (input) tokens, as a decimal string such as \"0.15\". "
        "Required, with outputPerMillionTokens, unless gpuHourPrice is given.",
    )
    output_per_million_tokens: DecimalAmount | None = pydantic.Field(
        default=None,
        description="Price of a million completion (output) tokens, as a decimal string such as \"0.60\". "
        "Required, with inputPerMillionTokens, unless gpuHourPrice is given.",
    )

    @pydantic.model_validator(mode="before")
    @classmethod
    def _absent_prices_checked(cls, data: object) -> object:
        """An absent per-token price is checked like a given one (it is required unless gpuHourPrice),
        so that its error names the field as written (pydantic names a default by its Python name)."""
        if isinstance(data, collections.abc.Mapping):
            data = dict(data)
            for alias, name in (("inputPerMillionTokens", "input_per_million_tokens"),
                                ("outputPerMillionTokens", "output_per_million_tokens")):
                if alias not in data and name not in data:
                    data[alias] = None
        return data

    @pydantic.field_validator("input_per_million_tokens", "output_per_million_tokens")
    @classmethod
    def _per_token_or_per_gpu_hour(cls, value: str | None, info: pydantic.ValidationInfo) -> str | None:
        name = "inputPerMillionTokens" if info.field_name == "input_per_million_tokens" else "outputPerMillionTokens"
        if "gpu_hour_price" not in info.data:
            return value  # gpuHourPrice itself is invalid; its error says so
        by_gpu = info.data["gpu_hour_price"] is not None
        if by_gpu and value is not None:
            raise ValueError(
                f"gpuHourPrice prices the pool by GPU time; {name} is for per-token pricing: give one or the other"
            )
        if not by_gpu and value is None:
            raise ValueError(
                f"{name} is required: a pool is priced per token (inputPerMillionTokens and "
                "outputPerMillionTokens) or, provider vllm only, per GPU hour (gpuHourPrice)"
            )
        return value


class PoolLimits(_Spec):
    """What the pool's model may be sent, across all workers; enforced by the shared limiter."""

    requests_per_minute: int = pydantic.Field(
        default=REQUESTS_PER_MINUTE_DEFAULT,
        ge=1,
        le=1_000_000,
        description="Most model requests per minute across all workers of the pool.",
    )
    tokens_per_minute: int = pydantic.Field(
        default=TOKENS_PER_MINUTE_DEFAULT,
        ge=1,
        le=1_000_000_000,
        description="Most tokens per minute across all workers of the pool, counted as tokenAccounting says.",
    )
    max_concurrency: int = pydantic.Field(
        default=MAX_CONCURRENCY_DEFAULT,
        ge=1,
        le=10_000,
        description="Most model requests in flight at once across all workers of the pool.",
    )
    token_accounting: Literal["reserved", "used"] = pydantic.Field(
        default="reserved",
        description="How the provider counts a request against tokensPerMinute. reserved (hosted APIs such as "
        "OpenAI): prompt + max_tokens when the request arrives, for the whole minute, whatever the answer "
        "used; the limiter never gives a reservation back. used (servers that count actual usage): the "
        "limiter counts the usage each answer reports.",
    )
    """`reserved` is the default because it is the hosted-API rule and the safe one: counting a
    `used` provider as `reserved` only sends less; the other way round draws 429s."""


class WorkerSettings(_Spec):
    """The pool's worker Deployment and how the operator scales it."""

    min_replicas: int = pydantic.Field(
        default=0,
        ge=0,
        le=1000,
        description="Fewest worker replicas. 0 lets an idle pool scale to zero.",
    )
    max_replicas: int = pydantic.Field(
        default=10,
        ge=1,
        le=1000,
        validate_default=True,  # minReplicas 11 without maxReplicas must fail too
        description="Most worker replicas. Must be at least minReplicas.",
    )
    concurrency: int = pydantic.Field(
        default=WORKER_CONCURRENCY_DEFAULT,
        ge=1,
        le=1024,
        description="Jobs one worker replica runs at once.",
    )
    target_oldest_age_seconds: int = pydantic.Field(
        default=TARGET_OLDEST_AGE_S_DEFAULT,
        ge=1,
        le=86_400,
        description="Scale up while the oldest eligible job has waited longer than this, in seconds.",
    )
    scale_down_stabilization_seconds: int = pydantic.Field(
        default=SCALE_DOWN_STABILIZATION_S_DEFAULT,
        ge=0,
        le=86_400,
        description="Scale down only to the highest replica count desired during this many seconds.",
    )
    idle_seconds: int = pydantic.Field(
        default=IDLE_S_DEFAULT,
        ge=0,
        le=86_400,
        description="With minReplicas 0: scale workers (and a vllm pool's model server) to zero after "
        "this many seconds with no eligible job and no call in flight.",
    )
    scaling: Literal["builtin", "keda"] = pydantic.Field(
        default="builtin",
        description="builtin: the operator sizes the worker Deployment itself. keda: the operator renders "
        "a KEDA ScaledObject with the same signals and KEDA sizes it (KEDA must be installed).",
    )

    @pydantic.field_validator("max_replicas")
    @classmethod
    def _max_covers_min(cls, value: int, info: pydantic.ValidationInfo) -> int:
        min_replicas = info.data.get("min_replicas")
        if min_replicas is not None and value < min_replicas:
            raise ValueError(f"maxReplicas ({value}) must be at least minReplicas ({min_replicas})")
        return value


class InferencePoolSpec(_Spec):
    """Where a batch's model calls go: a builtin fake, an external OpenAI-compatible API, or an owned vLLM."""

    provider: ProviderName = pydantic.Field(
        description="builtin: offline fake for demos and tests. openai-compatible: an external API "
        "(set endpoint). vllm: a vLLM Deployment the operator runs (see vllm).",
    )
    model: str | None = pydantic.Field(
        default=None,
        min_length=1,
        max_length=256,
        pattern=MODEL_NAME_PATTERN,
        validate_default=True,
        description="Model name sent in requests (openai-compatible) or served by vLLM (a Hugging Face "
        "id such as Qwen/Qwen2.5-7B-Instruct). Required unless provider is builtin.",
    )
    endpoint: ExternalEndpoint | None = pydantic.Field(
        default=None,
        validate_default=True,
        description="The external API. Required for openai-compatible; not allowed otherwise.",
    )
    vllm: VllmSettings | None = pydantic.Field(
        default=None,
        description="The vLLM Deployment. Only for provider vllm; absent means all defaults.",
    )
    builtin: BuiltinSettings | None = pydantic.Field(
        default=None,
        description="Settings of the builtin fake. Only for provider builtin.",
    )
    limits: PoolLimits = pydantic.Field(
        default_factory=PoolLimits,
        description="Rate and concurrency limits towards the model, shared by all workers.",
    )
    workers: WorkerSettings = pydantic.Field(
        default_factory=WorkerSettings,
        description="Worker replicas and autoscaling.",
    )
    paused: bool = pydantic.Field(
        default=False,
        description="Stop claiming new jobs from this pool; running calls finish. Queued jobs wait.",
    )
    pricing: Pricing | None = pydantic.Field(
        default=None,
        description="What the model's calls cost: per million tokens, or (provider vllm) per GPU hour. Every "
        "attempt records its cost (one cut off mid-call at its reservation), summed per job, batch and tenant; "
        "TenantQuota budgets count it. Unset: calls are not priced. Workers read it when they start.",
    )
    default_currency: str | None = pydantic.Field(
        default=None,
        min_length=3,
        max_length=3,
        pattern=CURRENCY_CODE_PATTERN,
        description="ISO 4217 code (EUR, TRY, ...) that invoice-strict-v2 accepts as the currency of a "
        "document showing no currency code or symbol at all; an answer booking another currency still "
        "goes to review. Unset: such documents go to review. A document that shows a currency is judged "
        "by what it shows, never by this. Workers read it when they start.",
    )

    @pydantic.field_validator("model")
    @classmethod
    def _model_required_unless_builtin(cls, value: str | None, info: pydantic.ValidationInfo) -> str | None:
        provider = info.data.get("provider")
        if value is None and provider in ("openai-compatible", "vllm"):
            raise ValueError(f"model is required when provider is {provider}")
        return value

    @pydantic.field_validator("endpoint")
    @classmethod
    def _endpoint_only_for_external(
            cls,
            value: ExternalEndpoint | None,
            info: pydantic.ValidationInfo,
    ) -> ExternalEndpoint | None:
        provider = info.data.get("provider")
        if provider == "openai-compatible" and value is None:
            raise ValueError("endpoint (with url) is required when provider is openai-compatible")
        if provider in ("vllm", "builtin") and value is not None:
            raise ValueError(
                f"endpoint is only for provider openai-compatible, not {provider}"
                + ("; the operator creates the vLLM Service itself" if provider == "vllm" else "")
            )
        return value

    @pydantic.field_validator("vllm")
    @classmethod
    def _vllm_only_for_vllm(
            cls,
            value: VllmSettings | None,
            info: pydantic.ValidationInfo,
    ) -> VllmSettings | None:
        provider = info.data.get("provider")
        if value is not None and provider is not None and provider != "vllm":
            raise ValueError(f"vllm settings are only for provider vllm, not {provider}")
        return value

    @pydantic.field_validator("pricing")
    @classmethod
    def _gpu_hour_price_only_for_vllm(cls, value: Pricing | None, info: pydantic.ValidationInfo) -> Pricing | None:
        provider = info.data.get("provider")
        if value is not None and value.gpu_hour_price is not None and provider is not None and provider != "vllm":
            raise ValueError(
                f"gpuHourPrice is only for provider vllm (GPUs the operator runs), not {provider}: price this "
                "pool per token (inputPerMillionTokens and outputPerMillionTokens)"
            )
        return value

    @pydantic.field_validator("builtin")
    @classmethod
    def _builtin_only_for_builtin(
            cls,
            value: BuiltinSettings | None,
            info: pydantic.ValidationInfo,
    ) -> BuiltinSettings | None:
        provider = info.data.get("provider")
        if value is not None and provider is not None and provider != "builtin":
            raise ValueError(f"builtin settings are only for provider builtin, not {provider}")
        return value


# --- DeliveryEndpoint.


class RetryBudget(_Spec):
    """How long a delivery keeps retrying before it goes terminal."""

    max_attempts: int = pydantic.Field(
        default=RETRY_MAX_ATTEMPTS_DEFAULT,
        ge=1,
        le=100,
        description="Most delivery attempts per result, the first one included.",
    )
    max_age_seconds: int = pydantic.Field(
        default=RETRY_MAX_AGE_S_DEFAULT,
        ge=1,
        le=DEADLINE_S_MAX,
        description="Stop retrying a delivery this many seconds after its first attempt.",
    )


class DeliveryEndpointSpec(_Spec):
    """An ERP webhook that receives signed results. Only registered endpoints are ever called."""

    url: HttpUrl = pydantic.Field(
        description="Webhook URL results are POSTed to; use https:// unless the receiver is on a "
        "trusted network.",
    )
    secret_ref: SecretKeyRef = pydantic.Field(
        description="Secret key holding the signing secret (Standard Webhooks, e.g. 'whsec_...').",
    )
    key_id: str | None = pydantic.Field(
        default=None,
        min_length=1,
        max_length=64,
        pattern=KEY_ID_PATTERN,
        description="Identifier of the signing key, sent with each delivery so the receiver can rotate keys.",
    )
    retry_budget: RetryBudget | None = pydantic.Field(
        default=None,
        description="Retry limits for failed deliveries. Unset: 12 attempts within one day.",
    )


# --- ExtractionBatch.


class InlineDocument(_Spec):
    """One document given inline in the ExtractionBatch: a key and its OCR text."""

    key: str = pydantic.Field(
        min_length=1,
        max_length=256,
        pattern=DOCUMENT_KEY_PATTERN,
        description="Key of the document, unique in the batch; it names the result and makes "
        "re-submission idempotent.",
    )
    text: str = pydantic.Field(
        min_length=1,
        max_length=INLINE_TEXT_MAX_BYTES,
        pattern=STORABLE_TEXT_PATTERN,
        description="The document's text (e.g. OCR output), at most 64 KiB in UTF-8, without U+0000 (NUL).",
    )

    @pydantic.field_validator("key")
    @classmethod
    def _key_segments(cls, value: str) -> str:
        return _check_document_key(value)

    @classmethod
    def _unstorable_prefix(cls, info: pydantic.ValidationInfo) -> str:
        # `key` is validated before `text`: a bad text names its document.
        key = info.data.get("key")
        return f"document {key!r} " if isinstance(key, str) and info.field_name != "key" else ""

    @pydantic.field_validator("text")
    @classmethod
    def _text_size(cls, value: str) -> str:
        return _check_text_size(value)


class ExtractionBatchSpec(_Spec):
    """A batch of documents to extract with one schema, on one pool, delivered to one endpoint."""

    extraction_schema: SchemaName = pydantic.Field(
        alias="schema",
        description="Extraction schema of the results, e.g. invoice.v1.",
    )
    inference_pool_ref: PoolRef = pydantic.Field(
        description="The InferencePool whose model extracts the documents.",
    )
    delivery_endpoint_ref: LocalObjectRef | None = pydantic.Field(
        default=None,
        description="DeliveryEndpoint in this namespace that receives each result. Unset: results are "
        "stored only.",
    )
    priority: Priority = pydantic.Field(
        default="normal",
        description="Priority class: high, normal or low. May change while the batch runs.",
    )
    deadline_seconds: int = pydantic.Field(
        default=DEADLINE_S_DEFAULT,
        ge=60,
        le=DEADLINE_S_MAX,
        description="Seconds after admission by which every document must be done; unfinished jobs "
        "then fail with reason DeadlineExceeded.",
    )
    validation_policy: str = pydantic.Field(
        default=VALIDATION_POLICY_DEFAULT,
        min_length=4,
        max_length=63,
        pattern=VALIDATION_POLICY_PATTERN,
        description="Versioned policy that validates each extracted result: invoice-strict-v2 (the default) "
        "or invoice-strict-v1. Immutable.",
    )
    suspend: bool = pydantic.Field(
        default=False,
        description="Stop starting new jobs of this batch; running ones finish. May change at any time.",
    )
    reuse: bool = pydantic.Field(
        default=True,
        description="Let a document take an earlier accepted result of the tenant with the same SHA-256, "
        "schema, model, prompt version and validation policy instead of calling the model, and wait for "
        "an identical document already being extracted (when the TenantQuota's resultReuse allows). "
        "false: every document calls the model, e.g. a re-extraction. Immutable.",
    )
    documents: list[InlineDocument] | None = pydantic.Field(
        default=None,
        min_length=1,
        max_length=INLINE_DOCUMENTS_MAX,
        description="Documents given inline, for small batches (at most 1000, 512 KiB of text in all). "
        "Exactly one of documents and manifestUri is set.",
    )
    manifest_uri: str | None = pydantic.Field(
        default=None,
        min_length=8,
        max_length=2048,
        pattern=MANIFEST_URI_PATTERN,
        description="URI (file://, http://, https://) of a JSON-lines manifest (key, uri, sha256, bytes "
        "per line), for large batches. Exactly one of documents and manifestUri is set.",
    )

    @pydantic.field_validator("documents")
    @classmethod
    def _unique_keys(cls, value: list[InlineDocument] | None) -> list[InlineDocument] | None:
        if value is None:
            return value
        positions: dict[str, list[int]] = collections.defaultdict(list)
        for index, document in enumerate(value):
            positions[document.key].append(index)
        duplicates = [
            f"{key!r} at " + " and ".join(f"documents[{i}]" for i in indexes)
            for key, indexes in positions.items()
            if len(indexes) > 1
        ]
        if duplicates:
            raise ValueError(f"duplicate document key {'; '.join(duplicates)}")
        total = sum(len(document.text.encode("utf-8")) for document in value)
        if total > INLINE_TOTAL_TEXT_MAX_BYTES:
            raise ValueError(
                f"inline documents hold {total} bytes of text in UTF-8, more than {INLINE_TOTAL_TEXT_MAX_BYTES}; "
                "use manifestUri for large batches"
            )
        return value

    @pydantic.field_validator("manifest_uri")
    @classmethod
    def _not_both_sources(cls, value: str | None, info: pydantic.ValidationInfo) -> str | None:
        if value is not None and info.data.get("documents") is not None:
            raise ValueError("set either documents or manifestUri, not both")
        return None if value is None else _check_manifest_uri(value)

    @pydantic.model_validator(mode="after")
    def _some_source(self) -> ExtractionBatchSpec:
        # Not a field validator with validate_default: pydantic would report that error under the
        # Python name (manifest_uri), not the YAML one.
        if self.documents is None and self.manifest_uri is None:
            raise ValueError("one of documents (inline) or manifestUri is required")
        return self

    def pool_key(self, *, batch_namespace: str) -> str:
        """The referenced pool as 'namespace/name'; a ref without namespace means the batch's own."""
        namespace = self.inference_pool_ref.namespace or batch_namespace
        return f"{namespace}/{self.inference_pool_ref.name}"


# --- Objects: apiVersion, kind, metadata and a body.


class Metadata(pydantic.BaseModel):
    """The part of Kubernetes ObjectMeta Lading reads. Other fields (resourceVersion, ...) are ignored."""

    model_config = pydantic.ConfigDict(extra="ignore", frozen=True, strict=True)

    name: DnsSubdomain = pydantic.Field(description="Object name, unique per kind and namespace.")
    namespace: DnsLabel | None = pydantic.Field(
        default=None,
        description="Namespace; unset on cluster-scoped kinds. Loaders default it to 'default'.",
    )
    uid: str | None = pydantic.Field(default=None, max_length=128, description="Set by the API server.")
    generation: int | None = pydantic.Field(default=None, ge=0, description="Set by the API server.")
    labels: dict[LabelKey, LabelValue] | None = pydantic.Field(default=None, max_length=256)
    annotations: dict[LabelKey, AnnotationValue] | None = pydantic.Field(
        default=None,
        max_length=256,
        repr=False,  # kubectl's last-applied-configuration annotation may hold a whole Secret
    )

    @pydantic.field_validator("uid", mode="before")
    @classmethod
    def _storable_uid(cls, value: object) -> object:
        """The uid is part of the batch's idempotency key in the database (`lading run` takes it
        from the file): refused here when PostgreSQL could not store it."""
        return _refuse_unstorable(value)


class Resource(pydantic.BaseModel):
    """Base of every object a manifest may hold: what loaders need to name and index it."""

    model_config = pydantic.ConfigDict(
        alias_generator=pydantic.alias_generators.to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        strict=True,
    )

    API_VERSION: ClassVar[str]
    KIND: ClassVar[str]
    NAMESPACED: ClassVar[bool] = True

    metadata: Metadata

    @property
    def name(self) -> str:
        return self.metadata.name

    @property
    def namespace(self) -> str | None:
        return self.metadata.namespace

    @property
    def display_name(self) -> str:
        """'namespace/name', or 'name' for a cluster-scoped object."""
        if self.metadata.namespace is None:
            return self.metadata.name
        return f"{self.metadata.namespace}/{self.metadata.name}"


class TenantQuota(Resource):
    API_VERSION: ClassVar[str] = API_VERSION
    KIND: ClassVar[str] = "TenantQuota"
    NAMESPACED: ClassVar[bool] = False

    api_version: Literal["lading.dev/v1alpha1"] = "lading.dev/v1alpha1"
    kind: Literal["TenantQuota"] = "TenantQuota"
    spec: TenantQuotaSpec


class InferencePool(Resource):
    API_VERSION: ClassVar[str] = API_VERSION
    KIND: ClassVar[str] = "InferencePool"

    api_version: Literal["lading.dev/v1alpha1"] = "lading.dev/v1alpha1"
    kind: Literal["InferencePool"] = "InferencePool"
    spec: InferencePoolSpec


def stored_default_currency(spec: collections.abc.Mapping[str, object]) -> str | None:
    """`defaultCurrency` of an InferencePool spec as stored in `pools.spec` (camelCase JSON, written
    by `lading.applying.apply_inference_pool`); None when the pool names none. A stored value that
    is not an ISO 4217 code (a row written by hand) raises ValueError naming it: validating against a
    currency nobody meant would deliver documents the pool never vouched for."""
    value = spec.get("defaultCurrency")
    if value is None:
        return None
    if not isinstance(value, str) or re.fullmatch(CURRENCY_CODE_PATTERN, value) is None:
        raise ValueError(f"the stored InferencePool spec has defaultCurrency {value!r}, not an ISO 4217 code")
    return value


class DeliveryEndpoint(Resource):
    API_VERSION: ClassVar[str] = API_VERSION
    KIND: ClassVar[str] = "DeliveryEndpoint"

    api_version: Literal["lading.dev/v1alpha1"] = "lading.dev/v1alpha1"
    kind: Literal["DeliveryEndpoint"] = "DeliveryEndpoint"
    spec: DeliveryEndpointSpec


class ExtractionBatch(Resource):
    API_VERSION: ClassVar[str] = API_VERSION
    KIND: ClassVar[str] = "ExtractionBatch"

    api_version: Literal["lading.dev/v1alpha1"] = "lading.dev/v1alpha1"
    kind: Literal["ExtractionBatch"] = "ExtractionBatch"
    spec: ExtractionBatchSpec


class Secret(Resource):
    """A core v1 Secret. Values stay SecretStr: repr() and str() never show them; `values` decodes."""

    # Errors must not echo a malformed value back: it is still someone's secret.
    model_config = pydantic.ConfigDict(hide_input_in_errors=True)

    API_VERSION: ClassVar[str] = "v1"
    KIND: ClassVar[str] = "Secret"

    api_version: Literal["v1"] = "v1"
    kind: Literal["Secret"] = "Secret"
    type: str | None = pydantic.Field(default=None, max_length=253)
    immutable: bool | None = None
    data: dict[SecretKey, Base64SecretValue] | None = pydantic.Field(default=None, max_length=1024)
    string_data: dict[SecretKey, SecretValue] | None = pydantic.Field(default=None, max_length=1024)

    @property
    def values(self) -> dict[str, str]:
        """Plain values by key: `data` base64-decoded, then `stringData` on top (the API server's rule)."""
        merged = {
            key: base64.b64decode(value.get_secret_value()).decode("utf-8")
            for key, value in (self.data or {}).items()
        }
        merged.update({key: value.get_secret_value() for key, value in (self.string_data or {}).items()})
        return merged

    def keys(self) -> frozenset[str]:
        """Keys present in data or stringData, without decoding anything."""
        return frozenset(self.data or {}) | frozenset(self.string_data or {})


LADING_KINDS: tuple[type[Resource], ...] = (TenantQuota, InferencePool, DeliveryEndpoint, ExtractionBatch)
"""Custom resources of group lading.dev; the CRD generator renders one CRD per entry."""


# Some models refer to models defined after them (VllmSettings -> ModelCache, Toleration). pydantic
# completes such a model lazily, on first use, so its JSON schema (and the CRD generated from it)
# would depend on what happened to be built first. Completing every model here makes it one answer.
for _model in [m for m in list(globals().values()) if isinstance(m, type) and issubclass(m, pydantic.BaseModel)]:
    _model.model_rebuild(force=True)
del _model
