"""
The `openai-compatible` provider: one chat-completions request per attempt, to vLLM or any
server that speaks the OpenAI API, and a classified Outcome for whatever happened.

One `extract()` is exactly one HTTP request: `POST {base_url}/chat/completions` with the model,
the delimited document (`lading.providers.prompting`), temperature 0, `max_tokens` and a
`response_format` that asks for the schema's JSON Schema. Nothing here retries (DESIGN.md §1.5:
the job scheduler is the only retry owner): aiohttp retries no POST, redirects are not followed,
and the outcome's class and `retry_after_s` tell the retry policy what to do.

    what happened                                   outcome            error_class
    ─────────────────────────────────────────────   ─────────────────  ───────────────────
    2xx, content is an invoice.v1 object            OK                 (usage tokens kept)
    2xx, finish_reason "length"                     INVALID_OUTPUT     OUTPUT_TRUNCATED
    2xx, finish_reason "content_filter"             INVALID_OUTPUT     CONTENT_FILTERED
    2xx, a refusal instead of content               INVALID_OUTPUT     MODEL_REFUSAL
    2xx, content is not JSON                        INVALID_OUTPUT     MALFORMED_OUTPUT
    2xx, JSON that is not invoice.v1                INVALID_OUTPUT     SCHEMA_VIOLATION
    2xx, JSON holding NUL, a lone surrogate, an     INVALID_OUTPUT     UNSTORABLE_OUTPUT
    integer past 64 bits or a non-finite number
    2xx, the envelope is not a chat completion      INVALID_OUTPUT     MALFORMED_RESPONSE
    2xx, body larger than max_response_bytes        INVALID_OUTPUT     RESPONSE_TOO_LARGE
    3xx                                             TERMINAL           UNEXPECTED_REDIRECT
    400/413/422 about context length / too long     TERMINAL           DOCUMENT_TOO_LARGE
    404                                             TERMINAL           MODEL_NOT_FOUND
    other 4xx                                       TERMINAL           BAD_REQUEST
    401/403                                         TRANSIENT (60 s)   AUTH_FAILED
    402, or quota / billing in the error            TRANSIENT (300 s)  QUOTA_EXHAUSTED
    408                                             TRANSIENT          REQUEST_TIMEOUT
    429                                             TRANSIENT          RATE_LIMITED
    503 with Retry-After (vLLM overloaded)          TRANSIENT          SERVER_OVERLOADED
    other 5xx                                       TRANSIENT          SERVER_ERROR
    no connection (refused, DNS, TLS)               TRANSIENT          CONNECT_FAILED
    no connection within connect_timeout_s          TRANSIENT          CONNECT_TIMEOUT
    sent; no byte for first_byte_timeout_s, or
    no whole answer within total_timeout_s          TIMEOUT_AMBIGUOUS  RESPONSE_TIMEOUT
    sent; connection closed or reset                TIMEOUT_AMBIGUOUS  CONNECTION_LOST
    sent; the answer is not HTTP                    TIMEOUT_AMBIGUOUS  PROTOCOL_ERROR

Retry-After (delay-seconds or an HTTP-date, read against the response's own `Date` so a
skewed clock here does not matter) is passed on for 429, 5xx, auth and quota errors. Auth and
quota errors are TRANSIENT with a long default delay rather than TERMINAL: a rotated key or a
topped-up account fixes them without touching the jobs (the executor pauses the pool on them).
A 429 and a 503 with Retry-After are the pool's congestion, not the job's failure: the executor
cools the pool down and gives the attempt back. Every timeout after the request may have
reached the server is TIMEOUT_AMBIGUOUS: the server may have run (and billed) it.

OpenAI's `x-ratelimit-remaining-*` / `x-ratelimit-reset-*` headers, on any answer that has them,
come back as `Outcome.rate_limit` for the shared limiter. `reservation()` says what a request
will count against tokens-per-minute before it is sent: the prompt measured on the real request
(instructions, schema and delimiters once per schema, plus the document) and its `max_tokens`,
doubled on the retry after a truncated answer.

Error texts are short and built here from the status and the server's error *identifiers*
(`type`, `code`), never from free-text messages or bodies, which may echo the document. The API
key is only ever sent in the Authorization header; it is not logged, not in `repr()`, and any
Outcome text that contains it (a server echoing headers into its answer) is redacted.

Model output is data: it is parsed as JSON and validated against the schema, never executed,
never used as a URL. What PostgreSQL could not store is refused before the schema is consulted
(in keys too, and in values the schema would drop), and raw output kept for a reviewer is
escaped (`lading.storable.escaped`): NUL and lone surrogates show as `\\u0000`, `\\ud800`.
Whether the values are right (arithmetic, evidence) is the validation policy's business, after
this provider returns.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import email.utils
import json
import math
import re
import time
from collections.abc import Mapping
from typing import Any, Final

import aiohttp
import pydantic

from lading import limiting, storable
from lading.jobs import retry, transitions
from lading.models import invoice
from lading.providers import base, prompting

CONNECT_TIMEOUT_S_DEFAULT = 10.0
"""Establishing a TCP (and TLS) connection takes milliseconds in a cluster; 10 s means it is not coming."""
FIRST_BYTE_TIMEOUT_S_DEFAULT = 60.0
"""A loaded vLLM queues requests before prefill; a minute of silence means it is stuck."""
TOTAL_TIMEOUT_S_DEFAULT = 120.0
"""A 4096-token answer at ~40 tokens/s is under two minutes; matches the attempt timeout."""
MAX_OUTPUT_TOKENS_DEFAULT = 4096
"""An invoice with a hundred lines and their evidence fits; a runaway answer stops here."""
MAX_RESPONSE_BYTES_DEFAULT = 8 * 1024 * 1024
"""Far above any honest answer of MAX_OUTPUT_TOKENS_DEFAULT tokens; a body beyond it is not read."""
RAW_OUTPUT_MAX_BYTES = 64 * 1024
"""How much of a bad answer is kept in `Outcome.raw_output` for a reviewer (UTF-8 bytes)."""
ERROR_BODY_MAX_BYTES = 64 * 1024
"""How much of an error response is read to classify it; the rest is discarded."""
AUTH_RETRY_AFTER_S = 60.0
"""After 401/403 without Retry-After: long enough not to hammer a provider that rejects us."""
QUOTA_RETRY_AFTER_S = 300.0
"""After a quota or billing error without Retry-After: money does not arrive in seconds."""
KEEPALIVE_S = 4.0
"""Idle connections are closed after this long: below uvicorn's 5 s (vLLM's server), so a
request is never written into a connection the server is closing (that would be ambiguous)."""

# Error classes (Outcome.error_class). UPPER_SNAKE, stable: metrics and job rows carry them.
RATE_LIMITED: Final = base.RATE_LIMITED
SERVER_OVERLOADED: Final = base.SERVER_OVERLOADED
SERVER_ERROR: Final = "SERVER_ERROR"
REQUEST_TIMEOUT: Final = "REQUEST_TIMEOUT"
AUTH_FAILED: Final = "AUTH_FAILED"
QUOTA_EXHAUSTED: Final = "QUOTA_EXHAUSTED"
DOCUMENT_TOO_LARGE: Final = "DOCUMENT_TOO_LARGE"
MODEL_NOT_FOUND: Final = "MODEL_NOT_FOUND"
BAD_REQUEST: Final = "BAD_REQUEST"
UNEXPECTED_REDIRECT: Final = "UNEXPECTED_REDIRECT"
CONNECT_FAILED: Final = "CONNECT_FAILED"
CONNECT_TIMEOUT: Final = "CONNECT_TIMEOUT"
RESPONSE_TIMEOUT: Final = "RESPONSE_TIMEOUT"
CONNECTION_LOST: Final = "CONNECTION_LOST"
PROTOCOL_ERROR: Final = "PROTOCOL_ERROR"
RESPONSE_TOO_LARGE: Final = "RESPONSE_TOO_LARGE"
MALFORMED_RESPONSE: Final = "MALFORMED_RESPONSE"
MALFORMED_OUTPUT: Final = "MALFORMED_OUTPUT"
SCHEMA_VIOLATION: Final = "SCHEMA_VIOLATION"
OUTPUT_TRUNCATED: Final = "OUTPUT_TRUNCATED"
CONTENT_FILTERED: Final = "CONTENT_FILTERED"
MODEL_REFUSAL: Final = "MODEL_REFUSAL"
UNSTORABLE_OUTPUT: Final = base.UNSTORABLE_OUTPUT

_CONTEXT_WORDS = (
    "context length", "context_length", "maximum context", "context window", "too many tokens",
    "prompt is too long", "input is too long",
)
"""Phrases of 'the prompt does not fit' in OpenAI, vLLM, llama.cpp and TGI error messages."""
_QUOTA_WORDS = ("quota", "billing", "credit balance", "insufficient credit")
"""Phrases of 'the account cannot pay' (OpenAI's `insufficient_quota` comes with a 429)."""
_IDENTIFIER = re.compile(r"[A-Za-z0-9_.\-]{1,64}")
_FIELD_NAME = re.compile(r"[a-z_]{1,40}")


class OpenAICompatibleProvider:
    """`provider: openai-compatible` (and vLLM's OpenAI server): see the module docstring."""

    def __init__(
            self,
            *,
            base_url: str,
            model: str,
            api_key: str | None,
            session: aiohttp.ClientSession | None = None,
            connect_timeout_s: float = CONNECT_TIMEOUT_S_DEFAULT,
            first_byte_timeout_s: float = FIRST_BYTE_TIMEOUT_S_DEFAULT,
            total_timeout_s: float = TOTAL_TIMEOUT_S_DEFAULT,
            max_output_tokens: int = MAX_OUTPUT_TOKENS_DEFAULT,
            max_response_bytes: int = MAX_RESPONSE_BYTES_DEFAULT,
    ) -> None:
        """
        `base_url` ends with the API version (`http://127.0.0.1:8000/v1`). Without a `session`,
        the provider opens its own on first use and `close()` closes it; a session passed in
        belongs to the caller. `first_byte_timeout_s` bounds every silence on the socket (before
        the headers and between body chunks); `total_timeout_s` the whole request. The connect
        timeout must be shorter than the total one: that is how a timeout is known to have
        happened after the request was sent.
        """
        if not 0 < connect_timeout_s < total_timeout_s or first_byte_timeout_s <= 0:
            raise ValueError("timeouts must be positive, and connect_timeout_s shorter than total_timeout_s")
        if max_output_tokens < 1 or max_response_bytes < 1:
            raise ValueError("max_output_tokens and max_response_bytes must be positive")
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self.total_timeout_s = total_timeout_s
        self.max_output_tokens = max_output_tokens
        self.max_response_bytes = max_response_bytes
        self._api_key = _checked_key(api_key)
        self._session = session
        self._owns_session = session is None
        self._closed = False
        self._timeout = aiohttp.ClientTimeout(
            total=None,  # ours, around the body read too: see _post
            connect=connect_timeout_s,
            sock_connect=connect_timeout_s,
            sock_read=first_byte_timeout_s,
        )

    def __repr__(self) -> str:
        return f"OpenAICompatibleProvider(url={self.url!r}, model={self.model!r})"  # never the key

    async def close(self) -> None:
        """Close the session if this provider opened it. Further extract() calls raise."""
        self._closed = True
        if self._owns_session and self._session is not None:
            await self._session.close()
            self._session = None

    async def extract(self, document: base.Document, *, schema: str, policy: str) -> base.Outcome:
        """One request for `document`; `policy` is not consulted (validation runs afterwards)."""
        if not prompting.supports(schema):
            return base.Outcome.failed(
                base.OutcomeClass.TERMINAL,
                error_class=base.UNSUPPORTED_SCHEMA,
                error=f"no prompt for extraction schema {schema!r}",
            )
        body = _encode({
            "model": self.model,
            "messages": prompting.messages(text=document.text, schema=schema),
            "temperature": 0,
            "max_tokens": self._max_tokens(document),
            "response_format": prompting.response_format(schema=schema),
            "stream": False,
        })
        return self._redacted(await self._post(body))

    def reservation(self, document: base.Document, *, schema: str, policy: str) -> limiting.Reservation:
        """What the request for `document` will count against tokens-per-minute: its prompt,
        estimated from the real request, and its output budget. `policy` does not change the prompt."""
        if not prompting.supports(schema):
            return limiting.Reservation(prompt_tokens=limiting.tokens_of(len(document.text)), output_tokens=0)
        return limiting.Reservation(
            prompt_tokens=limiting.tokens_of(prompting.prompt_chars(text=document.text, schema=schema)),
            output_tokens=self._max_tokens(document),
        )

    def _max_tokens(self, document: base.Document) -> int:
        # One retry after a truncated answer gets twice the budget; the executor allows
        # only that one (temperature 0 would truncate again at the same length).
        return self.max_output_tokens * (2 if document.previous_error_class == OUTPUT_TRUNCATED else 1)

    async def _post(self, body: bytes) -> base.Outcome:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self._api_key is not None:
            headers["Authorization"] = f"Bearer {self._api_key}"
        started = time.monotonic()
        try:
            async with asyncio.timeout(self.total_timeout_s):
                async with self._open_session().post(
                        self.url,
                        data=body,
                        headers=headers,
                        allow_redirects=False,
                        raise_for_status=False,
                        timeout=self._timeout,
                ) as response:
                    # The status line and headers are in: vLLM sends them once the model has
                    # produced the whole (non-streamed) answer, a hosted API often earlier.
                    first_byte_s = time.monotonic() - started
                    outcome = await self._answer(response)
                    return dataclasses.replace(
                        outcome, first_byte_s=first_byte_s, rate_limit=_rate_limit(response.headers)
                    )
        # Order matters: ConnectionTimeoutError is a TimeoutError, ClientConnectorError a ClientOSError.
        except aiohttp.ConnectionTimeoutError:
            return _failed(
                base.OutcomeClass.TRANSIENT, error_class=CONNECT_TIMEOUT, error="no connection to the endpoint in time"
            )
        except aiohttp.ClientConnectorError as exc:
            return _failed(base.OutcomeClass.TRANSIENT, error_class=CONNECT_FAILED, error=_connect_failure(exc))
        except TimeoutError:  # the socket went silent (SocketTimeoutError) or the total ran out
            return _failed(
                base.OutcomeClass.TIMEOUT_AMBIGUOUS,
                error_class=RESPONSE_TIMEOUT,
                error="the request was sent but no complete answer came in time; it may have been billed",
            )
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:
            return _failed(
                base.OutcomeClass.TIMEOUT_AMBIGUOUS,
                error_class=CONNECTION_LOST,
                error=f"the connection was lost after sending ({type(exc).__name__}); the request may have been billed",
            )
        except aiohttp.InvalidURL:
            return _failed(
                base.OutcomeClass.TERMINAL, error_class=BAD_REQUEST, error="the endpoint URL is not a valid http(s) URL"
            )
        except aiohttp.ClientError as exc:  # ClientResponseError from aiohttp itself: not HTTP
            # str(exc) is never used: some aiohttp errors carry the request headers, the key with them.
            return _failed(
                base.OutcomeClass.TIMEOUT_AMBIGUOUS,
                error_class=PROTOCOL_ERROR,
                error=f"the endpoint's answer could not be read as HTTP ({type(exc).__name__})",
            )

    def _open_session(self) -> aiohttp.ClientSession:
        if self._closed:
            raise RuntimeError("the provider is closed")
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=KEEPALIVE_S),
                cookie_jar=aiohttp.DummyCookieJar(),  # every request stands alone
                trust_env=False,  # no proxy from the environment: only base_url is contacted
            )
            # limit=0: the worker's concurrency slots bound requests in flight; a smaller pool
            # here would queue them and turn the wait into spurious CONNECT_TIMEOUTs.
        return self._session

    async def _answer(self, response: aiohttp.ClientResponse) -> base.Outcome:
        status = response.status
        if 200 <= status < 300:
            body = await _read_capped(response, limit=self.max_response_bytes)
            if body is None:
                return _failed(
                    base.OutcomeClass.INVALID_OUTPUT,
                    error_class=RESPONSE_TOO_LARGE,
                    error=f"the response is larger than {self.max_response_bytes} bytes and was not read",
                )
            return _completion(body)
        if 300 <= status < 400:
            return _failed(
                base.OutcomeClass.TERMINAL,
                error_class=UNEXPECTED_REDIRECT,
                error=f"HTTP {status}: the endpoint redirects, and redirects are not followed; set endpoint.url "
                "to the final URL",
            )
        error_body = await _read_capped(response, limit=ERROR_BODY_MAX_BYTES, truncate=True) or b""
        return _error_outcome(status, response.headers, error_body, model=self.model)

    def _redacted(self, outcome: base.Outcome) -> base.Outcome:
        key = self._api_key
        if key is None or not any(key in (text or "") for text in (outcome.error, outcome.raw_output)):
            return outcome
        return dataclasses.replace(
            outcome,
            error=None if outcome.error is None else outcome.error.replace(key, "[redacted]"),
            raw_output=None if outcome.raw_output is None else outcome.raw_output.replace(key, "[redacted]"),
        )


