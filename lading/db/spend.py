"""
Repository of what model calls cost, read back: a batch's and a job's sums, and tenants' spend per
currency (`tenant_spend`) for reports. (Writing happens in the group commit, `job_finish_many`; the
budget a claim obeys and the operator shows is `lading.db.fairness.tenant_budget`.)

Amounts are `decimal.Decimal`, exact as PostgreSQL's `numeric` holds them; docs/cost.md tells how an
attempt is priced.
"""

from __future__ import annotations

import dataclasses
import decimal
from collections.abc import Sequence

import asyncpg

from lading.db import queries
from lading.ids import BatchId, Fence, JobId, TenantName


@dataclasses.dataclass(frozen=True)
class Cost:
    """An exact amount in one ISO 4217 currency."""

    amount: decimal.Decimal
    currency: str

    def to_json(self) -> dict[str, str]:
        """`{"amount": "0.0123", "currency": "USD"}`: the amount as plain decimal digits, never a float."""
        return {"amount": amount(self.amount), "currency": self.currency}


async def batch_cost(conn: asyncpg.Connection | asyncpg.Pool, *, batch_id: BatchId) -> Cost | None:
    """What batch `batch_id`'s attempts cost; None when nothing of it was priced. A batch whose pool's
    currency changed (pricing removed, then set in another currency) reports its first currency's sum."""
    rows = await conn.fetch(queries.sql("batch_cost_get"), batch_id)
    if not rows:
        return None
    return Cost(amount=rows[0]["amount"], currency=rows[0]["currency"])


@dataclasses.dataclass(frozen=True)
class JobCosts:
    """What one job's attempts cost: the job's sum and each attempt's, by fence."""

    total: Cost | None
    """None: none of its attempts was priced."""
    by_fence: dict[Fence, Cost]


async def job_costs(conn: asyncpg.Connection, *, job_id: JobId, limit: int = 1000) -> JobCosts:
    """The cost of job `job_id` and of each of its priced attempts (at most `limit`, in fence order)."""
    rows = await conn.fetch(queries.sql("attempt_costs_of_job"), job_id, limit)
    total = None
    if rows and rows[0]["job_cost"] is not None:
        total = Cost(amount=rows[0]["job_cost"], currency=rows[0]["job_currency"])
    return JobCosts(
        total=total,
        by_fence={
            Fence(r["fence"]): Cost(amount=r["cost"], currency=r["cost_currency"])
            for r in rows
            if r["cost"] is not None
        },
    )


@dataclasses.dataclass(frozen=True)
class TenantSpend:
    """What a tenant spent in one currency today and this calendar month (UTC), against its budget."""

    tenant: TenantName
    currency: str
    today: decimal.Decimal
    this_month: decimal.Decimal
    daily: decimal.Decimal | None
    """The budget's daily amount, when the budget is in `currency`."""
    monthly: decimal.Decimal | None
    claims_stopped: bool
    """A budget (money or tokens) is spent: the claim plan passes the tenant over."""


SPEND_LIMIT = 100
"""Most tenant rows `lading status` shows."""


async def tenants_spend(conn: asyncpg.Connection, *, limit: int = SPEND_LIMIT) -> list[TenantSpend]:
    """Every tenant that spent something this month or has a money budget (at most `limit`, by name)."""
    rows = await conn.fetch(queries.sql("tenant_spend_report"), limit)
    return [
        TenantSpend(
            tenant=TenantName(r["tenant"]), currency=r["currency"], today=r["today"], this_month=r["month"],
            daily=r["daily"], monthly=r["monthly"], claims_stopped=r["claims_stopped"],
        )
        for r in rows
    ]


def amount(value: decimal.Decimal) -> str:
    """An exact amount as plain decimal digits, never an exponent: `0.000185`, `12.50`."""
    return format(value, "f")



async def note_reservation(
        db: asyncpg.Pool | asyncpg.Connection, job_id: JobId, fence: Fence, prompt_tokens: int, output_tokens: int
) -> bool:
    """Before attempt (`job_id`, `fence`) of a priced pool sends its request: the tokens it reserves,
    which the reaper charges should the attempt never finish (job_reap_many). False: it was closed."""
    noted = await db.fetchval(queries.sql("attempt_note_reservation"), job_id, fence, prompt_tokens, output_tokens)
    return noted is not None


async def reaped_costs(conn: asyncpg.Connection, *, job_ids: Sequence[JobId]) -> list[tuple[str, str, Cost]]:
    """What the reaper charged the attempts it just closed of jobs `job_ids` (their reservations):
    (tenant, pool, cost) per tenant, pool and currency, for `lading_cost_total`."""
    if not job_ids:
        return []
    rows = await conn.fetch(queries.sql("attempt_reaped_costs"), list(job_ids))
    return [(r["tenant"], r["pool"], Cost(amount=r["amount"], currency=r["currency"])) for r in rows]
