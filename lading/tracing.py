"""
OpenTelemetry tracing: optional, and off unless the process is given an SDK.

Lading only uses the OpenTelemetry *API* (`pip install 'lading[tracing]'`). Without the API
package, or with the API but no SDK configured, every function here does nothing and costs
nothing. To export traces, run a process under an SDK the standard way, for example
`opentelemetry-instrument --traces_exporter otlp lading worker ...` with `opentelemetry-distro`
and an exporter installed, or configure a TracerProvider before calling Lading in-process.

One trace per batch, without carrying a context through rows and messages: every span of a
batch (admission, each attempt of each job, each delivery attempt, each event publish and
ingress) is a child of a virtual root span whose trace id and span id are derived from the
batch id. Any process that knows the batch id (it is in every job row, delivery row and event
payload) joins the same trace; each attempt is its own span, carrying the job id, fence and
attempt number. The trace id is also bound into the JSON logs (`trace_id`), so log lines and
spans of one batch find each other.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import time
from collections.abc import Iterator, Mapping
from typing import Any

from lading import logs

try:  # the optional dependency
    from opentelemetry import trace as otel_trace
except ImportError:  # pragma: no cover - exercised only where the extra is not installed
    otel_trace = None  # type: ignore[assignment]

TRACER_NAME = "lading"


@functools.lru_cache(maxsize=1024)  # every attempt asks; a worker works on few batches at a time
def batch_trace_id(batch_id: int) -> int:
    """The 128-bit trace id of a batch: stable across processes, never zero."""
    return int.from_bytes(hashlib.sha256(f"lading-batch:{batch_id}".encode()).digest()[:16], "big") or 1


@functools.lru_cache(maxsize=1024)
def _batch_root_span_id(batch_id: int) -> int:
    return int.from_bytes(hashlib.sha256(f"lading-batch-root:{batch_id}".encode()).digest()[:8], "big") or 1


@functools.lru_cache(maxsize=1024)
def trace_id_hex(batch_id: int) -> str:
    return f"{batch_trace_id(batch_id):032x}"


def _parent(batch_id: int) -> Any:
    assert otel_trace is not None
    return otel_trace.set_span_in_context(otel_trace.NonRecordingSpan(otel_trace.SpanContext(
        trace_id=batch_trace_id(batch_id),
        span_id=_batch_root_span_id(batch_id),
        is_remote=True,
        trace_flags=otel_trace.TraceFlags(otel_trace.TraceFlags.SAMPLED),
    )))


def _attributes(batch_id: int, attributes: Mapping[str, Any] | None) -> dict[str, Any]:
    extra = {f"lading.{k}": v for k, v in (attributes or {}).items() if v is not None}
    return {"lading.batch_id": batch_id, **extra}


_TRACER: Any = None


def _tracer() -> Any:
    """Lading's tracer, asked for once: the API's proxy tracer forwards to a TracerProvider set later,
    and asking again reads the environment each time (a measurable cost once per attempt)."""
    global _TRACER
    if _TRACER is None:
        assert otel_trace is not None
        _TRACER = otel_trace.get_tracer(TRACER_NAME)
    return _TRACER


def _recording() -> bool:
    """Whether spans go anywhere: a TracerProvider (an SDK) has been set. Until then the API hands
    out no-op spans, but building each span's parent context and attributes still costs a few
    microseconds per attempt; skipping them is most of the cost of tracing when it is off."""
    if otel_trace is None:
        return False
    if getattr(otel_trace, "_TRACER_PROVIDER", _ABSENT) is None and not _provider_in_environment():
        # Nothing set in code nor named in the environment: the API would hand out its proxy. (Its
        # get_tracer_provider() looks the variable up in os.environ on every call, about a tenth of
        # a worker's CPU per attempt.)
        return False
    unset = (otel_trace.ProxyTracerProvider, otel_trace.NoOpTracerProvider)
    return not isinstance(otel_trace.get_tracer_provider(), unset)


_ABSENT = object()
_PROVIDER_VARIABLE = "OTEL_PYTHON_TRACER_PROVIDER"
_provider_variable_set: bool | None = None


def _provider_in_environment() -> bool:
    """Whether $OTEL_PYTHON_TRACER_PROVIDER names a provider, read once per process (it is set
    before the process starts: `opentelemetry-instrument` and the chart put it there)."""
    global _provider_variable_set
    if _provider_variable_set is None:
        _provider_variable_set = _PROVIDER_VARIABLE in os.environ
    return _provider_variable_set


def now_ns() -> int:
    return time.time_ns()


def record(name: str, *, batch_id: int, started_ns: int, attributes: Mapping[str, Any] | None = None) -> None:
    """A span that already happened (from `started_ns` to now): for work whose batch id is only
    known at its end, such as an admission, which allocates the id."""
    if not _recording():
        return
    tracer = _tracer()
    done = tracer.start_span(
        name, context=_parent(batch_id), attributes=_attributes(batch_id, attributes), start_time=started_ns
    )
    done.end()


def span(
        name: str,
        *,
        batch_id: int,
        attributes: Mapping[str, Any] | None = None,
        log_ids: Mapping[str, object] | None = None,
) -> contextlib.AbstractContextManager[None]:
    """A span `name` in the batch's trace (and its trace id bound into the logs) for the body. While
    spans go nowhere (`_recording`), only the trace id is bound: no generator, no span. `log_ids`:
    more correlation ids (`logs.bound`) bound with the trace id, in the same binding (one per
    attempt, thousands a second: a second binding costs a few µs)."""
    if not _recording():
        return logs.bound(trace_id=trace_id_hex(batch_id), **(log_ids or {}))
    return _recorded_span(name, batch_id=batch_id, attributes=attributes, log_ids=log_ids)


@contextlib.contextmanager
def _recorded_span(
        name: str, *, batch_id: int, attributes: Mapping[str, Any] | None, log_ids: Mapping[str, object] | None
) -> Iterator[None]:
    with logs.bound(trace_id=trace_id_hex(batch_id), **(log_ids or {})):
        tracer = _tracer()
        attrs = _attributes(batch_id, attributes)
        with tracer.start_as_current_span(name, context=_parent(batch_id), attributes=attrs):
            yield