# ---------------------------------------------------------------------------------------------
# a successful response
# ---------------------------------------------------------------------------------------------

def _completion(body: bytes) -> base.Outcome:
    """A 2xx body: the chat completion envelope, then the model's content as invoice.v1."""
    try:
        envelope = _loads(body.decode("utf-8"))
    except (ValueError, RecursionError):
        return _failed(
            base.OutcomeClass.INVALID_OUTPUT,
            error_class=MALFORMED_RESPONSE,
            error="the response body is not JSON",
            raw_output=body.decode("utf-8", errors="replace"),
        )
    tokens_in, tokens_out = _usage(envelope)
    choice = _first_choice(envelope)
    message = choice.get("message") if choice is not None else None
    if choice is None or not isinstance(message, dict):
        return _failed(
            base.OutcomeClass.INVALID_OUTPUT,
            error_class=MALFORMED_RESPONSE,
            error="the response is not a chat completion (no choices[0].message)",
            tokens=(tokens_in, tokens_out),
        )
    content = message.get("content")
    raw = content if isinstance(content, str) else None
    finish_reason = choice.get("finish_reason")
    if finish_reason == "length":
        return _failed(
            base.OutcomeClass.INVALID_OUTPUT,
            error_class=OUTPUT_TRUNCATED,
            error="the answer was cut off at max_tokens",
            raw_output=raw,
            tokens=(tokens_in, tokens_out),
        )
    if finish_reason == "content_filter":
        return _failed(
            base.OutcomeClass.INVALID_OUTPUT,
            error_class=CONTENT_FILTERED,
            error="the provider's content filter withheld the answer",
            raw_output=raw,
            tokens=(tokens_in, tokens_out),
        )
    if raw is None:
        refusal = message.get("refusal")
        if isinstance(refusal, str):
            return _failed(
                base.OutcomeClass.INVALID_OUTPUT,
                error_class=MODEL_REFUSAL,
                error="the model refused to answer",
                raw_output=refusal,
                tokens=(tokens_in, tokens_out),
            )
        return _failed(
            base.OutcomeClass.INVALID_OUTPUT,
            error_class=MALFORMED_RESPONSE,
            error="the message has no text content",
            tokens=(tokens_in, tokens_out),
        )
    try:
        data = _loads(raw)
    except (ValueError, RecursionError):
        return _failed(
            base.OutcomeClass.INVALID_OUTPUT,
            error_class=MALFORMED_OUTPUT,
            error="the answer is not valid JSON",
            raw_output=raw,
            tokens=(tokens_in, tokens_out),
        )
    unstorable = transitions.refusal(data, where="answer")
    if unstorable is not None:
        return _failed(
            base.OutcomeClass.INVALID_OUTPUT,
            error_class=UNSTORABLE_OUTPUT,
            error=f"the answer cannot be stored: {unstorable}",
            raw_output=raw,
            tokens=(tokens_in, tokens_out),
        )
    if not isinstance(data, dict):
        return _failed(
            base.OutcomeClass.INVALID_OUTPUT,
            error_class=SCHEMA_VIOLATION,
            error=f"the answer is a JSON {type(data).__name__}, not an object",
            raw_output=raw,
            tokens=(tokens_in, tokens_out),
        )
    try:
        result = invoice.Invoice.model_validate(data).to_json()
    except pydantic.ValidationError as exc:
        return _failed(
            base.OutcomeClass.INVALID_OUTPUT,
            error_class=SCHEMA_VIOLATION,
            error="the answer does not fit invoice.v1 at " + _error_places(exc),
            raw_output=raw,
            tokens=(tokens_in, tokens_out),
        )
    return base.Outcome.ok(result, tokens_in=tokens_in, tokens_out=tokens_out)


