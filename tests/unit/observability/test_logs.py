import asyncio
import io
import json
import logging
from collections.abc import Iterator

import pytest

from lading import logs


@pytest.fixture
def captured() -> Iterator[io.StringIO]:
    stream = io.StringIO()
    logs.configure(level="INFO", fmt="json")
    handler = next(h for h in logging.getLogger().handlers if h.get_name() == "lading")
    assert isinstance(handler, logging.StreamHandler)
    handler.setStream(stream)
    yield stream
    logging.getLogger().removeHandler(handler)


def lines(stream: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_json_lines_carry_bound_ids(captured: io.StringIO) -> None:
    log = logging.getLogger("lading.test")
    with logs.bound(job_id=7, tenant="acme", fence=3):
        log.info("attempt finished")
        with logs.bound(attempt=2):
            log.warning("nested")
    log.info("outside")

    first, nested, outside = lines(captured)
    assert first["message"] == "attempt finished"
    assert (first["job_id"], first["tenant"], first["fence"], first["level"]) == (7, "acme", 3, "INFO")
    assert nested["attempt"] == 2 and nested["job_id"] == 7
    assert "job_id" not in outside and outside["logger"] == "lading.test"


async def test_ids_follow_their_own_task(captured: io.StringIO) -> None:
    log = logging.getLogger("lading.test")

    async def attempt(job_id: int, ready: asyncio.Event, go: asyncio.Event) -> None:
        with logs.bound(job_id=job_id):
            ready.set()
            await go.wait()
            log.info("done")

    go = asyncio.Event()
    ready = [asyncio.Event(), asyncio.Event()]
    tasks = [asyncio.create_task(attempt(i, ready[i], go)) for i in range(2)]
    await asyncio.gather(*(r.wait() for r in ready))  # both contexts are open at once
    go.set()
    await asyncio.gather(*tasks)
    assert sorted(line["job_id"] for line in lines(captured)) == [0, 1]


def test_only_correlation_fields_can_be_bound() -> None:
    with pytest.raises(ValueError, match="document_text"), logs.bound(document_text="secret invoice"):
        pass


def test_text_format_appends_ids() -> None:
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "hello", None, None)
    with logs.bound(delivery_id="d-1"):
        logs.CorrelationFilter().filter(record)
    assert logs.TextFormatter("%(message)s").format(record) == "hello [delivery_id=d-1]"
