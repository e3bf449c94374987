-- The scaler's reads (lading/db/scaling.py, run by the operator every few seconds per pool).
-- Read-only, and bounded by the work still to do or the last minutes, never by history:
-- waiting jobs come from the claim index (extraction_jobs_fair_claimable: pool first), calls in
-- flight from the leases index, recent model calls from the limiter's permit log (pool,
-- acquired_at; pruned after two minutes). Ages use now(), the database clock.

-- name: pool_scaling_load
-- Pool $1: eligible backlog (what a claim could take now: waiting, not suspended, due, inside
-- deadline and attempt budget) and its oldest, calls in flight, and the pool's pause and 429
-- cooldown.
WITH waiting AS (
    SELECT count(*)::bigint AS backlog, min(available_at) AS oldest_available_at
      FROM extraction_jobs
     WHERE pool = $1 AND state IN ('READY', 'RETRY_SCHEDULED') AND NOT suspended
       AND available_at <= now() AND deadline_at > now() AND attempt < max_attempts
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