def _loads(text: str) -> Any:
    """Strict JSON: NaN and Infinity are not JSON, whatever Python's json module accepts."""
    return json.loads(text, parse_constant=_reject_constant)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _first_choice(envelope: Any) -> dict[str, Any] | None:
    choices = envelope.get("choices") if isinstance(envelope, dict) else None
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        return choices[0]
    return None


def _usage(envelope: Any) -> tuple[int | None, int | None]:
    usage = envelope.get("usage") if isinstance(envelope, dict) else None
    if not isinstance(usage, dict):
        return None, None
    return _count(usage.get("prompt_tokens")), _count(usage.get("completion_tokens"))


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _error_places(exc: pydantic.ValidationError) -> str:
    """Where the answer breaks the schema, by field path. Dict keys and extra field names come
    from the model (and so maybe from the document): only schema-like names are shown."""
    places = sorted({
        ".".join(
            str(part) if isinstance(part, int) or _FIELD_NAME.fullmatch(part) else "?"
            for part in error["loc"]
        ) or "(top level)"
        for error in exc.errors(include_input=False, include_url=False)
    })
    shown = ", ".join(places[:10])
    return shown + (f" and {len(places) - 10} more" if len(places) > 10 else "")


# ---------------------------------------------------------------------------------------------
# an error response
# ---------------------------------------------------------------------------------------------

