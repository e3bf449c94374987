"""`tracing.span(log_ids=...)` binds the caller's correlation ids with the batch's trace id, for the
body only, whether or not spans are recorded."""

from lading import logs, tracing


def test_the_ids_and_the_trace_id_are_bound_for_the_body_only() -> None:
    with tracing.span("lading.attempt", batch_id=7, attributes={"job_id": 3}, log_ids={"job_id": 3, "fence": 2}):
        bound = logs.current()
        assert bound["job_id"] == 3 and bound["fence"] == 2
        assert bound["trace_id"] == tracing.trace_id_hex(7)
    assert "job_id" not in logs.current() and "trace_id" not in logs.current()


def test_without_log_ids_only_the_trace_id_is_bound() -> None:
    with tracing.span("lading.attempt", batch_id=7):
        assert logs.current() == {"trace_id": tracing.trace_id_hex(7)}
