"""
What PostgreSQL can store, and what to do with a row it refuses.

PostgreSQL's `text` and `jsonb` cannot hold U+0000, a UTF-8 encoder cannot encode a lone
surrogate, and `bigint` stops at 2⁶³-1. Such a value is a fact about the *row*, not about the
server: retrying it can never succeed, and retrying the group it came in would hold every good
row of that group hostage. Two defences, in this order:

1. **At the boundary where a value enters** (spec models, model output, broker messages, the
   receiver, review corrections) `unstorable_reason` names what is wrong, and the value is
   refused with a named error there.
2. **Defence in depth in every multi-row writer** (the committer, the dispatcher's record, the
   relay, the ingress): a statement that fails with a data error (`is_data_error`: SQLSTATE
   classes 22 and 54, raised by the server or by asyncpg's own argument encoding) is split by
   `isolate` until every good row is written and each bad one is alone; the writer then ends
   the bad one terminally with error class `UNSTORABLE`. A data error is never "database
   unavailable".

It sits at the bottom of the core, beside `lading.ids` and `lading.errors`, because the spec
models, the job transitions and the providers check values with it long before any repository
sees them; `lading.db` and the writers above it use the rest.

`isolate` does not open transactions: each call of `apply` must be its own unit of work (its
own transaction, or a savepoint inside the caller's), because a failed statement aborts the
transaction it ran in.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Generic, TypeVar

import asyncpg
import orjson

UNSTORABLE = "UNSTORABLE"
"""Error class of a row that PostgreSQL refused to store (SQLSTATE class 22 or 54)."""

DATA_ERROR_CLASSES = ("22", "54")
"""SQLSTATE classes that blame the data: data exception, program limit exceeded."""

BIGINT_MAX = 2**63 - 1
BIGINT_MIN = -(2**63)

T = TypeVar("T")
R = TypeVar("R")


def is_data_error(exc: BaseException) -> bool:
    """True when `exc` says a value cannot be stored (never retry it as is), as opposed to the
    database being unreachable, restarting, or a serialization/deadlock failure."""
    if not isinstance(exc, asyncpg.PostgresError):
        return False
    sqlstate = getattr(exc, "sqlstate", None)
    return isinstance(sqlstate, str) and sqlstate[:2] in DATA_ERROR_CLASSES


def unstorable_reason(value: object, *, where: str = "value") -> str | None:
    """Why `value` (str, number, or JSON-like nesting of them) cannot be stored, naming the
    place (`where`, extended with keys and indexes); None when it can.

    Checks: U+0000 and lone surrogates in strings (keys included), integers outside bigint,
    floats that are not finite (JSON has no NaN or Infinity). Iterative, so a 10,000-deep
    nesting is checked without recursion. A dict or list whose JSON rendering shows it storable
    (`_storable_as_rendered`, the usual case) is not walked at all."""
    if isinstance(value, (dict, list)) and _storable_as_rendered(value):
        return None
    return _walked_reason(value, where=where)


def _walked_reason(value: object, *, where: str) -> str | None:
    """`unstorable_reason` by a walk over every value."""
    stack: list[tuple[object, str]] = [(value, where)]
    while stack:
        item, path = stack.pop()
        if isinstance(item, str):
            reason = _text_reason(item)
            if reason is not None:
                return f"{path}: {reason}"
        elif isinstance(item, bool) or item is None:
            continue
        elif isinstance(item, int):
            if not BIGINT_MIN <= item <= BIGINT_MAX:
                return f"{path}: integer out of range (more than 64 bits)"
        elif isinstance(item, float):
            if not math.isfinite(item):
                return f"{path}: {item!r} is not a finite number"
        elif isinstance(item, Mapping):
            for key, child in item.items():
                key_reason = _text_reason(key) if isinstance(key, str) else None
                if key_reason is not None:
                    return f"{path}: a key {key_reason}"
                stack.append((child, f"{path}.{key}"))
        elif isinstance(item, (list, tuple)):
            stack.extend((child, f"{path}[{index}]") for index, child in enumerate(item))
    return None


_NUL_ESCAPE = b"\\u0000"
_SHAPES = bytes.maketrans(b"0123456789[,", b"0000000000::")
"""Each digit as `0`, and `[` and `,` as `:` (what may stand before a number in orjson's compact
rendering); other bytes as they are."""
_LONG_NUMBERS = (b":" + b"0" * 19, b":-" + b"0" * 19)
"""A JSON number of 19 digits or more, as `_SHAPES` shows it: the only integers orjson renders that
may exceed bigint (a string holding such digits is a false alarm, never a miss)."""


def _storable_as_rendered(value: dict[object, object] | list[object]) -> bool:
    """True when `value` is storable as its orjson rendering shows: several times cheaper than the
    walk, which is left to say why when this is False (a false alarm only costs the walk).

    orjson refuses lone surrogates, keys that are not strings, integers past 64 bits and types
    it does not know (raising TypeError). What it lets through that PostgreSQL cannot store:
    U+0000 (rendered as the escape `\\u0000`), an integer between 2⁶³ and 2⁶⁴ (19 digits or more
    after `[`, `:` or `,`), and NaN or an infinity (rendered as `null`, so a rendering with
    `null` in it must read back equal to `value`). A string can only contain these patterns,
    never hide them."""
    try:
        rendered = orjson.dumps(value)
    except TypeError:  # orjson.JSONEncodeError included
        return False
    if _NUL_ESCAPE in rendered:
        return False
    shapes = rendered.translate(_SHAPES)
    if _LONG_NUMBERS[0] in shapes or _LONG_NUMBERS[1] in shapes:
        return False
    return b"null" not in rendered or bool(orjson.loads(rendered) == value)


def _text_reason(text: str) -> str | None:
    if "\x00" in text:
        return "contains U+0000 (NUL), which PostgreSQL text cannot store"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"contains a lone surrogate U+{ord(text[exc.start]):04X}, which is not valid UTF-8"
    return None


def escaped(text: str) -> str:
    """`text` with NUL and lone surrogates written as `\\u0000`/`\\udXXX` escapes: storable, and
    still showing a reviewer exactly what was received."""
    if _text_reason(text) is None:
        return text
    return text.encode("utf-8", "backslashreplace").decode("utf-8").replace("\x00", "\\u0000")


@dataclasses.dataclass
class Isolated(Generic[T, R]):
    """The outcome of `isolate`: the results of the groups that were written, and each item
    that could not be written with the data error it caused alone."""

    results: list[R] = dataclasses.field(default_factory=list)
    refused: list[tuple[T, asyncpg.PostgresError]] = dataclasses.field(default_factory=list)


async def isolate(
        items: Sequence[T],
        apply: Callable[[Sequence[T]], Awaitable[R]],
) -> Isolated[T, R]:
    """Apply `items` in one call; on a data error, bisect until every good item is applied and
    every bad one failed alone. Any other error propagates (the caller's retry decides).

    The good path costs one call; a group with one bad row costs about 2·log₂(n) calls."""
    outcome: Isolated[T, R] = Isolated()
    pending: list[Sequence[T]] = [items] if items else []
    while pending:
        group = pending.pop()
        try:
            outcome.results.append(await apply(group))
        except asyncpg.PostgresError as exc:
            if not is_data_error(exc):
                raise
            if len(group) == 1:
                outcome.refused.append((group[0], exc))
                continue
            middle = len(group) // 2
            pending.append(group[middle:])
            pending.append(group[:middle])
    return outcome
