-- Queries of the elected gauge refresher (lading/gauges.py). Each is cheap on a large table:
-- it reads only non-terminal jobs through the partial indexes of migrations 0001/0002.

-- name: gauge_jobs_by_state
-- Non-terminal jobs by pool, tenant and state. Terminal states are not counted here: they grow
-- without bound and a count over them would cost a scan of history every interval; the
-- attempts-finished counters and `lading jobs list` cover them.
SELECT pool, tenant, state, count(*)::bigint AS n
  FROM extraction_jobs
 WHERE state IN ('READY', 'RETRY_SCHEDULED', 'RUNNING', 'REVIEW_REQUIRED')
 GROUP BY pool, tenant, state;

-- name: gauge_oldest_eligible
-- Per pool: age of the oldest job that could run now (the autoscaling signal).
SELECT pool, extract(epoch FROM now() - min(available_at))::float8 AS age_s
  FROM extraction_jobs
 WHERE state IN ('READY', 'RETRY_SCHEDULED') AND available_at <= now()
 GROUP BY pool;

-- name: gauge_review_queue
-- Jobs awaiting a reviewer, and how long the oldest has waited.
SELECT count(*)::bigint AS size, coalesce(extract(epoch FROM now() - min(updated_at)), 0)::float8 AS oldest_age_s
  FROM extraction_jobs
 WHERE state = 'REVIEW_REQUIRED';

-- name: gauge_outbox_backlog
-- Events waiting for the relay, and the age of the oldest (from the unpublished index); and the
-- events set aside as unstorable (migration 0015), which wait for a human instead.
SELECT count(*) FILTER (WHERE set_aside_at IS NULL)::bigint AS unpublished,
       coalesce(extract(epoch FROM now() - min(created_at) FILTER (WHERE set_aside_at IS NULL)), 0)::float8
           AS oldest_age_s,
       count(*) FILTER (WHERE set_aside_at IS NOT NULL)::bigint AS set_aside
  FROM outbox_events
 WHERE published_at IS NULL;

-- name: gauge_pools
-- Per pool: paused (by spec, or after the provider refused the key or the quota), and cooling
-- down after a 429. Few rows: one per InferencePool.
SELECT name AS pool,
       (paused OR coalesce(paused_until > now(), false)) AS paused,
       coalesce(cooldown_until > now(), false) AS cooling
  FROM pools;

-- name: gauge_deliveries_waiting_for_endpoint
-- Per tenant: deliveries due or retrying whose DeliveryEndpoint is not registered (the batch named
-- one that does not exist, or it was deleted). The claim skips them, so they wait, invisible to every
-- other metric, until the endpoint appears. Reads the partial index of due deliveries only.
SELECT j.tenant, count(*)::bigint AS n
  FROM deliveries d
  JOIN extraction_jobs j ON j.id = d.job_id
 WHERE d.state IN ('PENDING', 'RETRY_SCHEDULED')
   AND NOT EXISTS (SELECT 1 FROM endpoints e WHERE e.name = d.endpoint)
 GROUP BY j.tenant;
