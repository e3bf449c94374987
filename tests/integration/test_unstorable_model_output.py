"""
The real worker loop when a model answers with what PostgreSQL cannot store: NUL, lone
surrogates, numbers past 64 bits or not finite, absurd token counts. Each such answer is settled
on its own (invalid output -> review, or success without the absurd count); the other documents
of the same claim and commit group succeed; the worker keeps claiming; nothing stays RUNNING.

Two providers: one in-process (a provider returning Outcomes directly, as any Provider may) and
the openai-compatible one over real HTTP against the model stub (the JSON as a server sends it).
"""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Callable
from typing import Any

import asyncpg
from aiohttp import web
from lading_worker import running

from lading import accepting, storable
from lading.db import registry
from lading.ids import PoolName
from lading.providers import base
from lading.settings import AttemptSettings, ClaimerSettings, LeaseSettings, ReaperSettings, WorkerProcessSettings
from lading_demo import builtin, generator
from tests.support import factories, model_stub, providers, waiting

SAMPLES = [s for s in generator.generate(80, seed=29) if s.expected_state == "SUCCEEDED"]


def _settings() -> WorkerProcessSettings:
    return WorkerProcessSettings(
        pool=factories.POOL,
        lease=LeaseSettings(ttl_s=10, heartbeat_interval_s=0.1),
        claimer=ClaimerSettings(concurrency=20, batch_size=20, poll_interval_s=0.05),
        reaper=ReaperSettings(interval_s=0.1),
        attempt=AttemptSettings(backoff_base_s=0.01, backoff_cap_s=0.02, timeout_s=10),
        shutdown_grace_s=5.0,
    )


async def _accept(db: asyncpg.Connection, *, name: str, samples: list[generator.Sample]) -> None:
    request = factories.batch_request(name=name, count=0)
    documents = [accepting.DocumentInput(key=f"{name}-{s.key}", text=s.text) for s in samples]
    await accepting.accept_batch(db, accepting.BatchRequest(**{**request.__dict__, "documents": documents}))


def _extracted(text: str) -> dict[str, Any]:
    result = builtin.extract_text(text).result
    assert result is not None
    return result


async def _states(db: asyncpg.Connection) -> dict[str, tuple[str, str | None]]:
    rows = await db.fetch("SELECT document_key, state, last_error_class FROM extraction_jobs")
    return {r["document_key"]: (r["state"], r["last_error_class"]) for r in rows}


async def _settled(db: asyncpg.Connection, count: int) -> bool:
    return await db.fetchval(
        "SELECT count(*) FROM extraction_jobs WHERE state IN ('SUCCEEDED', 'REVIEW_REQUIRED', 'FAILED_TERMINAL')"
    ) == count


async def _raw_output(db: asyncpg.Connection, key: str) -> str:
    raw: str = await db.fetchval(
        "SELECT r.result->>'raw_output' FROM results r JOIN extraction_jobs j ON j.id = r.job_id"
        " WHERE j.document_key = $1",
        key,
    )
    return raw


async def _attempts(db: asyncpg.Connection, key: str) -> list[asyncpg.Record]:
    return await db.fetch(
        "SELECT a.outcome, a.error_class, a.error, a.tokens_in, a.tokens_out FROM job_attempts a"
        " JOIN extraction_jobs j ON j.id = a.job_id WHERE j.document_key = $1 ORDER BY a.fence",
        key,
    )


async def _run_then_more_work(
        db: asyncpg.Connection, worker: running.Worker, *, first: int, release: Callable[[], Any]
) -> None:
    """Run the worker until the first batch settles, then give it a clean batch: it must settle too."""
    async with waiting.running(worker.run):
        await release()
        await waiting.until(lambda: _settled(db, first), timeout_s=60)
        await _accept(db, name="later", samples=SAMPLES[20:23])
        await waiting.until(lambda: _settled(db, first + 3), timeout_s=60)
    assert await db.fetchval("SELECT count(*) FROM extraction_jobs WHERE state = 'RUNNING'") == 0


