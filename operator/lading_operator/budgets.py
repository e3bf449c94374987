"""
What a tenant's budgets say in status: the `BudgetExhausted` condition of its TenantQuota and of its
batches, and the money it spent (pure; the figures come from `lading.db.fairness.tenant_budget`).

A spent budget stops the tenant's claims (the claim plan asks `lading_tenant_budget_left`, migration
0018); the condition says which budget, what was used of it, and when claims resume:

    reason                 when                                              resumes at
    MonthlyBudgetSpent     spec.budget.monthly spent this calendar month     the first of next month, UTC
    DailyBudgetSpent       spec.budget.daily spent this UTC day              next UTC midnight
    DailyTokenBudgetSpent  dailyTokenBudget used up this UTC day             next UTC midnight
    WithinBudget           none of them (condition False)
"""

from __future__ import annotations

import dataclasses
import decimal

from lading.db import fairness, spend
from lading_operator import conditions, status


@dataclasses.dataclass(frozen=True)
class BudgetState:
    """The BudgetExhausted condition's value, reason and message for one tenant."""

    exhausted: bool
    reason: str
    message: str


amount = spend.amount


def money(value: decimal.Decimal, currency: str) -> status.Money:
    """An exact amount as the status writes it (`{amount: "0.0123", currency: USD}`)."""
    return status.Money(amount=amount(value), currency=currency)


def state(budget: fairness.TenantBudget, *, tenant: str) -> BudgetState | None:
    """The condition for `budget`; None when the tenant has no budget at all (no condition shown)."""
    parts: list[str] = []
    m = budget.money
    if m is not None:
        if m.monthly is not None:
            parts.append(f"{amount(m.spent_this_month)} of {amount(m.monthly)} {m.currency} spent this month")
        if m.daily is not None:
            parts.append(f"{amount(m.spent_today)} of {amount(m.daily)} {m.currency} spent today")
    if budget.budget is not None:
        parts.append(f"{budget.used} of {budget.budget} tokens used today")
    if not parts:
        return None
    spent = f"tenant {tenant}: " + "; ".join(parts)
    if m is not None and m.monthly_spent:
        reason, resets_at = conditions.MONTHLY_BUDGET_SPENT, m.month_resets_at
    elif m is not None and m.daily_spent:
        reason, resets_at = conditions.DAILY_BUDGET_SPENT, m.day_resets_at
    elif budget.exhausted:
        reason, resets_at = conditions.DAILY_TOKEN_BUDGET_SPENT, budget.resets_at
    else:
        return BudgetState(exhausted=False, reason=conditions.WITHIN_BUDGET, message=spent[:1024])
    message = f"{spent}; jobs wait (they do not fail) until {status.rfc3339(resets_at)}"
    return BudgetState(exhausted=True, reason=reason, message=message[:1024])
