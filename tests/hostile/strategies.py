"""
Hypothesis strategies for what the outside world may send Lading: a model's answer, a document
manifest line, an ExtractionBatch spec, a broker message, a webhook body.

Each strategy yields *recipes* (small frozen dataclasses that print readably when hypothesis
reports a failing example), not the bytes themselves: a model answer is spliced into the valid
extraction of the document it answers, which only the test knows. What they cover:

    text      any code point, U+0000 and lone surrogates included (hypothesis leaves surrogates
              out unless asked), raw or as the JSON escapes `\\u0000` / `\\ud800` a server sends
    numbers   integers past 2⁶³ either way, `1e309`, NaN, Infinity (not JSON, but sent anyway)
    shape     nesting from a few levels to past any recursion limit, non-JSON, truncated JSON,
              JSON of the wrong type
    size      huge bodies (10 MB and more) are explicit examples in the tests, not generated,
              so every run stays fast

Only the model-answer recipes need the document; the others are complete inputs.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from typing import Any

from hypothesis import strategies as st

# --- Building blocks.

SURROGATES = st.integers(0xD800, 0xDFFF).map(chr)
ANY_CHAR = st.characters() | SURROGATES | st.just("\x00")
ANY_TEXT = st.text(ANY_CHAR, max_size=30)
POISON = st.sampled_from(["\x00", "\ud800", "\udbff", "\udc00", "\udfff"]) | SURROGATES
UNSTORABLE_TEXT = st.builds(lambda a, p, b: a + p + b, ANY_TEXT, POISON, ANY_TEXT)
"""Text holding at least one U+0000 or lone surrogate."""
HUGE_INT = st.integers(2**63, 10**300) | st.integers(-(10**300), -(2**63) - 1)
"""Past bigint either way, but short of Python's 4300-digit conversion limit."""
NON_FINITE = st.sampled_from(["1e309", "-1e309", "1E400", "NaN", "Infinity", "-Infinity", "-0e99999", "1e99999"])
"""Number literals that are not finite numbers (NaN and Infinity are not JSON at all)."""
JSON_LIKE = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | ANY_TEXT,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(ANY_TEXT, children, max_size=4),
    max_leaves=15,
)
"""JSON-like values, floats NaN/inf and unstorable strings included."""


