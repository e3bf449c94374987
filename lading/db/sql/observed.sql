-- name: observed_batch
-- One batch as the operator reports it, in one round trip: identity, per-state counts, the age
-- of the oldest job eligible to run now, and the latest finishing time. $1 tenant, $2 idempotency key.
SELECT b.id, b.total_jobs, b.created_at, b.suspended, b.endpoint,
       coalesce((SELECT jsonb_object_agg(c.state, c.n)
                   FROM (SELECT state, count(*) AS n FROM extraction_jobs WHERE batch_id = b.id GROUP BY state) c),
                '{}'::jsonb) AS counts,
       (SELECT extract(epoch FROM clock_timestamp() - min(j.available_at))::float8
          FROM extraction_jobs j
         WHERE j.batch_id = b.id AND j.state IN ('READY', 'RETRY_SCHEDULED') AND j.available_at <= clock_timestamp()
       ) AS oldest_eligible_s,
       (SELECT max(j.finished_at) FROM extraction_jobs j WHERE j.batch_id = b.id) AS last_finished_at
  FROM batches b
 WHERE b.tenant = $1 AND b.idempotency_key = $2;

-- name: observed_batch_failures
-- The most recent terminal failures of batch $1, newest first, at most $2.
SELECT document_key, coalesce(last_error_class, 'Failed') AS error_class, coalesce(last_error, '') AS error,
       finished_at
  FROM extraction_jobs
 WHERE batch_id = $1 AND state = 'FAILED_TERMINAL'
 ORDER BY finished_at DESC, id DESC
 LIMIT $2;

-- name: observed_table_exists
SELECT to_regclass($1) IS NOT NULL;

-- name: observed_batch_delivered
-- Results of batch $1 delivered to its endpoint (the deliveries table, when the dispatcher's schema is there).
SELECT count(*)::bigint FROM deliveries d JOIN extraction_jobs j ON j.id = d.job_id
 WHERE j.batch_id = $1 AND d.state = 'DELIVERED';

-- name: observed_tenant_usage
-- What a tenant's quota bounds, now: jobs waiting or running, their document bytes, model calls in flight.
SELECT count(*)::bigint AS queued_jobs,
       coalesce(sum(d.bytes), 0)::bigint AS queued_bytes,
       count(*) FILTER (WHERE j.state = 'RUNNING')::bigint AS in_flight
  FROM extraction_jobs j LEFT JOIN job_documents d ON d.job_id = j.id
 WHERE j.tenant = $1 AND j.state IN ('READY', 'RUNNING', 'RETRY_SCHEDULED');

-- name: observed_endpoint_health
-- The dispatcher's view of an endpoint: breaker and auth state, and delivery counts by state.
SELECT e.breaker_state, e.auth_failing, e.last_auth_status,
       (SELECT count(*) FROM deliveries d WHERE d.endpoint = e.name AND d.state = 'DELIVERED')::bigint AS delivered,
       (SELECT count(*) FROM deliveries d
         WHERE d.endpoint = e.name AND d.state IN ('PENDING', 'IN_FLIGHT', 'RETRY_SCHEDULED'))::bigint AS pending,
       (SELECT count(*) FROM deliveries d WHERE d.endpoint = e.name AND d.state = 'UNKNOWN_EXTERNAL')::bigint AS unknown,
       (SELECT count(*) FROM deliveries d WHERE d.endpoint = e.name AND d.state = 'FAILED_TERMINAL')::bigint AS failed
  FROM endpoints e WHERE e.name = $1;

-- name: observed_tenant_max_queued_bytes
SELECT (spec ->> 'maxQueuedBytes')::bigint FROM tenants WHERE name = $1;

-- name: observed_batch_tenant
-- The tenant a batch was accepted under, by its idempotency key alone (a deleted batch whose
-- namespace no quota covers any more).
SELECT tenant FROM batches WHERE idempotency_key = $1 ORDER BY id LIMIT 1;