async def test_unstorable_outcomes_from_a_provider_settle_and_the_rest_of_their_group_succeeds(
        db: asyncpg.Connection, dbpool: asyncpg.Pool
) -> None:
    samples = SAMPLES[:12]
    keys = [f"first-{s.key}" for s in samples]
    poison: dict[str, Callable[[str], base.Outcome]] = {
        keys[1]: lambda text: base.Outcome.ok(_with(_extracted(text), ("supplier", "name"), "Acme\x00 GmbH")),
        keys[4]: lambda text: base.Outcome.ok({**_extracted(text), "evidence": {"total\ud800": "1"}}),
        keys[6]: lambda text: base.Outcome.ok(_extracted(text), tokens_in=2**40, tokens_out=10),
        keys[8]: lambda text: base.Outcome.ok(_extracted(text), tokens_in=10, tokens_out=2**63),
        keys[10]: lambda text: base.Outcome.failed(
            base.OutcomeClass.INVALID_OUTPUT, error_class="MALFORMED_OUTPUT", error="not JSON",
            raw_output='{"total": "1\x00\ud83d"',
        ),
    }  # fmt: skip

    def reply(document: base.Document) -> base.Outcome:
        answer = poison.get(document.key)
        return answer(document.text) if answer is not None else base.Outcome.ok(_extracted(document.text))

    await factories.seed(db)
    await _accept(db, name="first", samples=samples)
    gate = asyncio.Event()
    provider = providers.ScriptedProvider(reply, gate=gate)

    async def release() -> None:
        # Every document of the batch is in one claim and answers at once: one commit group.
        await waiting.until(_calls(provider, 12), timeout_s=30)
        gate.set()

    await _run_then_more_work(db, running.Worker(dbpool, settings=_settings(), provider=provider), first=12,
                              release=release)  # fmt: skip

    states = await _states(db)
    review = {keys[1], keys[4], keys[10]}
    assert {k: v for k, v in states.items() if k in review} == {k: ("REVIEW_REQUIRED", "REPEATED_INVALID_OUTPUT")
                                                                for k in review}  # fmt: skip
    assert {k: v for k, v in states.items() if k not in review} == {k: ("SUCCEEDED", None)
                                                                    for k in states if k not in review}  # fmt: skip
    first = await _attempts(db, keys[1])
    assert [(a["outcome"], a["error_class"]) for a in first] == [
        ("invalid-output", base.UNSTORABLE_OUTPUT), ("invalid-output", "REPEATED_INVALID_OUTPUT")
    ]
    assert "result.supplier.name" in first[0]["error"] and "Acme" not in first[0]["error"]
    assert "Acme\\u0000 GmbH" in await _raw_output(db, keys[1])  # kept for the reviewer, escaped
    assert "total\\ud800" in await _raw_output(db, keys[4])
    assert await _raw_output(db, keys[10]) == '{"total": "1\\u0000\\ud83d"'
    assert [(a["tokens_in"], a["tokens_out"]) for a in await _attempts(db, keys[6])] == [(None, 10)]
    assert [(a["tokens_in"], a["tokens_out"]) for a in await _attempts(db, keys[8])] == [(10, None)]
    assert len(provider.calls) == 12 + 3 + 3  # the three invalid outputs were tried twice, as any would be


