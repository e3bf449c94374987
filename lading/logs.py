"""
Structured logs: one JSON object per line, with the ids that tie an event to its job.

Every process (worker, operator, receiver, `lading run`) configures logging through
`configure()`. With `fmt="json"` (the default in Kubernetes; `--log-format` / $LADING_LOG_FORMAT)
each record becomes one line carrying `time`, `level`, `logger`, `message` and whatever
correlation ids are bound at that moment: job_id, batch_id, tenant, attempt, fence, pool,
delivery_id, event_id, trace_id.

Ids are bound with `bound(...)` (a context manager over a ContextVar), so they follow the
asyncio task that handles one attempt or one delivery without being passed to every call:

    with logs.bound(job_id=job.id, tenant=job.tenant, fence=job.fence):
        ...  # every record logged here, by any module, carries these ids

What never goes into a log line at info level: document text, model output, secrets, request
bodies. Log calls pass ids and classes of errors, not payloads; `CORRELATION_FIELDS` is the
closed list of fields the filter adds, so nothing else leaks in through this path.
"""

from __future__ import annotations

import contextvars
import logging
import sys
from typing import Literal

from pythonjsonlogger import json as jsonlogger

LogFormat = Literal["json", "text"]

CORRELATION_FIELDS = (
    "job_id", "batch_id", "tenant", "attempt", "fence", "pool", "delivery_id", "event_id", "trace_id",
)

_CORRELATION_FIELD_SET = frozenset(CORRELATION_FIELDS)

_bound: contextvars.ContextVar[dict[str, object]] = contextvars.ContextVar("lading_log_ids", default={})  # noqa: B039 - never mutated


def bound(**ids: object) -> Bound:
    """Attach correlation ids to every record logged in this context (nested contexts add up)."""
    unknown = ids.keys() - _CORRELATION_FIELD_SET
    if unknown:
        raise ValueError(f"not correlation fields: {sorted(unknown)}")
    return Bound({k: v for k, v in ids.items() if v is not None})


class Bound:
    """What `bound()` returns: a context manager (a plain class, not a generator: it is entered
    once per attempt and per delivery, thousands of times a second)."""

    __slots__ = ("_ids", "_token")

    def __init__(self, ids: dict[str, object]) -> None:
        self._ids = ids
        self._token: contextvars.Token[dict[str, object]] | None = None

    def __enter__(self) -> None:
        self._token = _bound.set({**_bound.get(), **self._ids})

    def __exit__(self, *_: object) -> None:
        if self._token is not None:
            _bound.reset(self._token)
            self._token = None


def current() -> dict[str, object]:
    """The ids bound in this context (a copy)."""
    return dict(_bound.get())


class CorrelationFilter(logging.Filter):
    """Copies the bound ids onto each record, where both formatters can see them."""

    def filter(self, record: logging.LogRecord) -> bool:
        for key, value in _bound.get().items():
            if not hasattr(record, key):
                setattr(record, key, value)
        return True


class TextFormatter(logging.Formatter):
    """Human format for terminals: the usual line, then `key=value` for each bound id."""

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        ids = " ".join(f"{k}={getattr(record, k)}" for k in CORRELATION_FIELDS if hasattr(record, k))
        return f"{line} [{ids}]" if ids else line


def json_formatter() -> logging.Formatter:
    return jsonlogger.JsonFormatter(
        "%(asctime)s %(levelname)s %(name)s %(message)s",
        rename_fields={"asctime": "time", "levelname": "level", "name": "logger"},
        datefmt="%Y-%m-%dT%H:%M:%S%z",
    )


def configure(*, level: str = "WARNING", fmt: LogFormat = "text") -> None:
    """Route the root logger to stderr in the chosen format. Idempotent: replaces our handler."""
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(CorrelationFilter())
    handler.setFormatter(
        json_formatter() if fmt == "json" else TextFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    )
    handler.set_name("lading")
    root = logging.getLogger()
    for existing in list(root.handlers):
        if existing.get_name() == "lading":
            root.removeHandler(existing)
    root.addHandler(handler)
    root.setLevel(level.upper())
