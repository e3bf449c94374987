-- name: tenant_upsert
INSERT INTO tenants (name, namespaces, weight, max_queued_jobs, max_in_flight, spec)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (name) DO UPDATE
   SET namespaces = EXCLUDED.namespaces, weight = EXCLUDED.weight, max_queued_jobs = EXCLUDED.max_queued_jobs,
       max_in_flight = EXCLUDED.max_in_flight, spec = EXCLUDED.spec, updated_at = clock_timestamp();

-- name: tenant_for_namespace
-- Tenant identity comes from trusted context: the namespace of the resource. A namespace listed by
-- two tenants belongs to neither (NamespaceConflict): no row, so nothing there is admitted.
SELECT min(name) AS name FROM tenants WHERE $1 = ANY (namespaces) HAVING count(*) = 1;

-- name: tenant_list_for_namespace
-- Every tenant that lists namespace $1 (more than one: a conflict), in name order.
SELECT name FROM tenants WHERE $1 = ANY (namespaces) ORDER BY name;

-- name: tenant_namespace_conflicts
-- The namespaces of tenant $1 that another tenant lists too, with that tenant.
SELECT ns AS namespace, other.name AS other
  FROM tenants t
 CROSS JOIN LATERAL unnest(t.namespaces) AS ns
  JOIN tenants other ON other.name <> t.name AND ns = ANY (other.namespaces)
 WHERE t.name = $1
 ORDER BY ns, other.name;

-- name: tenant_revoke
-- The TenantQuota is being deleted: its namespaces stop belonging to it (nothing new is admitted
-- there). The row stays, so jobs already queued keep their tenant and finish. Returns the
-- namespaces it had.
UPDATE tenants t SET namespaces = '{}', updated_at = clock_timestamp()
  FROM (SELECT name, namespaces FROM tenants WHERE name = $1 FOR UPDATE) AS before
 WHERE t.name = before.name
RETURNING before.namespaces;

-- name: tenant_queued_jobs
-- Jobs a tenant has waiting or running: what maxQueuedJobs bounds (the counters of migration 0025).
SELECT jobs FROM lading_tenant_queued_sums($1);

-- name: tenant_max_queued_jobs
SELECT max_queued_jobs FROM tenants WHERE name = $1;

-- name: tenant_rules_get
-- Every rule of tenant $1 that admission enforces: queue bounds, allowed pools (null: any),
-- allowed priority classes (null: all) and the currency of its money budget (null: none).
SELECT name, max_queued_jobs, (spec ->> 'maxQueuedBytes')::bigint AS max_queued_bytes,
       spec -> 'allowedPools' AS allowed_pools, spec -> 'allowedPriorities' AS allowed_priorities,
       budget_currency
  FROM tenants
 WHERE name = $1;

-- name: tenant_usage_now
-- What a tenant's quota bounds, now: jobs waiting or running, their document bytes, model calls in flight.
SELECT count(*)::bigint AS queued_jobs,
       coalesce(sum(d.bytes), 0)::bigint AS queued_bytes,
       count(*) FILTER (WHERE j.state = 'RUNNING')::bigint AS in_flight
  FROM extraction_jobs j LEFT JOIN job_documents d ON d.job_id = j.id
 WHERE j.tenant = $1 AND j.state IN ('READY', 'RUNNING', 'RETRY_SCHEDULED');

-- name: tenant_budget_get
-- A tenant's budgets now: the daily token budget (the limit, what was used today (UTC), whether it
-- is spent) and the money budget of spec.budget (currency, daily and monthly amounts, what was spent
-- today and this calendar month in that currency, which is spent), when the day and the month
-- reset, and whether claims stop: lading_tenant_budget_left (migration 0018), the claim plan's own
-- test, so status never says other than what the claims do.
SELECT t.name AS tenant, t.daily_token_budget AS budget, coalesce(u.tokens, 0)::bigint AS used,
       (t.daily_token_budget IS NOT NULL AND coalesce(u.tokens, 0) >= t.daily_token_budget) AS exhausted,
       (((clock_timestamp() AT TIME ZONE 'UTC')::date + 1)::timestamp AT TIME ZONE 'UTC') AS resets_at,
       t.budget_currency, t.budget_daily, t.budget_monthly, s.today AS spent_today, s.month AS spent_this_month,
       coalesce(t.budget_daily IS NOT NULL AND s.today >= t.budget_daily, false) AS daily_spent,
       coalesce(t.budget_monthly IS NOT NULL AND s.month >= t.budget_monthly, false) AS monthly_spent,
       ((date_trunc('month', clock_timestamp() AT TIME ZONE 'UTC') + interval '1 month') AT TIME ZONE 'UTC')
           AS month_resets_at,
       NOT lading_tenant_budget_left(t.name, clock_timestamp()) AS claims_stopped
  FROM tenants t
  LEFT JOIN tenant_usage u ON u.tenant = t.name AND u.day = (clock_timestamp() AT TIME ZONE 'UTC')::date
  LEFT JOIN LATERAL lading_tenant_spend(t.name, t.budget_currency, clock_timestamp()) s
    ON t.budget_currency IS NOT NULL
 WHERE t.name = $1;

-- name: tenant_list_budget_exhausted
-- Every tenant with a budget (money or daily tokens), by name, and whether a spent budget stops its
-- claims now (lading_tenant_budget_left, the claim plan's own test). For the gauges.
SELECT name, NOT lading_tenant_budget_left(name, clock_timestamp()) AS exhausted
  FROM tenants
 WHERE budget_currency IS NOT NULL OR daily_token_budget IS NOT NULL
 ORDER BY name;

-- name: tenant_list_retention
-- Tenants whose TenantQuota sets spec.retention: days after a job ends that its document text
-- ($documents_days) and result ($results_days) are kept (NULL: kept). For the cleaner.
SELECT name, (spec -> 'retention' ->> 'documentsDays')::int AS documents_days,
       (spec -> 'retention' ->> 'resultsDays')::int AS results_days
  FROM tenants
 WHERE jsonb_typeof(spec -> 'retention') = 'object'
 ORDER BY name;
