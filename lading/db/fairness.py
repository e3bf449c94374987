"""
Repository of fair claiming's state: tenants' daily token budgets and per-pool fair shares.

The claim itself (`jobs.claim_batch`) reads and writes this state in its own transaction;
these functions are for status, conditions and reports: the operator mirrors
`tenant_budget_exhausted` into a `BudgetExhausted` condition on the tenant's batches.
docs/fairness.md explains the scheme.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal

import asyncpg

from lading.db import queries
from lading.ids import PoolName, TenantName


@dataclasses.dataclass(frozen=True)
class MoneyBudget:
    """A tenant's money budget (TenantQuota spec.budget) and what it spent against it (docs/cost.md)."""

    currency: str
    daily: decimal.Decimal | None
    monthly: decimal.Decimal | None
    spent_today: decimal.Decimal
    """What the tenant's attempts cost this UTC day in `currency` (stale attempts included)."""
    spent_this_month: decimal.Decimal
    """The same for this calendar month (UTC), today included."""
    daily_spent: bool
    monthly_spent: bool
    day_resets_at: dt.datetime
    month_resets_at: dt.datetime
    """The first instant of next month (UTC), when a new month's budget starts."""

    @property
    def resets_at(self) -> dt.datetime | None:
        """When claims may resume as far as this budget goes: the end of the month when the month's
        amount is spent, else the end of the day when the day's is; None while neither is."""
        if self.monthly_spent:
            return self.month_resets_at
        return self.day_resets_at if self.daily_spent else None


@dataclasses.dataclass(frozen=True)
class TenantBudget:
    """A tenant's budgets: tokens per UTC day, and money per day and month."""

    tenant: TenantName
    budget: int | None
    """TenantQuota `dailyTokenBudget`; None: unlimited."""
    used: int
    """Prompt + completion tokens of every attempt finished today (stale ones included)."""
    exhausted: bool
    """True once `used` reached `budget`: the tenant's jobs wait (they are not failed)."""
    resets_at: dt.datetime
    """Next UTC midnight, when a new day's budget starts."""
    money: MoneyBudget | None = None
    """TenantQuota `budget`; None: no money budget."""
    claims_stopped: bool = False
    """True while any budget is spent: the claim plan passes the tenant over (lading_tenant_budget_left)."""

    @property
    def money_spent(self) -> bool:
        return self.money is not None and (self.money.daily_spent or self.money.monthly_spent)


@dataclasses.dataclass(frozen=True)
class TenantShare:
    """One tenant's place in a pool's fair sharing."""

    tenant: TenantName
    weight: int
    max_in_flight: int | None
    vtime: float
    """Jobs claimed in this pool divided by weight (lifted when the tenant comes back from idle)."""
    served: int
    served_at: dt.datetime | None
    in_flight: int
    """RUNNING jobs of the tenant in every pool: what `max_in_flight` bounds."""
    due: int
    """Jobs of the tenant in this pool a claim could take now (`job_eligible`, lading/db/sql/jobs.sql)."""


MAX_SHARES = 1000
"""Most tenants `shares_of_pool` lists."""


async def register_queue(conn: asyncpg.Connection, *, pool: PoolName, tenant: TenantName) -> None:
    """Give `tenant` a queue in `pool` for fair claiming (nothing when it has one). Acceptance calls it
    in its transaction: the claim plan only considers registered queues."""
    await conn.execute(queries.sql("tenant_queue_register"), pool, tenant)


async def tenant_budget(conn: asyncpg.Connection, *, tenant: TenantName) -> TenantBudget | None:
    """Today's budget of `tenant`, or None when there is no such tenant."""
    row = await conn.fetchrow(queries.sql("tenant_budget_get"), tenant)
    if row is None:
        return None
    money = None
    if row["budget_currency"] is not None:
        money = MoneyBudget(
            currency=row["budget_currency"],
            daily=row["budget_daily"],
            monthly=row["budget_monthly"],
            spent_today=row["spent_today"],
            spent_this_month=row["spent_this_month"],
            daily_spent=row["daily_spent"],
            monthly_spent=row["monthly_spent"],
            day_resets_at=row["resets_at"],
            month_resets_at=row["month_resets_at"],
        )
    return TenantBudget(
        tenant=TenantName(row["tenant"]),
        budget=row["budget"],
        used=int(row["used"]),
        exhausted=bool(row["exhausted"]),
        resets_at=row["resets_at"],
        money=money,
        claims_stopped=bool(row["claims_stopped"]),
    )


async def tenant_budget_exhausted(conn: asyncpg.Connection, tenant: TenantName) -> bool:
    """Whether `tenant` spent a budget (tokens today, money today or this month): its claims stop and
    its batches show BudgetExhausted."""
    budget = await tenant_budget(conn, tenant=tenant)
    return budget is not None and budget.claims_stopped


async def budgets_exhausted(conn: asyncpg.Connection) -> dict[TenantName, bool]:
    """Every tenant with a budget, and whether a spent budget stops its claims now."""
    rows = await conn.fetch(queries.sql("tenant_list_budget_exhausted"))
    return {TenantName(r["name"]): bool(r["exhausted"]) for r in rows}


async def shares_of_pool(conn: asyncpg.Connection, *, pool: PoolName, limit: int = MAX_SHARES) -> list[TenantShare]:
    rows = await conn.fetch(queries.sql("tenant_queues_of_pool"), pool, min(limit, MAX_SHARES))
    return [
        TenantShare(
            tenant=TenantName(r["tenant"]),
            weight=r["weight"],
            max_in_flight=r["max_in_flight"],
            vtime=r["vtime"],
            served=int(r["served"]),
            served_at=r["served_at"],
            in_flight=int(r["in_flight"]),
            due=int(r["due"]),
        )
        for r in rows
    ]
