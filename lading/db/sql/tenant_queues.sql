-- tenant_queues: fair claiming's per-(pool, tenant) state (migration 0010, docs/fairness.md).
-- Acceptance registers a queue (a single document's: submission_jobs_append_finish, in its last
-- statement), the claim (job_claim_batch) charges it; the rest is for status.

-- name: tenant_queues_of_pool
-- The fair-share state of a pool's tenants (at most $2, by name): weight, virtual time, jobs
-- served, running jobs (across pools) against the cap, and due jobs waiting in this pool.
-- Counts read the partial indexes; fine for status, never used by the claim.
SELECT q.tenant, t.weight, t.max_in_flight, q.vtime, q.served, q.served_at,
       (SELECT count(*) FROM extraction_jobs j WHERE j.tenant = q.tenant AND j.state = 'RUNNING')::bigint
           AS in_flight,
       (SELECT count(*) FROM extraction_jobs j
         WHERE j.pool = q.pool AND j.tenant = q.tenant AND {{job_eligible}})::bigint AS due
  FROM tenant_queues q
  JOIN tenants t ON t.name = q.tenant
 WHERE q.pool = $1
 ORDER BY q.tenant
 LIMIT $2;

-- name: tenant_queue_register
-- Register tenant $2's queue in pool $1 for fair claiming (a no-op when it exists). Acceptance
-- runs it in its transaction, so a batch's jobs are never claimable without their queue.
INSERT INTO tenant_queues (pool, tenant) VALUES ($1, $2) ON CONFLICT DO NOTHING;
