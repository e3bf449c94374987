"""
A real model server for tests: aiohttp on 127.0.0.1 (a random port) speaking
`POST /v1/chat/completions` like vLLM and the OpenAI API, with a reply the test programs.

    async with model_stub.running(reply=model_stub.answer(result)) as stub:
        provider = OpenAICompatibleProvider(base_url=stub.url, ...)
        stub.reply = model_stub.rate_limited(retry_after="7")   # change it any time

Every request is recorded (method, path, headers, raw body, parsed JSON) in `stub.requests`,
whatever its path, and `stub.max_concurrent` is the most requests it held at once: a test can
assert that exactly one request was made and nothing else was asked. Requests to any other path
get a 404.

Replies are small functions of the request; the ones here cover what providers must survive:
answers (valid, malformed, truncated, refused), error statuses with OpenAI/vLLM error bodies,
429 with Retry-After, redirects, hanging, a slow first byte, a trickling body, a connection
reset in the middle of the body, a dropped connection, bytes that are not HTTP, huge bodies.
Replies that wait (`hang`, `trickle`) end when the stub closes, so shutdown never hangs.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import re
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import multidict
from aiohttp import web

from lading_demo import builtin

CHAT_PATH = "/v1/chat/completions"
REQUEST_MAX_BYTES = 16 * 1024 * 1024
"""Above aiohttp's 1 MiB default: a request carries a whole document (up to 1 MiB) plus the prompt."""

Reply = Callable[["ModelStub", web.Request], Awaitable[web.StreamResponse]]


@dataclasses.dataclass(frozen=True)
class RecordedRequest:
    method: str
    path: str
    headers: Mapping[str, str]
    """Case-insensitive, as received."""
    raw: bytes
    body: Any
    """The JSON body, parsed; None if it was not JSON."""
    received_at: float = 0.0
    """time.monotonic() when the request was read."""

    @property
    def messages(self) -> list[dict[str, str]]:
        messages: list[dict[str, str]] = self.body["messages"]
        return messages


class ModelStub:
    """The running server; build it with `running()`."""

    def __init__(self, reply: Reply) -> None:
        self.reply = reply
        """What the next request gets; tests may swap it between calls."""
        self.requests: list[RecordedRequest] = []
        self.in_flight = 0
        self.max_concurrent = 0
        self.closing = asyncio.Event()
        """Set when the stub shuts down: replies that wait end then."""
        self.port = 0
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        """The base URL a provider is configured with (ends in /v1)."""
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        app = web.Application(client_max_size=REQUEST_MAX_BYTES)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=1.0)
        await self._runner.setup()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        await web.SockSite(self._runner, sock).start()

    async def close(self) -> None:
        self.closing.set()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        self.requests.append(RecordedRequest(
            method=request.method,
            path=request.path,
            headers=multidict.CIMultiDict(request.headers),
            raw=raw,
            body=body,
            received_at=time.monotonic(),
        ))
        if request.path != CHAT_PATH or request.method != "POST":
            return web.json_response({"error": {"message": "not found", "type": "NotFoundError"}}, status=404)
        self.in_flight += 1
        self.max_concurrent = max(self.max_concurrent, self.in_flight)
        try:
            return await self.reply(self, request)
        finally:
            self.in_flight -= 1


@contextlib.asynccontextmanager
async def running(reply: Reply | None = None) -> AsyncIterator[ModelStub]:
    """A started stub (answering `reply`, or a 500 until a test sets one), closed on exit."""
    stub = ModelStub(reply or status(500))
    await stub.start()
    try:
        yield stub
    finally:
        await stub.close()


# ---------------------------------------------------------------------------------------------
# replies: answers
# ---------------------------------------------------------------------------------------------

def completion_body(
        content: str | None,
        *,
        finish_reason: str = "stop",
        prompt_tokens: int | None = 812,
        completion_tokens: int | None = 233,
        refusal: str | None = None,
        model: str = "stub-model",
) -> dict[str, Any]:
    """A chat.completion object as vLLM returns it."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if refusal is not None:
        message["refusal"] = refusal
    body: dict[str, Any] = {
        "id": "chatcmpl-stub",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
    }
    if prompt_tokens is not None or completion_tokens is not None:
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens}
        body["usage"] = {key: value for key, value in usage.items() if value is not None}
    return body


def completion(content: str | None, **options: Any) -> Reply:
    """A 200 whose message content is `content` as given (valid JSON or not)."""
    body = completion_body(content, **options)

    async def reply(stub: ModelStub, request: web.Request) -> web.StreamResponse:
        return web.json_response(body)

    return reply


def answer(result: Mapping[str, Any], **options: Any) -> Reply:
    """A 200 whose content is `result` as JSON: what a well-behaved model says."""
    return completion(json.dumps(result), **options)


def echo_authorization() -> Reply:
    """A 200 whose content is the request's Authorization header: a server that leaks it back."""

    async def reply(stub: ModelStub, request: web.Request) -> web.StreamResponse:
        return web.json_response(completion_body(f"not json {request.headers.get('Authorization')}"))

    return reply


# ---------------------------------------------------------------------------------------------
# replies: error statuses
# ---------------------------------------------------------------------------------------------

