"""One trace per batch: admission and every attempt are spans of the same trace, each attempt
its own span with the job's ids, and the logs carry the trace id."""

from collections.abc import Iterator

import asyncpg
import pytest
from lading_worker import running
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from lading import accepting, tracing
from lading.settings import ClaimerSettings, LeaseSettings, ReaperSettings, WorkerProcessSettings
from tests.support import factories, waiting

_EXPORTER = InMemorySpanExporter()


@pytest.fixture(scope="module", autouse=True)
def provider() -> Iterator[None]:
    # The global provider can be set once per process; every test here reads the shared exporter,
    # which stops keeping spans when this module is done (later tests run with tracing on).
    current = trace.get_tracer_provider()
    if not isinstance(current, TracerProvider):
        sdk = TracerProvider()
        sdk.add_span_processor(SimpleSpanProcessor(_EXPORTER))
        trace.set_tracer_provider(sdk)
    yield
    _EXPORTER.shutdown()


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    _EXPORTER.clear()
    yield _EXPORTER
    _EXPORTER.clear()


def test_the_trace_id_of_a_batch_is_stable_and_distinct() -> None:
    assert tracing.batch_trace_id(7) == tracing.batch_trace_id(7)
    assert tracing.batch_trace_id(7) != tracing.batch_trace_id(8)
    assert len(tracing.trace_id_hex(7)) == 32


async def test_attempts_of_a_batch_share_its_trace(
        db: asyncpg.Connection, dbpool: asyncpg.Pool, spans: InMemorySpanExporter
) -> None:
    await factories.seed(db)
    accepted = await accepting.accept_batch(db, factories.batch_request(count=3))
    settings = WorkerProcessSettings(
        pool=factories.POOL,
        claimer=ClaimerSettings(concurrency=4, batch_size=4, poll_interval_s=0.05),
        lease=LeaseSettings(),
        reaper=ReaperSettings(),
    )

    async def settled() -> bool:
        return await db.fetchval("SELECT count(*) FROM job_attempts WHERE finished_at IS NOT NULL") == 3

    async with waiting.running(running.Worker(dbpool, settings=settings).run):
        await waiting.until(settled, timeout_s=30)

    attempts = [s for s in spans.get_finished_spans() if s.name == "lading.attempt"]
    assert len(attempts) == 3
    assert {s.context.trace_id for s in attempts} == {tracing.batch_trace_id(accepted.batch_id)}
    assert len({s.context.span_id for s in attempts}) == 3  # each attempt is its own span
    assert sorted(s.attributes["lading.job_id"] for s in attempts) == sorted(accepted.job_ids)
    assert all(s.attributes["lading.fence"] == 1 for s in attempts)


def test_work_known_only_at_its_end_is_recorded_in_the_batch_trace(spans: InMemorySpanExporter) -> None:
    started = tracing.now_ns()
    tracing.record("lading.admission", batch_id=42, started_ns=started, attributes={"jobs": 10, "tenant": None})
    (admission,) = spans.get_finished_spans()
    assert admission.context.trace_id == tracing.batch_trace_id(42)
    assert admission.start_time == started and admission.end_time >= started
    assert dict(admission.attributes) == {"lading.batch_id": 42, "lading.jobs": 10}  # None is left out
