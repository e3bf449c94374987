-- Fair claiming's state, for status and conditions (migration 0010, docs/fairness.md).

-- name: tenant_budget_get
-- A tenant's daily token budget today (UTC): the limit, what was used, whether it is spent,
-- and when the day (and so the budget) resets.
SELECT t.name AS tenant, t.daily_token_budget AS budget, coalesce(u.tokens, 0)::bigint AS used,
       (t.daily_token_budget IS NOT NULL AND coalesce(u.tokens, 0) >= t.daily_token_budget) AS exhausted,
       (((clock_timestamp() AT TIME ZONE 'UTC')::date + 1)::timestamp AT TIME ZONE 'UTC') AS resets_at
  FROM tenants t
  LEFT JOIN tenant_usage u ON u.tenant = t.name AND u.day = (clock_timestamp() AT TIME ZONE 'UTC')::date
 WHERE t.name = $1;

-- name: tenant_queues_of_pool
-- The fair-share state of a pool's tenants (at most $2, by name): weight, virtual time, jobs
-- served, running jobs (across pools) against the cap, and due jobs waiting in this pool.
-- Counts read the partial indexes; fine for status, never used by the claim.
SELECT q.tenant, t.weight, t.max_in_flight, q.vtime, q.served, q.served_at,
       (SELECT count(*) FROM extraction_jobs j WHERE j.tenant = q.tenant AND j.state = 'RUNNING')::bigint
           AS in_flight,
       (SELECT count(*) FROM extraction_jobs j
         WHERE j.pool = q.pool AND j.tenant = q.tenant AND j.state IN ('READY', 'RETRY_SCHEDULED')
           AND NOT j.suspended AND j.available_at <= clock_timestamp())::bigint AS due
  FROM tenant_queues q
  JOIN tenants t ON t.name = q.tenant
 WHERE q.pool = $1
 ORDER BY q.tenant
 LIMIT $2;