def _error_outcome(status: int, headers: Mapping[str, str], body: bytes, *, model: str) -> base.Outcome:
    """Classify a non-2xx, non-3xx response (see the module docstring's table)."""
    words, identifiers = _error_details(body)
    detail = f"HTTP {status}" + (f" ({', '.join(identifiers)})" if identifiers else "")
    retry_after_s = _retry_after(headers)
    if status == 402 or (status in (400, 401, 403, 429) and _mentions(words, _QUOTA_WORDS)):
        return dataclasses.replace(_failed(
            base.OutcomeClass.TRANSIENT,
            error_class=QUOTA_EXHAUSTED,
            error=f"{detail}: the account's quota or billing limit is reached",
            retry_after_s=QUOTA_RETRY_AFTER_S if retry_after_s is None else retry_after_s,
        ), pauses_pool=True)
    if status == 429:
        return _failed(
            base.OutcomeClass.TRANSIENT,
            error_class=RATE_LIMITED,
            error=f"{detail}: rate limited",
            retry_after_s=retry_after_s,
        )
    if status in (401, 403):
        return dataclasses.replace(_failed(
            base.OutcomeClass.TRANSIENT,
            error_class=AUTH_FAILED,
            error=f"{detail}: the API key was refused (check the pool's apiKeySecretRef)",
            retry_after_s=AUTH_RETRY_AFTER_S if retry_after_s is None else retry_after_s,
        ), pauses_pool=True)
    if status == 413 or (status in (400, 422) and _mentions(words, _CONTEXT_WORDS)):
        return _failed(
            base.OutcomeClass.TERMINAL,
            error_class=DOCUMENT_TOO_LARGE,
            error=f"{detail}: the document and the answer do not fit the model's context",
        )
    if status == 404:
        return _failed(
            base.OutcomeClass.TERMINAL,
            error_class=MODEL_NOT_FOUND,
            error=f"{detail}: model {model!r} or the /chat/completions path does not exist at the endpoint",
        )
    if status == 408:
        return _failed(
            base.OutcomeClass.TRANSIENT,
            error_class=REQUEST_TIMEOUT,
            error=f"{detail}: the server timed out receiving the request",
            retry_after_s=retry_after_s,
        )
    if 400 <= status < 500:
        return _failed(
            base.OutcomeClass.TERMINAL, error_class=BAD_REQUEST, error=f"{detail}: the endpoint rejected the request"
        )
    if status == 503 and retry_after_s is not None:
        return _failed(
            base.OutcomeClass.TRANSIENT,
            error_class=SERVER_OVERLOADED,
            error=f"{detail}: the server is overloaded",
            retry_after_s=retry_after_s,
        )
    if 500 <= status < 600:
        return _failed(
            base.OutcomeClass.TRANSIENT,
            error_class=SERVER_ERROR,
            error=f"{detail}: server error",
            retry_after_s=retry_after_s,
        )
    return _failed(
        base.OutcomeClass.TIMEOUT_AMBIGUOUS, error_class=PROTOCOL_ERROR, error=f"{detail}: unexpected status"
    )


