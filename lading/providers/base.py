"""
The Provider protocol: `extract(document, schema=..., policy=...) -> Outcome`.

Outcomes are classified by the provider because only it knows what an error meant
(a 429 is transient, a 400 context-length is terminal, a timeout after the request was
sent is ambiguous). The executor maps the class to a job transition; nothing else.

Whatever a provider returns passes `checked()` before the executor judges it: the boundary
where model output enters, so what PostgreSQL cannot store never reaches a commit.

    what came back                                    becomes
    ───────────────────────────────────────────────   ─────────────────────────────────────────
    a result with NUL or a lone surrogate (values     INVALID_OUTPUT, UNSTORABLE_OUTPUT: the
    or keys), an integer past 64 bits, NaN/Infinity   retry rules apply, then REVIEW_REQUIRED
    raw output, error text with NUL/lone surrogates   kept, escaped (`\\u0000`, `\\ud800`): a
                                                      reviewer sees exactly what came back
    a token count that is not an int, negative, or    not recorded (None, as if the provider
    past USAGE_TOKENS_MAX (2³¹-1)                     had not said), the reason in
                                                      `usage_refused`; the result stands

An absurd token count is refused rather than clamped: clamping would charge the tenant's daily
budget with tokens nobody used, and the count says nothing about the extraction itself. As for
any call whose usage is unknown, the limiter keeps the call's reservation.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from typing import Any, Final, Protocol

from lading import storable
from lading.ids import JobId
from lading.jobs import transitions


@dataclasses.dataclass(frozen=True)
class Document:
    """One claimed document as a provider sees it: the text is data, never instructions."""

    job_id: JobId
    key: str
    text: str
    tenant: str
    previous_error_class: str | None = None
    """How the job's previous attempt failed, if it did (e.g. OUTPUT_TRUNCATED): a provider may
    adapt the retry, such as a larger output budget after a truncated answer."""


RATE_LIMITED: Final = "RATE_LIMITED"
"""The error class of a 429: the executor cools the whole pool down through the shared limiter."""

UNSTORABLE_OUTPUT: Final = "UNSTORABLE_OUTPUT"
"""The error class of output PostgreSQL cannot store (NUL, lone surrogates, integers past 64 bits,
non-finite numbers): invalid output, never a database failure."""
UNSUPPORTED_SCHEMA: Final = "UNSUPPORTED_SCHEMA"
"""The error class of a job whose extraction schema the provider cannot extract: terminal."""
SERVER_OVERLOADED: Final = "SERVER_OVERLOADED"
"""The error class of a 503 with Retry-After (vLLM's overload answer): congestion, like a 429."""
CONGESTED: Final = frozenset({RATE_LIMITED, SERVER_OVERLOADED})
"""The pool is congested, the job did nothing wrong: the pool cools down and the attempt is given back."""


@dataclasses.dataclass(frozen=True)
class RateLimitView:
    """What the provider's x-ratelimit-* headers said is left of its own limits, and in how many
    seconds each is whole again; None where it did not say. The shared limiter tightens its local
    view to it."""

    remaining_requests: int | None = None
    requests_reset_s: float | None = None
    remaining_tokens: int | None = None
    tokens_reset_s: float | None = None


class OutcomeClass(enum.StrEnum):
    OK = "ok"                                 #: a result was extracted (validation decides if it stands)
    TRANSIENT = "transient"                   #: nothing was billed or it is safe to retry (429, 5xx, connect)
    TIMEOUT_AMBIGUOUS = "timeout-ambiguous"   #: the request was sent, no answer: possibly billed; retry
    INVALID_OUTPUT = "invalid-output"         #: unparseable or schema-violating output; bounded retries
    TERMINAL = "terminal"                     #: retrying cannot help (document too large, unreadable)


@dataclasses.dataclass(frozen=True)
class Outcome:
    outcome: OutcomeClass
    result: dict[str, Any] | None = None
    error_class: str | None = None
    """A stable, CamelCase or UPPER_SNAKE reason, e.g. `DOCUMENT_TOO_LARGE`, `RateLimited`."""
    error: str | None = None
    """Human-readable detail; never contains the document text or secrets."""
    tokens_in: int | None = None
    tokens_out: int | None = None
    retry_after_s: float | None = None
    first_byte_s: float | None = None
    """Seconds from sending the request to the answer's first byte, when the provider measured it."""
    raw_output: str | None = None
    pauses_pool: bool = False
    """The endpoint cannot serve anyone now (key refused, quota or billing): the pool pauses for
    `retry_after_s` and the attempt is given back instead of counting against the job."""
    rate_limit: RateLimitView | None = None
    """What the provider said is left of its rate limits, when it said (x-ratelimit-* headers)."""
    usage_refused: str | None = None
    """Why a token count the provider reported was not recorded (set by `checked`); None if none was refused."""

    @classmethod
    def ok(cls, result: dict[str, Any], *, tokens_in: int | None = None, tokens_out: int | None = None) -> Outcome:
        return cls(OutcomeClass.OK, result=result, tokens_in=tokens_in, tokens_out=tokens_out)

    @classmethod
    def failed(
            cls,
            outcome: OutcomeClass,
            *,
            error_class: str,
            error: str,
            retry_after_s: float | None = None,
            raw_output: str | None = None,
    ) -> Outcome:
        return cls(outcome, error_class=error_class, error=error, retry_after_s=retry_after_s, raw_output=raw_output)


def checked(outcome: Outcome) -> Outcome:
    """`outcome` made storable (see the module docstring): an unstorable result becomes invalid
    output, raw output and error texts are escaped, implausible token counts are dropped with a
    reason. Idempotent, and `outcome` itself when nothing needs changing."""
    changes: dict[str, Any] = {}
    refused: list[str] = []
    for name in ("tokens_in", "tokens_out"):
        count = getattr(outcome, name)
        reason = _implausible_tokens(count)
        if reason is not None:
            changes[name] = None
            refused.append(f"{name} {reason}")
    if refused:
        changes["usage_refused"] = "; ".join(refused)
    for name in ("error_class", "error", "raw_output"):
        text = getattr(outcome, name)
        if text is not None and storable.escaped(text) != text:
            changes[name] = storable.escaped(text)
    if outcome.result is not None:
        reason = transitions.refusal(outcome.result, where="result")
        if reason is not None:
            changes.update(
                outcome=OutcomeClass.INVALID_OUTPUT,
                result=None,
                error_class=UNSTORABLE_OUTPUT,
                error=f"the output cannot be stored: {reason}",
                raw_output=_rendered(outcome.result),
            )
    return dataclasses.replace(outcome, **changes) if changes else outcome


RAW_OUTPUT_MAX_CHARS: Final = 64 * 1024
"""How much of an unstorable result is kept, rendered as JSON, for a reviewer."""


def _rendered(result: dict[str, Any]) -> str:
    try:
        text = json.dumps(result, ensure_ascii=False, default=str)
    except (ValueError, RecursionError):  # a cycle, or nested past the encoder's recursion limit
        return "(the output could not be rendered as JSON)"
    return storable.escaped(text[:RAW_OUTPUT_MAX_CHARS])


def _implausible_tokens(count: object) -> str | None:
    if count is None:
        return None
    if not isinstance(count, int) or isinstance(count, bool):
        return f"is a {type(count).__name__}, not a count"
    if count < 0:
        return "is negative"
    if count > transitions.USAGE_TOKENS_MAX:
        return f"is {count}, past the {transitions.USAGE_TOKENS_MAX} tokens one call can plausibly use"
    return None


class Provider(Protocol):
    """Anything that turns a document into a structured result for a schema."""

    async def extract(self, document: Document, *, schema: str, policy: str) -> Outcome: ...


async def close(provider: Provider) -> None:
    """Release what a provider holds (HTTP sessions), if it holds anything."""
    closer = getattr(provider, "close", None)
    if closer is not None:
        await closer()
