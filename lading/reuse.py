"""
Result reuse by content digest: who produces a result, and how long a duplicate waits.

A job whose tenant, document SHA-256, extraction schema, model, prompt version and validation
policy match an accepted result (SUCCEEDED: the worker's, or a reviewer's approval or correction)
takes that result without calling the model; two such jobs in flight at once make one model call
(docs/reuse.md). The database holds the definition of the key and the single flight
(`lading_reuse_key`, migration 0019; `lading_reuse_resolve`, migrations 0029 and 0041; repository
`lading.db.reuse`); the worker applies the decisions (`lading_worker.reusing`). This module says
what the worker calls (`Producer`) and how a duplicate waits (`WaitPolicy`).
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable

from lading.db import registry
from lading.models import specs
from lading.providers import prompting

BUILTIN_MODEL = "builtin"
"""The producer of a `provider: builtin` pool: the rule-based demo extractor, no prompt."""


@dataclasses.dataclass(frozen=True)
class Producer:
    """What turns a document into an accepted result: the model a pool's workers call, the version
    of what they ask it, and the pool's settings that change a verdict. Results of different
    producers are never taken for each other."""

    model: str
    prompt_version: str
    judging: str = ""
    """The pool's settings the validation policy reads, canonically (`defaultCurrency=EUR`; empty
    when none): a result `invoice-strict-v2` accepted because the pool books a currency the document
    does not show is not accepted by a pool that books none (docs/validation.md)."""

    @property
    def key_parts(self) -> tuple[str, str, str]:
        """(model, prompt version, judging): what the claim marks a job's reuse key with."""
        return (self.model, self.prompt_version, self.judging)


def producer_of(pool: registry.Pool) -> Producer:
    """The producer of `pool`'s workers: its model, the prompt version of this build, and its
    default currency."""
    currency = specs.stored_default_currency(pool.spec)
    judging = "" if currency is None else f"defaultCurrency={currency}"
    if pool.provider == "builtin":
        return Producer(model=BUILTIN_MODEL, prompt_version=BUILTIN_MODEL, judging=judging)
    model = pool.model or str(pool.spec.get("model") or "")
    return Producer(model=model, prompt_version=prompting.PROMPT_VERSION, judging=judging)


@dataclasses.dataclass(frozen=True)
class WaitPolicy:
    """How a job whose duplicate is being extracted waits: it gives its claim back (the attempt is
    not counted) and is claimable again after a pause that doubles from `initial_s` up to `cap_s`,
    jittered. It never holds a worker slot while it waits."""

    initial_s: float = 0.5
    """The first pause: a builtin or cached answer is often there by then."""
    cap_s: float = 5.0
    """The longest pause: a duplicate finds a slow model's result at most this long after it is stored."""

    def pause_s(self, waits: int, *, rand: Callable[[], float] = random.random) -> float:
        """The pause after `waits` earlier ones: half to all of min(initial_s * 2^waits, cap_s)."""
        full = min(self.initial_s * float(2 ** min(waits, 30)), self.cap_s)
        return float(full * (0.5 + 0.5 * rand()))
