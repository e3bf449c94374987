-- tenant_spend: what each tenant's attempts cost, per currency and UTC day (migration 0018), added by
-- job_finish_many in jobs.sql. Budgets (TenantQuota spec.budget) are read in tenants.sql and by
-- lading_tenant_budget_left.

-- name: tenant_spend_report
-- Every tenant that spent something this calendar month (UTC) or has a money budget, at most $1, by
-- name: per currency what it spent today and this month, its budget where the budget is in that
-- currency, and whether its claims are stopped by a spent budget (lading_tenant_budget_left).
WITH month AS (
    SELECT s.tenant, s.currency,
           coalesce(sum(s.amount) FILTER (WHERE s.day = (clock_timestamp() AT TIME ZONE 'UTC')::date), 0) AS today,
           sum(s.amount) AS month
      FROM tenant_spend s
     WHERE s.day >= date_trunc('month', clock_timestamp() AT TIME ZONE 'UTC')::date
     GROUP BY s.tenant, s.currency
), rows AS (
    SELECT coalesce(m.tenant, t.name) AS tenant, coalesce(m.currency, t.budget_currency) AS currency,
           coalesce(m.today, 0) AS today, coalesce(m.month, 0) AS month
      FROM month m
      FULL JOIN (SELECT name, budget_currency FROM tenants WHERE budget_currency IS NOT NULL) t
        ON t.name = m.tenant AND t.budget_currency = m.currency
)
SELECT r.tenant, r.currency, r.today, r.month,
       CASE WHEN t.budget_currency = r.currency THEN t.budget_daily END AS daily,
       CASE WHEN t.budget_currency = r.currency THEN t.budget_monthly END AS monthly,
       NOT coalesce(lading_tenant_budget_left(r.tenant, clock_timestamp()), true) AS claims_stopped
  FROM rows r
  LEFT JOIN tenants t ON t.name = r.tenant
 ORDER BY r.tenant, r.currency
 LIMIT $1;
