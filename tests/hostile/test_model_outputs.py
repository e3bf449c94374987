"""
Hostile model answers through the real worker: the openai-compatible provider over real HTTP
against the model stub, the real claimer, executor and committer, real PostgreSQL.

One worker runs for the whole test. Each hypothesis example accepts a batch mixing good
documents (answered with their valid, evidence-quoting extraction) and hostile ones (answered
with a generated answer), holds every first answer until the whole batch has asked, so the good
and the hostile are finished in the same claim and commit group, and waits for the batch to
settle. Invariants: every job ends SUCCEEDED, REVIEW_REQUIRED or FAILED_TERMINAL; every good
document SUCCEEDED; nothing stays RUNNING; the worker is still running and claims the next
batch (the last example's successor is a clean batch after the examples).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import json
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import hypothesis
import pytest
from aiohttp import web
from hypothesis import strategies as st
from lading_worker import running

from lading import accepting, storable
from lading.db import registry
from lading.ids import PoolName
from lading.settings import AttemptSettings, ClaimerSettings, LeaseSettings, ReaperSettings, WorkerProcessSettings
from lading_demo import builtin, generator
from tests.hostile import strategies, tally
from tests.support import factories, model_stub, waiting

SETTLED = ("SUCCEEDED", "REVIEW_REQUIRED", "FAILED_TERMINAL")
SAMPLES = [s for s in generator.generate(120, seed=53) if s.expected_state == "SUCCEEDED"]
GATE_TIMEOUT_S = 20.0
"""A first request waits this long at most for the rest of its batch (then answers anyway)."""
SETTLE_TIMEOUT_S = 60.0
LIMITS = {"requestsPerMinute": 1_000_000, "tokensPerMinute": 1_000_000_000, "maxConcurrency": 100}
"""The stub is no hosted API: the default budgets (200,000 reserved tokens a minute) would pace
the examples by the minute, and what is tested here is the answers, not the limiter."""


def _settings() -> WorkerProcessSettings:
    return WorkerProcessSettings(
        pool=factories.POOL,
        lease=LeaseSettings(ttl_s=10, heartbeat_interval_s=0.2),
        claimer=ClaimerSettings(concurrency=20, batch_size=20, poll_interval_s=0.05),
        reaper=ReaperSettings(interval_s=0.5),
        attempt=AttemptSettings(backoff_base_s=0.01, backoff_cap_s=0.02, timeout_s=30),
        shutdown_grace_s=5.0,
    )


@dataclasses.dataclass
class Round:
    """One example's batch as the stub sees it: the answer for each document text, and the gate."""

    answers: dict[str, strategies.ModelAnswer | None]
    """None: a good document, answered with its valid extraction."""
    gate: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    asked: set[str] = dataclasses.field(default_factory=set)


@dataclasses.dataclass
class Pipeline:
    db: asyncpg.Connection
    worker: asyncio.Task[None]
    round: Round | None = None
    numbers: itertools.count[int] = dataclasses.field(default_factory=itertools.count)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:  # printed with a failing example: keep it short
        printer.text("<Pipeline>")

    def document(self) -> str:
        """A fresh good document text (unique, so the stub can tell documents apart by text)."""
        n = next(self.numbers)
        return f"{SAMPLES[n % len(SAMPLES)].text}\nReference HX-{n:06d}"

    async def run_batch(self, *, good: int, hostile: list[strategies.ModelAnswer]) -> dict[str, str]:
        """Accept a batch of `good` + `hostile` documents, wait until it settled; states by key."""
        answers: dict[str, strategies.ModelAnswer | None] = {self.document(): None for _ in range(good)}
        answers.update({self.document(): answer for answer in hostile})
        self.round = Round(answers)
        name = f"round-{next(self.numbers)}"
        keys = {text: f"{'good' if answer is None else 'hostile'}-{i}" for i, (text, answer) in
                enumerate(answers.items())}  # fmt: skip
        request = factories.batch_request(name=name, count=0)
        documents = [accepting.DocumentInput(key=keys[text], text=text) for text in answers]
        await accepting.accept_batch(self.db, dataclasses.replace(request, documents=documents))
        tally.tried("model-output", len(hostile))

        async def settled() -> bool:
            tally.check("worker", not self.worker.done(), "the worker stopped")
            return await self.db.fetchval(
                "SELECT count(*) FILTER (WHERE j.state <> ALL($2::text[])) = 0 FROM extraction_jobs j"
                " JOIN batches b ON b.id = j.batch_id WHERE b.name = $1", name, list(SETTLED),
            )  # fmt: skip

        try:
            await waiting.until(settled, timeout_s=SETTLE_TIMEOUT_S)
        except TimeoutError:
            tally.wedged("worker")
            raise
        rows = await self.db.fetch(
            "SELECT j.document_key, j.state FROM extraction_jobs j JOIN batches b ON b.id = j.batch_id"
            " WHERE b.name = $1", name,
        )  # fmt: skip
        return {r["document_key"]: r["state"] for r in rows}