def _error_details(body: bytes) -> tuple[str, list[str]]:
    """
    (lower-cased text to match phrases in, identifiers fit to show) of an error body. Only the
    error's own message/type/code are matched, not fields that may echo the request (`param`,
    validation details): a document that mentions "billing" must not make a 400 look like quota.
    """
    text = body.decode("utf-8", errors="replace")
    try:
        parsed = _loads(text)
    except (ValueError, RecursionError):
        return text[:2048].lower(), []
    error = parsed.get("error") if isinstance(parsed, dict) else None
    fields = [error, parsed] if isinstance(error, dict) else [parsed]
    if isinstance(error, str):
        fields.append({"message": error})
    words: list[str] = []
    identifiers: list[str] = []
    for part in fields:
        if not isinstance(part, dict):
            continue
        for name in ("message", "type", "code", "detail"):
            value = part.get(name)
            if isinstance(value, str | int) and not isinstance(value, bool):
                words.append(str(value)[:2048].lower())
                if name in ("type", "code") and _IDENTIFIER.fullmatch(str(value)) and str(value) not in identifiers:
                    identifiers.append(str(value))
    return "\n".join(words), identifiers[:2]


def _mentions(text: str, phrases: tuple[str, ...]) -> bool:
    return any(phrase in text for phrase in phrases)


