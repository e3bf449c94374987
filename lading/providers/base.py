"""
The Provider protocol: `extract(document, schema=..., policy=...) -> Outcome`.

Outcomes are classified by the provider because only it knows what an error meant
(a 429 is transient, a 400 context-length is terminal, a timeout after the request was
sent is ambiguous). The executor maps the class to a job transition; nothing else.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, Final, Protocol

from lading.ids import JobId


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


class Provider(Protocol):
    """Anything that turns a document into a structured result for a schema."""

    async def extract(self, document: Document, *, schema: str, policy: str) -> Outcome: ...


async def close(provider: Provider) -> None:
    """Release what a provider holds (HTTP sessions), if it holds anything."""
    closer = getattr(provider, "close", None)
    if closer is not None:
        await closer()
