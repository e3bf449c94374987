"""What an attempt costs (lading.costing): exact decimals, the billing table, and the executor
recording the cost of its pool's prices on every Finish; what status says of budgets."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import decimal

import pydantic
import pytest
from lading_operator import budgets, conditions
from lading_worker import executing

from lading import costing, limiting
from lading.db import fairness
from lading.db import jobs as db_jobs
from lading.ids import BatchId, Fence, JobId, PoolName, TenantName
from lading.models import specs
from lading.providers import base
from lading.settings import AttemptSettings
from lading.webhooks import payload
from tests.support import providers

NOW = dt.datetime(2026, 3, 14, 12, 0, tzinfo=dt.UTC)
PRICING = costing.Pricing(
    currency="USD", input_per_million=decimal.Decimal("0.15"), output_per_million=decimal.Decimal("0.60")
)


def test_a_price_is_exact_to_the_last_digit_where_a_float_is_not() -> None:
    assert PRICING.cost(tokens_in=1234, tokens_out=567) == decimal.Decimal("0.0005253")
    assert PRICING.cost(tokens_in=0, tokens_out=0) == 0
    one = PRICING.cost(tokens_in=1, tokens_out=0)
    assert one is not None
    ten = [one] * 10  # 0.00000015 each
    assert sum(ten, decimal.Decimal(0)) == decimal.Decimal("0.0000015")
    assert sum(float(c) for c in ten) != 0.0000015
    huge = costing.Pricing("USD", decimal.Decimal("999999999999.999999999"), decimal.Decimal(0))
    # The largest price times the largest token count: 31 significant digits, past a default Decimal context.
    assert huge.cost(tokens_in=2**31 - 1, tokens_out=0) == decimal.Decimal("2147483646999999.999997852516353")


@pytest.mark.parametrize(
    ("answered", "lost", "tokens", "billed"),
    [
        (True, False, (120, 30), (120, 30)),     # an answer that reports usage
        (True, False, (None, None), (500, 256)),  # an answer without usage: its reservation
        (False, True, (None, None), (500, 256)),  # timed out after sending: possibly billed, at its reservation
        (False, True, (80, None), (80, 0)),       # whatever usage was reported wins
        (False, False, (None, None), (0, 0)),     # nothing sent / refused before work (429, 5xx, connect)
    ],
)
def test_what_an_attempt_is_billed_for(
        answered: bool, lost: bool, tokens: tuple[int | None, int | None], billed: tuple[int, int]
) -> None:
    got = costing.billed(answered=answered, sent_and_lost=lost, tokens_in=tokens[0], tokens_out=tokens[1],
                         reserved_in=500, reserved_out=256)  # fmt: skip
    assert (got.tokens_in, got.tokens_out) == billed


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (0.15, "must be a decimal string such as \"0.15\" (quoted, so it stays exact), not a float"),
        (1, "not a int"),
        ("1e-3", "is not a decimal amount"),
        ("-1", "is not a decimal amount"),
        ("0.1234567891", "at most 9 decimal places"),
        ("1 000", "is not a decimal amount"),
    ],
)
def test_a_bad_stored_amount_is_refused_by_name(value: object, message: str) -> None:
    with pytest.raises(costing.InvalidAmount, match=r"spec\.pricing\.inputPerMillionTokens") as refused:
        costing.Pricing.from_stored({"pricing": {"currency": "USD", "inputPerMillionTokens": value,
                                                 "outputPerMillionTokens": "1"}})  # fmt: skip
    assert message in str(refused.value)
    assert costing.Pricing.from_stored({}) is None


@pytest.mark.parametrize(
    ("pricing", "field"),
    [
        ({"currency": "USD", "inputPerMillionTokens": 0.15, "outputPerMillionTokens": "1"}, "inputPerMillionTokens"),
        ({"currency": "USD", "inputPerMillionTokens": "0.15", "outputPerMillionTokens": "1E2"},
         "outputPerMillionTokens"),
        ({"currency": "usd", "inputPerMillionTokens": "0.15", "outputPerMillionTokens": "1"}, "currency"),
        ({"currency": "USD", "inputPerMillionTokens": "0.15"}, "outputPerMillionTokens"),
    ],
)
def test_the_spec_refuses_bad_pricing_naming_the_field(pricing: dict[str, object], field: str) -> None:
    with pytest.raises(pydantic.ValidationError) as refused:
        specs.InferencePoolSpec.model_validate({"provider": "builtin", "pricing": pricing})
    assert [e["loc"] for e in refused.value.errors()] == [("pricing", field)]


def test_the_spec_refuses_a_budget_without_an_amount_or_with_a_day_above_the_month() -> None:
    for budget, words in (({"currency": "EUR"}, "needs monthly, daily or both"),
                          ({"currency": "EUR", "monthly": "10", "daily": "10.01"}, "must not exceed monthly")):
        with pytest.raises(pydantic.ValidationError, match=words):
            specs.TenantQuotaSpec.model_validate({"namespaces": ["a"], "budget": budget})
    ok = specs.TenantQuotaSpec.model_validate({"namespaces": ["a"], "budget": {"currency": "EUR", "monthly": "500.00"}})
    assert ok.budget is not None and ok.budget.monthly == "500.00"


def _job() -> db_jobs.ClaimedJob:
    return db_jobs.ClaimedJob(
        id=JobId(1), tenant="acme", batch_id=BatchId(1), document_key="k", attempt=1, max_attempts=5,
        fence=Fence(1), lease_until=NOW, deadline_at=NOW + dt.timedelta(hours=1), schema="invoice.v1",
        validation_policy="invoice-strict-v1", pool=PoolName("p"), text="text", claimed_at=NOW,
    )  # fmt: skip


@dataclasses.dataclass
class _Limiter:
    """Grants every permit; what the executor releases is recorded."""

    settings: limiting.LimiterSettings = dataclasses.field(default_factory=limiting.LimiterSettings)

    async def estimate(self, reservation: limiting.Reservation, *, schema: str) -> limiting.Reservation:
        return reservation

    def learn(self, reservation: limiting.Reservation, *, schema: str, tokens_in: int | None) -> None:
        return None

    async def acquire(self, *, job_id: int, fence: int, tokens: int) -> limiting.Permit:
        return limiting.Permit(id=1, tokens_reserved=tokens)

    def counted_tokens(self, permit: limiting.Permit, reservation: limiting.Reservation, **_: object) -> int:
        return reservation.total

    async def release(self, permit: limiting.Permit, *, tokens_used: int | None) -> None:
        return None


class _Hangs:
    max_output_tokens = 1000

    async def extract(self, document: base.Document, *, schema: str, policy: str) -> base.Outcome:
        await asyncio.sleep(60)
        raise AssertionError("timed out before")


async def test_a_timed_out_request_is_recorded_at_its_reservations_price() -> None:
    executor = executing.Executor(
        provider=_Hangs(), settings=AttemptSettings(timeout_s=0.01), pricing=PRICING,
        limiter=_Limiter(),  # type: ignore[arg-type]
    )  # fmt: skip
    finish = await executor.run(_job(), claimed_mono=0.0)
    reserved = limiting.estimate_tokens("text", max_output_tokens=1000)
    assert finish.outcome == base.OutcomeClass.TIMEOUT_AMBIGUOUS.value
    assert finish.usage.tokens_in is None  # nothing reported: the usage stays unknown
    assert finish.usage.cost == PRICING.cost(tokens_in=reserved - 1000, tokens_out=1000)
    assert finish.usage.currency == "USD"


async def test_an_answer_is_priced_by_its_usage_and_an_unpriced_pool_records_no_cost() -> None:
    answer = base.Outcome.ok({}, tokens_in=1000, tokens_out=100)
    priced = executing.Executor(provider=providers.ScriptedProvider(providers.always(answer)),
                                settings=AttemptSettings(timeout_s=5), pricing=PRICING)  # fmt: skip
    finish = await priced.run(_job(), claimed_mono=0.0)
    assert (finish.usage.cost, finish.usage.currency) == (decimal.Decimal("0.00021"), "USD")
    unpriced = executing.Executor(provider=providers.ScriptedProvider(providers.always(answer)),
                                  settings=AttemptSettings(timeout_s=5))  # fmt: skip
    finish = await unpriced.run(_job(), claimed_mono=0.0)
    assert (finish.usage.cost, finish.usage.currency) == (None, None)


def _budget(**money: object) -> fairness.TenantBudget:
    midnight = dt.datetime(2026, 3, 15, tzinfo=dt.UTC)
    values: dict[str, object] = {
        "currency": "EUR", "daily": None, "monthly": decimal.Decimal("500.00"), "spent_today": decimal.Decimal("3"),
        "spent_this_month": decimal.Decimal("500.0000001"), "daily_spent": False, "monthly_spent": True,
        "day_resets_at": midnight, "month_resets_at": dt.datetime(2026, 4, 1, tzinfo=dt.UTC),
    }  # fmt: skip
    values.update(money)
    return fairness.TenantBudget(
        tenant=TenantName("acme"), budget=None, used=0, exhausted=False, resets_at=midnight,
        money=fairness.MoneyBudget(**values), claims_stopped=True,  # type: ignore[arg-type]
    )  # fmt: skip


def test_status_names_the_spent_budget_and_when_claims_resume() -> None:
    state = budgets.state(_budget(), tenant="acme")
    assert state is not None and state.exhausted and state.reason == conditions.MONTHLY_BUDGET_SPENT
    assert state.message == (
        "tenant acme: 500.0000001 of 500.00 EUR spent this month; jobs wait (they do not fail) until "
        "2026-04-01T00:00:00Z"
    )
    daily = budgets.state(_budget(daily=decimal.Decimal("3"), daily_spent=True, monthly_spent=False), tenant="acme")
    assert daily is not None and daily.reason == conditions.DAILY_BUDGET_SPENT
    assert daily.message.endswith("until 2026-03-15T00:00:00Z")
    within = budgets.state(_budget(monthly_spent=False), tenant="acme")
    assert within is not None and not within.exhausted and within.reason == conditions.WITHIN_BUDGET


def test_the_webhook_payload_carries_usage_and_cost_only_when_known() -> None:
    common: dict[str, object] = {
        "job_id": 7, "tenant": "acme", "batch_namespace": "acme", "batch_name": "b", "document_key": "k",
        "schema": "invoice.v1", "result": {"total": None}, "policy": "invoice-strict-v2", "outcome": "passed",
        "timestamp": NOW,
    }  # fmt: skip
    bare = payload.completed(**common).to_json()  # type: ignore[arg-type]
    assert b'"usage"' not in bare and b'"cost"' not in bare and b'"total":null' in bare
    full = payload.completed(
        **common, usage=payload.Usage(tokens_in=1200, tokens_out=80),  # type: ignore[arg-type]
        cost=payload.Cost(amount="0.000228", currency="USD"),
    ).to_json()
    assert b'"usage":{"tokens_in":1200,"tokens_out":80},"cost":{"amount":"0.000228","currency":"USD"}' in full


async def test_a_gpu_hour_priced_attempt_finishes_with_its_cost_pending_in_the_pools_currency() -> None:
    answer = base.Outcome.ok({}, tokens_in=1000, tokens_out=100)
    by_gpu = costing.Pricing(currency="EUR", input_per_million=None, output_per_million=None,
                             gpu_hour_price=decimal.Decimal("2.50"))  # fmt: skip
    executor = executing.Executor(provider=providers.ScriptedProvider(providers.always(answer)),
                                  settings=AttemptSettings(timeout_s=5), pricing=by_gpu)  # fmt: skip
    finish = await executor.run(_job(), claimed_mono=0.0)
    assert (finish.usage.cost, finish.usage.currency) == (None, "EUR")  # priced when its interval closes
    assert (finish.usage.tokens_in, finish.usage.tokens_out) == (1000, 100)


async def test_a_priced_attempt_notes_its_reservation_before_the_request_is_sent() -> None:
    sent: list[str] = []
    noted: list[tuple[int, int, int, int]] = []

    class _Records:
        max_output_tokens = 1000

        async def extract(self, document: base.Document, *, schema: str, policy: str) -> base.Outcome:
            sent.append(document.key)
            assert noted, "the request left before its reservation was noted"
            return base.Outcome.ok({}, tokens_in=10, tokens_out=1)

    async def note(job_id: JobId, fence: Fence, prompt: int, output: int) -> bool:
        noted.append((job_id, fence, prompt, output))
        return True

    executor = executing.Executor(provider=_Records(), settings=AttemptSettings(timeout_s=5), pricing=PRICING,
                                  note_reservation=note)  # fmt: skip
    job = _job()
    await executor.run(job, claimed_mono=0.0)
    reserved = limiting.estimate_tokens(job.text or "", max_output_tokens=1000)
    assert noted == [(job.id, job.fence, reserved - 1000, 1000)] and len(sent) == 1