def _retry_after(headers: Mapping[str, str]) -> float | None:
    """Retry-After in seconds, an HTTP-date read against the response's Date (the server's clock)."""
    value = headers.get("Retry-After")
    if value is None:
        return None
    return retry.parse_retry_after(value, now=_server_now(headers.get("Date")))


_RESET = re.compile(r"(?:([0-9]+(?:\.[0-9]+)?)(ms|h|m|s))", re.ASCII)


def _rate_limit(headers: Mapping[str, str]) -> base.RateLimitView | None:
    """OpenAI's x-ratelimit-remaining-{requests,tokens} and x-ratelimit-reset-{requests,tokens}
    (a Go duration: `1s`, `6m0s`, `20ms`; or plain seconds); None when none is sent. A value that
    cannot be read is left out, never guessed."""
    view = base.RateLimitView(
        remaining_requests=_header_count(headers.get("x-ratelimit-remaining-requests")),
        requests_reset_s=_duration_s(headers.get("x-ratelimit-reset-requests")),
        remaining_tokens=_header_count(headers.get("x-ratelimit-remaining-tokens")),
        tokens_reset_s=_duration_s(headers.get("x-ratelimit-reset-tokens")),
    )
    return None if view.remaining_requests is None and view.remaining_tokens is None else view


def _header_count(value: str | None) -> int | None:
    if value is None or not value.strip().isascii() or not value.strip().isdigit() or len(value.strip()) > 18:
        return None
    return int(value.strip())


