"""A worker's JSON logs: one line per attempt with the job's correlation ids, never the document."""

import io
import json
import logging
from collections.abc import Iterator

import asyncpg
import pytest
from lading_worker import running

from lading import accepting, logs
from lading.settings import ClaimerSettings, LeaseSettings, ReaperSettings, WorkerProcessSettings
from tests.support import factories, waiting

SECRET_TEXT = "Invoice INV-77 total 1234.56 EUR IBAN DE89370400440532013000"


@pytest.fixture
def json_logs() -> Iterator[io.StringIO]:
    stream = io.StringIO()
    logs.configure(level="INFO", fmt="json")
    handler = next(h for h in logging.getLogger().handlers if h.get_name() == "lading")
    assert isinstance(handler, logging.StreamHandler)
    handler.setStream(stream)
    yield stream
    logging.getLogger().removeHandler(handler)
    logging.getLogger().setLevel(logging.WARNING)


async def test_attempt_lines_carry_ids_and_never_the_document(
        db: asyncpg.Connection, dbpool: asyncpg.Pool, json_logs: io.StringIO
) -> None:
    await factories.seed(db)
    request = factories.batch_request(count=3, text_prefix=SECRET_TEXT)
    accepted = await accepting.accept_batch(db, request)
    settings = WorkerProcessSettings(
        pool=factories.POOL,
        claimer=ClaimerSettings(concurrency=4, batch_size=4, poll_interval_s=0.05),
        lease=LeaseSettings(),
        reaper=ReaperSettings(),
    )

    async def settled() -> bool:
        return await db.fetchval("SELECT count(*) FROM extraction_jobs WHERE finished_at IS NOT NULL "
                                 "OR state = 'REVIEW_REQUIRED'") == 3

    async with waiting.running(running.Worker(dbpool, settings=settings).run):
        await waiting.until(settled, timeout_s=30)

    lines = [json.loads(line) for line in json_logs.getvalue().splitlines()]
    attempts = [line for line in lines if line["message"].startswith("Attempt finished")]
    assert sorted(line["job_id"] for line in attempts) == sorted(accepted.job_ids)
    for line in attempts:
        assert line["tenant"] == factories.TENANT and line["pool"] == factories.POOL
        assert line["fence"] == 1 and line["attempt"] == 1 and line["batch_id"] == accepted.batch_id
    assert "INV-77" not in json_logs.getvalue() and "DE89370400440532013000" not in json_logs.getvalue()