async def test_unstorable_answers_over_http_settle_and_the_rest_of_their_group_succeeds(
        db: asyncpg.Connection, dbpool: asyncpg.Pool
) -> None:
    samples = SAMPLES[:10]
    by_text = {s.text: f"first-{s.key}" for s in samples}
    keys = [f"first-{s.key}" for s in samples]
    answers: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
        # json.dumps writes NUL and a lone surrogate as \u escapes, as a server would.
        keys[0]: lambda r: model_stub.completion_body(json.dumps(_with(r, ("buyer", "name"), "B\x00"))),
        keys[2]: lambda r: model_stub.completion_body(json.dumps(_with(r, ("lines", 0, "description"), "x\udc00"))),
        keys[3]: lambda r: model_stub.completion_body(json.dumps(r), prompt_tokens=2**40),
        keys[5]: lambda r: model_stub.completion_body(json.dumps(r), completion_tokens=2**63),
        keys[7]: lambda r: model_stub.completion_body(json.dumps({**r, "total": 2**70})),
        keys[8]: lambda r: model_stub.completion_body(json.dumps(r)[:-1] + ', "x": 1e400}'),
        keys[9]: lambda r: model_stub.completion_body(json.dumps(r) + "\x00"),
    }
    gate = asyncio.Event()
    seen: list[str] = []

    async def reply(stub: model_stub.ModelStub, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        user = next(m["content"] for m in body["messages"] if m["role"] == "user")
        match = model_stub.DOCUMENT.search(user)
        assert match is not None
        seen.append(key := by_text.get(match[2], ""))
        await gate.wait()
        result = _extracted(match[2])
        answer = answers.get(key)
        return web.json_response(answer(result) if answer is not None else model_stub.completion_body(
            json.dumps(result)
        ))

    async with model_stub.running(reply) as stub:
        await factories.seed(db)
        await registry.upsert_pool(
            db, name=PoolName(factories.POOL), provider="openai-compatible", model="qwen",
            spec={"endpoint": {"url": stub.url}},
        )  # fmt: skip
        await _accept(db, name="first", samples=samples)

        async def release() -> None:
            async def all_asked() -> bool:
                return len(seen) >= 10

            await waiting.until(all_asked, timeout_s=30)
            gate.set()

        await _run_then_more_work(db, running.Worker(dbpool, settings=_settings()), first=10, release=release)

    states = await _states(db)
    review = {keys[0], keys[2], keys[7], keys[8], keys[9]}
    assert {k: v for k, v in states.items() if k in review} == {k: ("REVIEW_REQUIRED", "REPEATED_INVALID_OUTPUT")
                                                                for k in review}  # fmt: skip
    assert {k: v for k, v in states.items() if k not in review} == {k: ("SUCCEEDED", None)
                                                                    for k in states if k not in review}  # fmt: skip
    for key, error_class, place in [
        (keys[0], base.UNSTORABLE_OUTPUT, "answer.buyer.name"),
        (keys[2], base.UNSTORABLE_OUTPUT, "answer.lines[0].description"),
        (keys[7], base.UNSTORABLE_OUTPUT, "answer.total"),
        (keys[8], base.UNSTORABLE_OUTPUT, "answer.x"),
        (keys[9], "MALFORMED_OUTPUT", ""),
    ]:
        attempts = await _attempts(db, key)
        assert [(a["outcome"], a["error_class"]) for a in attempts] == [
            ("invalid-output", error_class), ("invalid-output", "REPEATED_INVALID_OUTPUT")
        ], key
        assert place in attempts[0]["error"]
        raw = await _raw_output(db, key)
        assert storable.unstorable_reason(raw) is None
    assert '"B\\u0000"' in await _raw_output(db, keys[0])
    assert "x\\udc00" in await _raw_output(db, keys[2])
    assert (await _raw_output(db, keys[9])).endswith("}\\u0000")
    assert [(a["tokens_in"], a["tokens_out"]) for a in await _attempts(db, keys[3])] == [(None, 233)]
    assert [(a["tokens_in"], a["tokens_out"]) for a in await _attempts(db, keys[5])] == [(812, None)]


def _with(result: dict[str, Any], path: tuple[str | int, ...], value: object) -> dict[str, Any]:
    changed = copy.deepcopy(result)
    target: Any = changed
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = value
    return changed


def _calls(provider: providers.ScriptedProvider, count: int) -> Callable[[], Any]:
    async def enough() -> bool:
        return len(provider.calls) >= count

    return enough
