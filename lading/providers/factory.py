"""
Build the provider an InferencePool's row asks for.

Secrets are not read here: whoever calls `for_pool` resolves the pool's `apiKeySecretRef` (a
Kubernetes Secret, or a manifest's Secret under `lading run`) and passes the key in. A provider
that opens connections (`openai-compatible`) must be closed by the caller when it is done.

`provider: builtin` is demo code, not part of the product: the rule-based extractor lives in the
`lading_demo` package beside the core, and is imported here by name only when a pool asks for
it (the core never imports it at load time). An image built without `lading_demo` answers such a
pool with UnsupportedProvider.
"""

from __future__ import annotations

import importlib
from typing import Final

from lading.db import registry
from lading.providers import base, openai_compatible

DEMO_EXTRACTOR: Final = "lading_demo.builtin"
"""The module behind `provider: builtin` (its `BuiltinProvider`), loaded on first use."""


class UnsupportedProvider(ValueError):
    """The pool names a provider this build cannot construct."""


class MissingApiKey(ValueError):
    """The pool references an API key Secret, but no key was passed in."""


def for_pool(pool: registry.Pool, *, api_key: str | None = None, base_url: str | None = None) -> base.Provider:
    """The provider of a pool. `base_url` is where a vLLM pool's Service answers: the operator sets it
    in the worker Deployment ($LADING_PROVIDER_URL), since a vLLM pool's spec has no endpoint."""
    if pool.provider == "builtin":
        latency_ms = int((pool.spec.get("builtin") or {}).get("latencyMs", 0))
        return _builtin(pool.name, latency_s=latency_ms / 1000)
    if pool.provider == "openai-compatible":
        endpoint = pool.spec.get("endpoint") or {}
        url = endpoint.get("url")
        model = pool.model or pool.spec.get("model")
        if not url or not model:
            raise UnsupportedProvider(f"pool {pool.name}: openai-compatible needs endpoint.url and model")
        if endpoint.get("apiKeySecretRef") is not None and not api_key:
            raise MissingApiKey(f"pool {pool.name}: endpoint.apiKeySecretRef is set but no API key was given")
        return openai_compatible.OpenAICompatibleProvider(base_url=url, model=model, api_key=api_key)
    if pool.provider == "vllm":
        model = pool.model or pool.spec.get("model")
        if not base_url or not model:
            raise UnsupportedProvider(
                f"pool {pool.name}: a vllm pool needs the URL of its vLLM Service (LADING_PROVIDER_URL) and a model"
            )
        # vLLM speaks the OpenAI API; it has no key unless the Deployment was given one.
        return openai_compatible.OpenAICompatibleProvider(base_url=base_url, model=model, api_key=api_key)
    raise UnsupportedProvider(f"pool {pool.name}: provider {pool.provider!r} is not available in this build")


def _builtin(pool_name: str, *, latency_s: float) -> base.Provider:
    try:
        demo = importlib.import_module(DEMO_EXTRACTOR)
    except ModuleNotFoundError as exc:
        if exc.name not in ("lading_demo", DEMO_EXTRACTOR):
            raise
        raise UnsupportedProvider(
            f"pool {pool_name}: provider 'builtin' is demo code ({DEMO_EXTRACTOR}), not installed in this build"
        ) from None
    provider: base.Provider = demo.BuiltinProvider(latency_s=latency_s)
    return provider
