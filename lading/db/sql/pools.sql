-- name: pool_upsert
INSERT INTO pools (name, provider, model, spec, paused)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (name) DO UPDATE
   SET provider = EXCLUDED.provider, model = EXCLUDED.model, spec = EXCLUDED.spec, paused = EXCLUDED.paused,
       updated_at = clock_timestamp();

-- name: pool_get
SELECT name, provider, model, spec, paused FROM pools WHERE name = $1;

-- name: endpoint_upsert
INSERT INTO endpoints (name, url, spec) VALUES ($1, $2, $3)
ON CONFLICT (name) DO UPDATE SET url = EXCLUDED.url, spec = EXCLUDED.spec, updated_at = clock_timestamp();

-- name: pool_pause
-- Pause pool $1 for $2 seconds (never shortening a longer pause) with reason $3.
UPDATE pools
   SET paused_until = greatest(coalesce(paused_until, clock_timestamp()), clock_timestamp() + make_interval(secs => $2)),
       paused_reason = $3, updated_at = clock_timestamp()
 WHERE name = $1
RETURNING paused_until;

-- name: endpoint_exists
-- Whether a DeliveryEndpoint ("namespace/name") is registered: deliveries to one that is not wait.
SELECT EXISTS (SELECT 1 FROM endpoints WHERE name = $1);

-- name: pool_delete_unused
-- Unregister pool $1 unless a batch refers to it (those rows stay, with their history).
DELETE FROM pools p WHERE p.name = $1 AND NOT EXISTS (SELECT 1 FROM batches b WHERE b.pool = p.name)
RETURNING p.name;

-- name: pool_list_flags
-- Per pool: paused (by spec, or after the provider refused the key or the quota), and cooling
-- down after a 429. Few rows: one per InferencePool.
SELECT name AS pool,
       (paused OR coalesce(paused_until > now(), false)) AS paused,
       coalesce(cooldown_until > now(), false) AS cooling
  FROM pools;

-- name: pool_status_report
-- Per pool (at most $1, by name): the eligible backlog (job_eligible in jobs.sql) and the oldest
-- eligible job, from the claim index; running jobs from the leases index.
WITH running AS (
    SELECT pool, count(*)::bigint AS n FROM extraction_jobs WHERE state = 'RUNNING' GROUP BY pool
)
SELECT p.name, p.paused, q.backlog, coalesce(r.n, 0)::bigint AS running, q.oldest_available_at,
       extract(epoch FROM now() - q.oldest_available_at)::float8 AS oldest_age_s
  FROM (SELECT name, paused OR coalesce(paused_until > now(), false) AS paused  -- by spec, or for a refused key/quota
          FROM pools ORDER BY name LIMIT $1) p
 CROSS JOIN LATERAL (
       SELECT count(*)::bigint AS backlog, min(j.available_at) AS oldest_available_at
         FROM extraction_jobs j
        WHERE j.pool = p.name AND {{job_eligible}}
       ) q
  LEFT JOIN running r ON r.pool = p.name
 ORDER BY p.name;

-- name: pool_scaling_load
-- Pool $1: eligible backlog (what a claim could take now: job_eligible in jobs.sql) and its
-- oldest, calls in flight, and the pool's pause and 429 cooldown.
WITH waiting AS (
    SELECT count(*)::bigint AS backlog, min(j.available_at) AS oldest_available_at
      FROM extraction_jobs j
     WHERE j.pool = $1 AND {{job_eligible}}
), running AS (
    SELECT count(*)::bigint AS in_flight FROM extraction_jobs WHERE state = 'RUNNING' AND pool = $1
)
SELECT w.backlog, w.oldest_available_at,
       CASE WHEN w.oldest_available_at IS NOT NULL     -- greatest() would turn "none" into 0
            THEN greatest(extract(epoch FROM now() - w.oldest_available_at), 0) END::float8 AS oldest_age_s,
       r.in_flight, coalesce(p.paused, false) AS paused, p.paused_until, p.paused_reason, p.cooldown_until,
       now() AS at
  FROM waiting w
 CROSS JOIN running r
  LEFT JOIN pools p ON p.name = $1;

-- name: pool_scaling_attempt_stats
-- Pool $1: model calls started in the last $2 seconds and finished: how many, their mean
-- latency (s) and mean tokens as the limiter counts them (used, or the reservation when the
-- provider reported none).
SELECT count(*)::bigint AS attempts,
       avg(extract(epoch FROM released_at - acquired_at))::float8 AS mean_latency_s,
       avg(coalesce(tokens_used, tokens_reserved))::float8 AS mean_tokens
  FROM limiter_permits
 WHERE pool = $1
   AND acquired_at > now() - make_interval(secs => $2)
   AND released_at IS NOT NULL;
