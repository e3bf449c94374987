"""A worker's JSON logs: one line per attempt with the job's correlation ids (at debug level when it
ended well, with a count per commit group at info), never the document."""

import dataclasses
import io
import json
import logging
from collections.abc import Iterator

import asyncpg
import pytest
from lading_worker import running

from lading import accepting, logs
from lading.settings import ClaimerSettings, LeaseSettings, ReaperSettings, WorkerProcessSettings
from lading_demo import generator
from tests.support import factories, waiting

SECRET_TEXT = "Invoice INV-77 total 1234.56 EUR IBAN DE89370400440532013000"


@pytest.fixture(params=["INFO", "DEBUG"])
def json_logs(request: pytest.FixtureRequest) -> Iterator[io.StringIO]:
    stream = io.StringIO()
    logs.configure(level=request.param, fmt="json")
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
    request = factories.batch_request(count=3, text_prefix=SECRET_TEXT)  # unreadable: FAILED_TERMINAL
    clean = [s.text for s in generator.generate(20, seed=16) if s.expected_state == "SUCCEEDED"][:2]
    request = dataclasses.replace(request, documents=[
        *request.documents, *(accepting.DocumentInput(key=f"clean-{i}", text=t) for i, t in enumerate(clean))
    ])  # fmt: skip
    accepted = await accepting.accept_batch(db, request)
    settings = WorkerProcessSettings(
        pool=factories.POOL,
        claimer=ClaimerSettings(concurrency=4, batch_size=4, poll_interval_s=0.05),
        lease=LeaseSettings(),
        reaper=ReaperSettings(),
    )

    async def settled() -> bool:
        return await db.fetchval("SELECT count(*) FROM extraction_jobs WHERE finished_at IS NOT NULL "
                                 "OR state = 'REVIEW_REQUIRED'") == 5

    async with waiting.running(running.Worker(dbpool, settings=settings).run):
        await waiting.until(settled, timeout_s=30)

    lines = [json.loads(line) for line in json_logs.getvalue().splitlines()]
    attempts = [line for line in lines if line["message"].startswith("Attempt finished")]
    ended_well = {r["id"] for r in await db.fetch(
        "SELECT id FROM extraction_jobs WHERE state IN ('SUCCEEDED', 'REVIEW_REQUIRED')"
    )}  # fmt: skip
    assert 0 < len(ended_well) < len(accepted.job_ids)  # both kinds of line
    for line in attempts:  # debug level exactly when the attempt ended well
        assert line["level"] == ("DEBUG" if line["job_id"] in ended_well else "INFO")
    logged = sorted(line["job_id"] for line in attempts)
    if logging.getLogger().isEnabledFor(logging.DEBUG):
        assert logged == sorted(accepted.job_ids)
    else:
        assert logged == sorted(set(accepted.job_ids) - ended_well)
    for line in attempts:
        assert line["tenant"] == factories.TENANT and line["pool"] == factories.POOL
        assert line["fence"] == 1 and line["attempt"] == 1 and line["batch_id"] == accepted.batch_id
    committed = [line for line in lines if line["message"].startswith("Committed ")]
    assert {line["level"] for line in committed} == {"INFO"}
    assert sum(int(line["message"].split()[1]) for line in committed) == 5
    assert "INV-77" not in json_logs.getvalue() and "DE89370400440532013000" not in json_logs.getvalue()