def _duration_s(value: str | None) -> float | None:
    if value is None:
        return None
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        pass
    else:
        return seconds if math.isfinite(seconds) and seconds >= 0 else None
    if not text or len(text) > 40 or "".join(m[0] for m in _RESET.finditer(text)) != text:
        return None
    scale = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
    return sum(float(number) * scale[unit] for number, unit in _RESET.findall(text))


def _server_now(date: str | None) -> dt.datetime:
    if date is not None:
        try:
            when = email.utils.parsedate_to_datetime(date)
        except (ValueError, TypeError, OverflowError, IndexError):
            pass
        else:
            return when if when.tzinfo is not None else when.replace(tzinfo=dt.UTC)
    return dt.datetime.now(dt.UTC)


# ---------------------------------------------------------------------------------------------
# small helpers
# ---------------------------------------------------------------------------------------------

def _checked_key(api_key: str | None) -> str | None:
    """The key as sent: surrounding whitespace (a Secret written with `echo`) removed."""
    if api_key is None:
        return None
    key = api_key.strip()
    if not key:
        return None
    if any(ord(char) < 0x21 or ord(char) == 0x7F for char in key):
        raise ValueError("the API key contains whitespace or control characters")  # never the key itself
    return key


def _encode(request: dict[str, Any]) -> bytes:
    try:
        return json.dumps(request, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate in the text: send it escaped, let the server judge
        return json.dumps(request).encode("ascii")


async def _read_capped(response: aiohttp.ClientResponse, *, limit: int, truncate: bool = False) -> bytes | None:
    """The body, at most `limit` bytes (after decompression). Beyond it: None, or the first
    `limit` bytes with `truncate`. The rest is never read; the connection is then dropped."""
    declared = response.content_length
    if declared is not None and declared > limit and not truncate:
        return None
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.content.iter_chunked(64 * 1024):
        size += len(chunk)
        if size > limit:
            if not truncate:
                return None
            chunks.append(chunk[:len(chunk) - (size - limit)])
            break
        chunks.append(chunk)
    return b"".join(chunks)


def _connect_failure(exc: aiohttp.ClientConnectorError) -> str:
    if isinstance(exc, aiohttp.ClientConnectorDNSError):
        return f"could not resolve {exc.host}"
    if isinstance(exc, aiohttp.ClientSSLError):
        return f"TLS handshake with {exc.host}:{exc.port} failed"
    reason = exc.os_error.strerror or type(exc.os_error).__name__
    return f"could not connect to {exc.host}:{exc.port}: {reason}"[:300]


def _failed(
        outcome: base.OutcomeClass,
        *,
        error_class: str,
        error: str,
        retry_after_s: float | None = None,
        raw_output: str | None = None,
        tokens: tuple[int | None, int | None] = (None, None),
) -> base.Outcome:
    failed = base.Outcome.failed(
        outcome,
        error_class=error_class,
        error=error,
        retry_after_s=retry_after_s,
        raw_output=None if raw_output is None else _truncated(storable.escaped(raw_output), RAW_OUTPUT_MAX_BYTES),
    )
    if tokens == (None, None):
        return failed
    return dataclasses.replace(failed, tokens_in=tokens[0], tokens_out=tokens[1])


def _truncated(text: str, max_bytes: int) -> str:
    encoded = text.encode("utf-8", errors="replace")
    if len(encoded) <= max_bytes:
        return text
    return encoded[:max_bytes].decode("utf-8", errors="ignore")