def nested(depth: int, *, kind: str) -> str:
    """JSON text nested `depth` levels deep: lists, objects, or both alternating."""
    if kind == "list":
        return "[" * depth + "]" * depth
    if kind == "object":
        return '{"a":' * depth + "1" + "}" * depth
    return '[{"a":' * (depth // 2) + "0" + "}]" * (depth // 2)


DEEP = st.builds(nested, st.integers(100, 12_000), kind=st.sampled_from(["list", "object", "mixed"]))


def dumps(value: Any, *, ascii_only: bool = True) -> str:
    """JSON as a server writes it: a lone surrogate or NUL becomes an escape, NaN stays NaN."""
    return json.dumps(value, ensure_ascii=ascii_only)


def _short_repr(recipe: object) -> str:
    """The recipe with long values cut, so a failing example (10 MB ones included) prints readably."""
    fields = []
    for field in dataclasses.fields(recipe):  # type: ignore[arg-type]
        value = getattr(recipe, field.name)
        text = repr(value)
        if len(text) > 120:
            text = f"{text[:100]}...<{len(value)} long>"
        fields.append(f"{field.name}={text}")
    return f"{type(recipe).__name__}({', '.join(fields)})"


# --- Model answers.

FIELDS: tuple[tuple[str | int, ...], ...] = (
    ("invoice_number",), ("supplier", "name"), ("buyer", "name"), ("total",), ("currency",),
    ("lines", 0, "description"), ("lines", 0, "amount"), ("evidence",), ("issue_date",),
)  # fmt: skip
"""Places in a valid invoice.v1 answer where a hostile value is spliced."""


@dataclasses.dataclass(frozen=True)
class ModelAnswer:
    """One hostile answer to a chat-completions request, made from the document's valid extraction.

    `kind` names the family (for the tally and for reading a failure). At most one of `splice`
    (raw JSON text put at `field` of the valid answer), `content` (the whole message content) and
    `body` (the whole HTTP body, envelope and all) is set; `usage` is the raw JSON of the usage
    object when it is hostile."""

    kind: str
    field: tuple[str | int, ...] = ()
    splice: str | None = None
    content: str | None = None
    body: bytes | None = None
    usage: str | None = None

    def __repr__(self) -> str:
        return _short_repr(self)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:  # how hypothesis prints an example
        printer.text(_short_repr(self))

    def http_body(self, valid: dict[str, Any]) -> bytes:
        """The bytes the stub sends for a document whose valid answer is `valid`."""
        if self.body is not None:
            return self.body
        content = self.content if self.content is not None else self._spliced(valid)
        usage = self.usage if self.usage is not None else '{"prompt_tokens": 812, "completion_tokens": 233}'
        message = '{"role": "assistant", "content": ' + dumps(content) + "}"
        return (
            '{"id": "chatcmpl-hostile", "object": "chat.completion", "created": 1700000000, "model": "stub",'
            ' "choices": [{"index": 0, "message": ' + message + ', "finish_reason": "stop"}],'
            ' "usage": ' + usage + "}"
        ).encode("utf-8", "surrogatepass")

    def _spliced(self, valid: dict[str, Any]) -> str:
        if self.splice is None:
            return dumps(valid)
        marker = f"@@{uuid.uuid4().hex}@@"
        changed = json.loads(json.dumps(valid))
        target: Any = changed
        for part in self.field[:-1]:
            target = target[part]
        target[self.field[-1]] = marker
        return dumps(changed).replace(dumps(marker), self.splice)


_FIELD = st.sampled_from(FIELDS)

_ESCAPES = st.builds(lambda f, t: ModelAnswer("escape", field=f, splice=dumps(t)), _FIELD, UNSTORABLE_TEXT)
"""A string whose JSON escapes decode to NUL or a lone surrogate."""
_ESCAPED_KEYS = st.builds(
    lambda t: ModelAnswer("escaped-key", field=("evidence",), splice=dumps({t: "1"})), UNSTORABLE_TEXT
)
_HUGE_INTS = st.builds(lambda f, n: ModelAnswer("huge-int", field=f, splice=str(n)), _FIELD, HUGE_INT)
_NON_FINITE = st.builds(lambda f, n: ModelAnswer("non-finite", field=f, splice=n), _FIELD, NON_FINITE)
_DEEP_FIELD = st.builds(lambda f, d: ModelAnswer("deep", field=f, splice=d), _FIELD, DEEP)
_DEEP_CONTENT = st.builds(lambda d: ModelAnswer("deep", content=d), DEEP)
_NOT_JSON = st.builds(lambda t: ModelAnswer("not-json", content=t), ANY_TEXT | st.sampled_from(
    ["", "{", '{"total": ', "null", "[]", "Sure! Here is the JSON:", "```json\n{}\n```", '{"a": 1}{"b": 2}']
))  # fmt: skip
_ANY_VALUE = st.builds(lambda v: ModelAnswer("json-value", content=dumps(v)), JSON_LIKE)
_USAGE = st.builds(
    lambda p, c: ModelAnswer("usage", usage='{"prompt_tokens": ' + p + ', "completion_tokens": ' + c + "}"),
    st.sampled_from(["-1", "1.5", '"812"', "true", "null", "1e309", "NaN", str(2**64), str(10**30)]),
    st.sampled_from(["233", "-0", str(2**63), "[]", "{}", '"\\u0000"']),
)
_BODIES = st.builds(lambda b: ModelAnswer("body", body=b), st.binary(max_size=64) | st.sampled_from([
    b"", b"null", b"[]", b'{"choices": []}', b'{"choices": [null]}', b'{"choices": [{"message": "hi"}]}',
    b'{"choices": [{"message": {"content": 7}, "finish_reason": "stop"}]}',
    b'{"choices": [{"message": {"content": null, "refusal": "\\u0000\\ud800"}, "finish_reason": "stop"}]}',
    b'{"choices": [{"message": {"content": "{}"}, "finish_reason": "\\u0000"}]}',
    b'{"choices": NaN}', b"\xff\xfe\x00{", b'{"choices": ' + b"[" * 10_000 + b"]" * 10_000 + b"}",
]))  # fmt: skip
"""The HTTP body itself hostile: not JSON, not UTF-8, not a chat completion, absurdly nested."""


def model_answers() -> st.SearchStrategy[ModelAnswer]:
    return st.one_of(
        _ESCAPES, _ESCAPED_KEYS, _HUGE_INTS, _NON_FINITE, _DEEP_FIELD, _DEEP_CONTENT, _NOT_JSON, _ANY_VALUE,
        _USAGE, _BODIES,
    )  # fmt: skip


HUGE_ANSWERS = (
    ModelAnswer("huge", content='"' + "x" * 10_000_000 + '"'),  # past max_response_bytes: not read
    ModelAnswer("huge", field=("supplier", "name"), splice=dumps("Acme " * 1_000_000)),  # 5 MB, read and refused
    ModelAnswer("huge", content=nested(10_000, kind="list")),
    ModelAnswer("huge", field=("evidence",), splice=nested(10_000, kind="object")),
)
"""The huge ones, as explicit examples: a 10 MB string, a 5 MB field, 10,000-deep nesting."""


# --- Document manifests (JSON lines) and ExtractionBatch specs.

GOOD_SHA = "a" * 64

_LINE_FIELD_VALUES = st.one_of(
    ANY_TEXT, UNSTORABLE_TEXT, HUGE_INT, st.integers(), st.floats(), st.booleans(), st.none(),
    st.lists(st.integers(), max_size=2), st.sampled_from(["", "../../etc/passwd", "file:///etc/passwd",
                                                          "http://169.254.169.254/", "a" * 300]),
)  # fmt: skip


@st.composite
def manifest_lines(draw: st.DrawFn, *, valid_only: bool = False) -> bytes:
    """One line: a valid one, one with a field replaced, one field missing or extra, or any bytes."""
    n = draw(st.integers(0, 10**6))
    good: dict[str, Any] = {"key": f"doc-{n}", "uri": f"file:///data/doc-{n}.txt", "sha256": GOOD_SHA, "bytes": 10}
    hostile = ["field", "missing", "extra", "bytes", "deep", "escapes"]
    how = "valid" if valid_only else draw(st.sampled_from(["valid", *hostile]))
    if how == "valid":
        return dumps(good).encode()
    if how == "field":
        good[draw(st.sampled_from(sorted(good)))] = draw(_LINE_FIELD_VALUES)
    elif how == "missing":
        del good[draw(st.sampled_from(sorted(good)))]
    elif how == "extra":
        good[draw(ANY_TEXT)] = draw(JSON_LIKE)
    elif how == "bytes":
        return draw(st.binary(max_size=80)).replace(b"\n", b" ")
    elif how == "deep":
        return draw(DEEP).encode()
    else:
        return dumps(good).replace('"key"', dumps(draw(ANY_TEXT)), 1).encode("utf-8", "surrogatepass")
    return dumps(good).encode("utf-8", "surrogatepass")


_SPEC_VALUES = st.one_of(
    ANY_TEXT, UNSTORABLE_TEXT, HUGE_INT, st.integers(), st.floats(), st.booleans(), st.none(), JSON_LIKE,
    st.sampled_from(["normal", "high", "low", "invoice.v1", "invoice-strict-v1", "", "x" * 5000]),
)  # fmt: skip
SPEC_FIELDS = ("schema", "inferencePoolRef", "priority", "deadlineSeconds", "validationPolicy", "suspend",
               "documents", "deliveryEndpointRef")  # fmt: skip


@st.composite
def batch_specs(draw: st.DrawFn) -> dict[str, Any]:
    """An ExtractionBatch spec (inline documents): valid, or with fields, documents or keys made hostile."""
    count = draw(st.integers(1, 6))
    documents: list[Any] = [{"key": f"inv-{i}", "text": f"Invoice INV-{i} total {i}.00 EUR"} for i in range(count)]
    spec: dict[str, Any] = {"schema": "invoice.v1", "inferencePoolRef": {"name": "builtin"}, "documents": documents}
    for _ in range(draw(st.integers(0, 3))):
        how = draw(st.sampled_from(["field", "document", "document-field", "duplicate", "extra"]))
        if how == "field":
            spec[draw(st.sampled_from(SPEC_FIELDS))] = draw(_SPEC_VALUES)
        elif how == "document" and isinstance(spec.get("documents"), list) and spec["documents"]:
            spec["documents"][draw(st.integers(0, len(spec["documents"]) - 1))] = draw(_SPEC_VALUES)
        elif how == "document-field" and isinstance(spec.get("documents"), list) and spec["documents"]:
            document = spec["documents"][draw(st.integers(0, len(spec["documents"]) - 1))]
            if isinstance(document, dict):
                document[draw(st.sampled_from(["key", "text"]))] = draw(_SPEC_VALUES)
        elif how == "duplicate" and isinstance(spec.get("documents"), list) and spec["documents"]:
            spec["documents"].append(spec["documents"][0])
        elif how == "extra":
            spec[draw(ANY_TEXT)] = draw(JSON_LIKE)
    return spec


# --- Broker messages.


@dataclasses.dataclass(frozen=True)
class BrokerMessage:
    """A message published raw to the ingress queue: properties and body as any producer may set them."""

    kind: str
    body: bytes
    message_id: str | None
    type: str | None

    def __repr__(self) -> str:
        return _short_repr(self)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:  # how hypothesis prints an example
        printer.text(_short_repr(self))


EVENT_TYPES = st.sampled_from(["extraction.completed.v1", "batch.accepted.v1", "extraction.failed.v1", "x.v1"])
_SHORT = ANY_TEXT.map(lambda t: dumps(t)[1:-1][:200])
"""Any text as an AMQP short string can carry it (escaped, at most 255 bytes)."""
_MESSAGE_IDS = st.one_of(st.uuids().map(str), st.none(), _SHORT, st.just(""))
_TYPES = st.one_of(EVENT_TYPES, st.none(), _SHORT, st.just("A.V1"))


def _json_body(value: Any) -> bytes:
    return dumps(value).encode("utf-8", "surrogatepass")


@st.composite
def broker_messages(draw: st.DrawFn) -> BrokerMessage:
    """A message with hostile properties, a hostile body, or both."""
    how = draw(st.sampled_from(["escapes", "huge-int", "non-finite", "deep", "not-json", "not-object",
                                "ids", "properties", "any"]))  # fmt: skip
    ids = {"job_id": draw(st.integers(1, 2**62)), "batch_id": draw(st.integers(1, 2**62))}
    body: bytes
    if how == "escapes":
        body = _json_body({**ids, draw(ANY_TEXT): draw(UNSTORABLE_TEXT)})
    elif how == "huge-int":
        body = _json_body({**ids, "fence": draw(HUGE_INT)})
    elif how == "non-finite":
        body = ('{"job_id": 1, "batch_id": 1, "score": ' + draw(NON_FINITE) + "}").encode()
    elif how == "deep":
        body = ('{"job_id": 1, "batch_id": 1, "x": ' + draw(DEEP) + "}").encode()
    elif how == "not-json":
        body = draw(st.binary(max_size=80))
    elif how == "not-object":
        body = _json_body(draw(st.lists(JSON_LIKE, max_size=3) | ANY_TEXT | st.integers()))
    elif how == "ids":
        body = _json_body({"job_id": draw(_SPEC_VALUES), "batch_id": draw(_SPEC_VALUES)})
    elif how == "properties":
        body = _json_body(ids)
    else:
        body = _json_body(draw(st.dictionaries(ANY_TEXT, JSON_LIKE, max_size=4)))
    valid_properties = how != "properties" and draw(st.booleans())
    message_id = str(uuid.uuid4()) if valid_properties else draw(_MESSAGE_IDS)
    type_ = draw(EVENT_TYPES) if valid_properties else draw(_TYPES)
    return BrokerMessage(kind=how, body=body, message_id=message_id, type=type_)


HUGE_MESSAGES = (
    BrokerMessage("huge", b'{"job_id": 1, "pad": "' + b"x" * (2 << 20) + b'"}', str(uuid.uuid4()),
                  "extraction.completed.v1"),
)
"""Past the ingress's 1 MiB body limit, otherwise a valid event."""
FOUND_MESSAGES = (
    BrokerMessage("deep", b'{"job_id": 1, "x": ' + b"[" * 300 + b"]" * 300 + b"}", str(uuid.uuid4()),
                  "extraction.completed.v1"),
    BrokerMessage("huge-int", b'{"job_id": 1, "fence": 18446744073709551616}', str(uuid.uuid4()),
                  "extraction.completed.v1"),
)
"""Messages that once wedged the consumer (nested past orjson's 254 levels: never acked nor
dead-lettered) or were recorded changed (an integer past 64 bits read as a float)."""


# --- Webhook bodies.

WEBHOOK_PLACES: tuple[tuple[str, ...], ...] = (
    ("type",), ("data", "tenant"), ("data", "job_id"), ("data", "result", "supplier", "name"),
    ("data", "result", "total"), ("data", "result", "lines"), ("data", "result", "evidence"), ("data",),
    ("data", "schema"), ("data", "document_key"), ("timestamp",),
)  # fmt: skip


@dataclasses.dataclass(frozen=True)
class WebhookBody:
    """A delivery body: a valid completed event with a value replaced (`place`, raw JSON `splice`),
    or whole `raw` bytes. `unstorable` says the recipe put U+0000, a lone surrogate or an integer
    past 64 bits in it on purpose (a 400 is then required, never a 200)."""

    kind: str
    place: tuple[str, ...] = ()
    splice: str | None = None
    raw: bytes | None = None
    unstorable: bool = False

    def __repr__(self) -> str:
        return _short_repr(self)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:  # how hypothesis prints an example
        printer.text(_short_repr(self))

    def encoded(self, valid: bytes) -> bytes:
        if self.raw is not None:
            return self.raw
        assert self.splice is not None
        envelope = json.loads(valid)
        marker = f"@@{uuid.uuid4().hex}@@"
        target = envelope
        for part in self.place[:-1]:
            target = target[part]
        target[self.place[-1]] = marker
        return dumps(envelope).replace(dumps(marker), self.splice).encode("utf-8", "surrogatepass")


_PLACE = st.sampled_from(WEBHOOK_PLACES)


def webhook_bodies() -> st.SearchStrategy[WebhookBody]:
    return st.one_of(
        st.builds(lambda p, t: WebhookBody("escape", p, dumps(t), unstorable="\x00" in t), _PLACE, UNSTORABLE_TEXT),
        st.builds(lambda p, n: WebhookBody("huge-int", p, str(n), unstorable=True), _PLACE, HUGE_INT),
        st.builds(lambda p, n: WebhookBody("non-finite", p, n), _PLACE, NON_FINITE),
        st.builds(lambda p, d: WebhookBody("deep", p, d), _PLACE, DEEP),
        st.builds(lambda p, v: WebhookBody("value", p, dumps(v)), _PLACE, JSON_LIKE),
        st.builds(lambda b: WebhookBody("not-json", raw=b), st.binary(max_size=80)),
        st.builds(lambda v: WebhookBody("not-object", raw=_json_body(v)), st.lists(JSON_LIKE, max_size=3)),
    )  # fmt: skip
