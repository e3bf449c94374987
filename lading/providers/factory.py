"""Build the provider an InferencePool's row asks for."""

from __future__ import annotations

from lading.db import registry
from lading.providers import base, builtin


class UnsupportedProvider(ValueError):
    """The pool names a provider this build cannot construct."""


def for_pool(pool: registry.Pool) -> base.Provider:
    if pool.provider == "builtin":
        latency_ms = int((pool.spec.get("builtin") or {}).get("latencyMs", 0))
        return builtin.BuiltinProvider(latency_s=latency_ms / 1000)
    raise UnsupportedProvider(f"pool {pool.name}: provider {pool.provider!r} is not available in this build")