def status(
        code: int,
        *,
        body: Any = None,
        text: str | None = None,
        headers: Mapping[str, str] | None = None,
) -> Reply:
    """Status `code` with a JSON `body` (default: an OpenAI-style error object) or a plain `text`."""

    async def reply(stub: ModelStub, request: web.Request) -> web.StreamResponse:
        if text is not None:
            return web.Response(status=code, text=text, headers=headers)
        payload = body if body is not None else {"error": {"message": f"stub says {code}", "type": "StubError"}}
        return web.json_response(payload, status=code, headers=headers)

    return reply


def vllm_error(code: int, message: str, *, error_type: str = "BadRequestError", **kwargs: Any) -> Reply:
    """An error in vLLM's flat shape: {"object": "error", "message", "type", "param", "code"}."""
    body = {"object": "error", "message": message, "type": error_type, "param": None, "code": code}
    return status(code, body=body, **kwargs)


def openai_error(code: int, message: str, *, error_type: str, error_code: str | None = None, **kwargs: Any) -> Reply:
    """An error in OpenAI's shape: {"error": {"message", "type", "param", "code"}}."""
    body = {"error": {"message": message, "type": error_type, "param": None, "code": error_code}}
    return status(code, body=body, **kwargs)


def rate_limited(*, retry_after: str | None, headers: Mapping[str, str] | None = None) -> Reply:
    """429 with Retry-After (seconds or an HTTP-date), as OpenAI sends it."""
    all_headers = dict(headers or {})
    if retry_after is not None:
        all_headers["Retry-After"] = retry_after
    return openai_error(
        429, "Rate limit reached for requests", error_type="requests", error_code="rate_limit_exceeded",
        headers=all_headers,
    )


def context_length_exceeded() -> Reply:
    """vLLM's 400 for a prompt that does not fit."""
    return vllm_error(
        400,
        "This model's maximum context length is 8192 tokens. However, you requested 12000 tokens "
        "(7904 in the messages, 4096 in the completion). Please reduce the length of the messages or completion.",
    )


def redirect(location: str, *, code: int = 302) -> Reply:
    async def reply(stub: ModelStub, request: web.Request) -> web.StreamResponse:
        return web.Response(status=code, headers={"Location": location})

    return reply


# ---------------------------------------------------------------------------------------------
# replies: time and transport
# ---------------------------------------------------------------------------------------------

def hang() -> Reply:
    """Never answer (until the stub closes)."""

    async def reply(stub: ModelStub, request: web.Request) -> web.StreamResponse:
        await stub.closing.wait()
        return web.Response(status=503)

    return reply


def delayed(delay_s: float, then: Reply) -> Reply:
    """Say nothing for `delay_s`, then reply as `then` does: a slow first byte."""

    async def reply(stub: ModelStub, request: web.Request) -> web.StreamResponse:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stub.closing.wait(), delay_s)
        return await then(stub, request)

    return reply


def trickle(*, interval_s: float) -> Reply:
    """Headers at once, then one body byte every `interval_s`, forever: only a total timeout ends it."""

    async def reply(stub: ModelStub, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        await response.prepare(request)
        with contextlib.suppress(ConnectionError):
            while not stub.closing.is_set():
                await response.write(b" ")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stub.closing.wait(), interval_s)
        return response

    return reply


def reset_mid_body() -> Reply:
    """Headers promising 4096 bytes, 100 of them, then the connection is closed."""

    async def reply(stub: ModelStub, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        response.content_length = 4096
        await response.prepare(request)
        await response.write(b'{"id": "chatcmpl-stub", "choices": [' + b" " * 64)
        assert request.transport is not None
        request.transport.close()
        return response

    return reply


def drop() -> Reply:
    """Close the connection without answering (after the request was read)."""

    async def reply(stub: ModelStub, request: web.Request) -> web.StreamResponse:
        assert request.transport is not None
        request.transport.close()
        return web.Response(status=500)  # never sent

    return reply


def not_http() -> Reply:
    """Bytes that are not an HTTP response, then close."""

    async def reply(stub: ModelStub, request: web.Request) -> web.StreamResponse:
        assert request.transport is not None
        request.transport.write(b"SSH-2.0-OpenSSH_9.6\r\n\r\n")
        request.transport.close()
        return web.Response(status=500)  # never sent

    return reply


def huge(size: int, *, declare_length: bool) -> Reply:
    """A 200 of `size` bytes, with Content-Length or chunked."""

    async def reply(stub: ModelStub, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        if declare_length:
            response.content_length = size
        else:
            response.enable_chunked_encoding()
        await response.prepare(request)
        chunk = b" " * (256 * 1024)
        sent = 0
        with contextlib.suppress(ConnectionError):
            while sent < size:
                piece = chunk[:size - sent]
                await response.write(piece)
                sent += len(piece)
        return response

    return reply


# ---------------------------------------------------------------------------------------------
# replies: a model that reads the document
# ---------------------------------------------------------------------------------------------

DOCUMENT = re.compile(r"^<document-([0-9a-f]+)>\n(.*)\n</document-\1>$", re.DOTALL | re.MULTILINE)


def extracting() -> Reply:
    """Answers with what the built-in extractor reads from the delimited document."""

    async def reply(stub: ModelStub, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        user = next(m["content"] for m in body["messages"] if m["role"] == "user")
        match = DOCUMENT.search(user)
        assert match is not None, "the document is delimited in the user message"
        outcome = builtin.extract_text(match[2])
        content = json.dumps(outcome.result) if outcome.result is not None else "{}"
        usage = {"prompt_tokens": len(user) // 4, "completion_tokens": len(content) // 4}
        return web.json_response(completion_body(content, **usage))

    return reply
