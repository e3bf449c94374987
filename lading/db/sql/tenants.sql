-- name: tenant_upsert
INSERT INTO tenants (name, namespaces, weight, max_queued_jobs, max_in_flight, spec)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (name) DO UPDATE
   SET namespaces = EXCLUDED.namespaces, weight = EXCLUDED.weight, max_queued_jobs = EXCLUDED.max_queued_jobs,
       max_in_flight = EXCLUDED.max_in_flight, spec = EXCLUDED.spec, updated_at = clock_timestamp();

-- name: tenant_for_namespace
-- Tenant identity comes from trusted context: the namespace of the resource.
SELECT name FROM tenants WHERE $1 = ANY (namespaces) ORDER BY name;

-- name: tenant_queued_jobs
-- Jobs a tenant has waiting or running: what maxQueuedJobs bounds.
SELECT count(*)::bigint FROM extraction_jobs
 WHERE tenant = $1 AND state IN ('READY', 'RUNNING', 'RETRY_SCHEDULED');

-- name: tenant_max_queued_jobs
SELECT max_queued_jobs FROM tenants WHERE name = $1;