def _valid(text: str) -> dict[str, Any]:
    result = builtin.extract_text(text).result
    assert result is not None, "the samples are documents the built-in extractor reads"
    return result


@pytest.fixture
async def pipeline(db: asyncpg.Connection, dbpool: asyncpg.Pool) -> AsyncIterator[Pipeline]:
    """The model stub and one real worker on an openai-compatible pool, for all of a test's examples."""
    holder: list[Pipeline] = []

    async def reply(stub: model_stub.ModelStub, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        user = next(m["content"] for m in body["messages"] if m["role"] == "user")
        match = model_stub.DOCUMENT.search(user)
        assert match is not None
        text = match[2]
        current = holder[0].round
        if current is None or text not in current.answers:
            return web.json_response(model_stub.completion_body(json.dumps(_valid(text))))
        current.asked.add(text)
        if current.asked >= current.answers.keys():
            current.gate.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(current.gate.wait(), GATE_TIMEOUT_S)
        answer = current.answers[text]
        if answer is None:
            return web.json_response(model_stub.completion_body(json.dumps(_valid(text))))
        return web.Response(body=answer.http_body(_valid(text)), content_type="application/json")

    async with model_stub.running(reply) as stub:
        await factories.seed(db)
        await registry.upsert_pool(
            db, name=PoolName(factories.POOL), provider="openai-compatible", model="qwen",
            spec={"endpoint": {"url": stub.url}, "limits": LIMITS},
        )  # fmt: skip
        stop = asyncio.Event()
        worker = asyncio.create_task(running.Worker(dbpool, settings=_settings()).run(stop), name="worker")
        holder.append(Pipeline(db=db, worker=worker))
        try:
            yield holder[0]
            # The worker still claims and finishes clean work after every example.
            states = await holder[0].run_batch(good=3, hostile=[])
            assert set(states.values()) == {"SUCCEEDED"}, states
            running_jobs = await db.fetchval("SELECT count(*) FROM extraction_jobs WHERE state = 'RUNNING'")
            tally.check("worker", running_jobs == 0, f"{running_jobs} jobs left RUNNING")
            rows = await db.fetch("SELECT result FROM results")
            assert all(storable.unstorable_reason(r["result"]) is None for r in rows)
        finally:
            stop.set()
            await asyncio.wait_for(worker, 30)


def _check(states: dict[str, str], hostile: list[strategies.ModelAnswer]) -> None:
    assert len(states) == sum(1 for k in states if k.startswith("good-")) + len(hostile)
    for key, state in states.items():
        if key.startswith("hostile-"):
            tally.ended("model-output", state)
    stuck = {k: s for k, s in states.items() if s not in SETTLED}
    tally.check("worker", not stuck, f"jobs not settled: {stuck}")
    assert {k: s for k, s in states.items() if k.startswith("good-")} == {
        k: "SUCCEEDED" for k in states if k.startswith("good-")
    }, "a good document of the same claim and commit group was affected"


@hypothesis.settings(
    max_examples=40, deadline=None, suppress_health_check=[hypothesis.HealthCheck.function_scoped_fixture],
)  # fmt: skip
@hypothesis.given(
    good=st.integers(1, 3),
    hostile=st.lists(strategies.model_answers(), min_size=1, max_size=4),
)
@hypothesis.example(good=2, hostile=list(strategies.HUGE_ANSWERS))
async def test_hostile_answers_settle_and_the_rest_of_their_group_succeeds(
        pipeline: Pipeline, good: int, hostile: list[strategies.ModelAnswer],
) -> None:
    states = await pipeline.run_batch(good=good, hostile=hostile)
    _check(states, hostile)
