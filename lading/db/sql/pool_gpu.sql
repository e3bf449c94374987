-- pool_gpu_samples, pool_gpu_cursor, pool_gpu_intervals (migration 0026): the GPU time of vLLM pools
-- priced by the GPU hour and its allocation to attempts, one 60 s interval at a time
-- (lading.db.gpu_time, docs/cost.md).

-- name: pool_gpu_sample_insert
-- The operator saw $2 ready replicas of pool $1's vLLM Deployment, $3 GPUs each, now.
INSERT INTO pool_gpu_samples (pool, ready_replicas, gpus)
VALUES ($1, $2, $3)
ON CONFLICT (pool, at) DO NOTHING;

-- name: pool_gpu_priced_list
-- Pools priced by the GPU hour, by name, with their specs.
SELECT name, spec FROM pools WHERE spec -> 'pricing' ->> 'gpuHourPrice' IS NOT NULL ORDER BY name;

-- name: pool_gpu_cursor_start
-- Pool $1's first interval to close, if it has none yet: the minute of its first sample or of its
-- first attempt waiting for a price, whichever is earlier (nothing when it has neither).
INSERT INTO pool_gpu_cursor (pool, closed_until)
SELECT $1, date_bin('60 seconds', t.first_at, timestamptz '2000-01-01 00:00:00+00')
  FROM (SELECT least((SELECT min(s.at) FROM pool_gpu_samples s WHERE s.pool = $1),
                     (SELECT min(a.finished_at)
                        FROM job_attempts a JOIN extraction_jobs j ON j.id = a.job_id
                       WHERE a.cost IS NULL AND a.cost_currency IS NOT NULL AND a.finished_at IS NOT NULL
                         AND j.pool = $1)) AS first_at) t
 WHERE t.first_at IS NOT NULL
ON CONFLICT (pool) DO NOTHING;

-- name: pool_gpu_cursor_lock
-- Inside the interval's transaction: the end of pool $1's last closed interval, locked (closing
-- the next one is serialised on this row), with the time of its latest sample and now.
SELECT c.closed_until, clock_timestamp() AS now,
       (SELECT max(s.at) FROM pool_gpu_samples s WHERE s.pool = $1) AS latest_sample_at
  FROM pool_gpu_cursor c
 WHERE c.pool = $1
   FOR UPDATE;

-- name: pool_gpu_samples_of_interval
-- The samples of pool $1 that tell its replicas in [$2, $3): the last one at or before $2 (the
-- state the interval starts in), then every one inside it, in time order.
SELECT at, ready_replicas, gpus
  FROM pool_gpu_samples
 WHERE pool = $1 AND at < $3
   AND at >= coalesce((SELECT max(at) FROM pool_gpu_samples WHERE pool = $1 AND at <= $2), '-infinity')
 ORDER BY at;

-- name: attempt_gpu_pending_of_pool
-- Attempts of pool $1 waiting for their price that finished before $2 (those of the interval that
-- ends at $2, and any that committed after an earlier interval closed), in (job, fence)
-- order: their tokens as reported, else their reservation (an answer without usage, an attempt
-- the reaper closed), else 0. Through job_attempts_cost_pending (migration 0026).
SELECT a.job_id, a.fence, a.cost_currency AS currency,
       coalesce(a.tokens_in, a.reserved_tokens_in, 0)::bigint
           + coalesce(a.tokens_out, a.reserved_tokens_out, 0)::bigint AS tokens
  FROM job_attempts a
  JOIN extraction_jobs j ON j.id = a.job_id
 WHERE a.cost IS NULL AND a.cost_currency IS NOT NULL AND a.finished_at < $2 AND j.pool = $1
 ORDER BY a.job_id, a.fence;

-- name: pool_gpu_interval_insert
-- Pool $1's interval starting at $2 is closed: $3 currency, $4 GPU-seconds, $5 its cost, $6 what of
-- it went to attempts, $7 attempts, $8 tokens. Nothing when it was closed already.
INSERT INTO pool_gpu_intervals (pool, starts_at, currency, gpu_seconds, cost, charged, attempts, tokens)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
ON CONFLICT (pool, starts_at) DO NOTHING
RETURNING true;

-- name: pool_gpu_interval_charge
-- The attempts (jobs $1, fences $2) of an interval get their shares $3 of currency $4: added to
-- each attempt, its job, its batch's sum (batch_costs) and its tenant's spend of the interval's
-- UTC day $5, as job_finish_many adds a per-token cost. Rows are locked jobs first in id order,
-- then attempts, tenant_spend in (tenant, currency) order and batch_costs in (batch, currency)
-- order, as job_finish_many locks them. Returns each tenant's sum (for lading_cost_total).
WITH input AS (
    SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::numeric[]) AS t(job_id, fence, cost)
), locked AS (
    SELECT j.id, j.tenant, j.batch_id FROM extraction_jobs j WHERE j.id = ANY($1::bigint[]) ORDER BY j.id FOR UPDATE
), priced AS (
    UPDATE job_attempts a
       SET cost = i.cost
      FROM input i JOIN locked l ON l.id = i.job_id
     WHERE a.job_id = i.job_id AND a.fence = i.fence AND a.cost IS NULL AND a.cost_currency = $4
    RETURNING a.job_id, a.cost
), per_job AS (
    SELECT p.job_id, sum(p.cost) AS cost FROM priced p GROUP BY p.job_id
), added AS (
    UPDATE extraction_jobs j
       SET cost = coalesce(j.cost, 0) + p.cost, cost_currency = coalesce(j.cost_currency, $4)
      FROM per_job p
     WHERE j.id = p.job_id AND (j.cost_currency IS NULL OR j.cost_currency = $4)
    RETURNING j.id, j.batch_id, p.cost
), spent AS (
    INSERT INTO tenant_spend AS s (tenant, currency, day, amount)
    SELECT l.tenant, $4, $5::date, sum(p.cost)
      FROM per_job p JOIN locked l ON l.id = p.job_id
     GROUP BY l.tenant
    HAVING sum(p.cost) > 0
     ORDER BY l.tenant
    ON CONFLICT (tenant, currency, day) DO UPDATE SET amount = s.amount + EXCLUDED.amount
), batch_spent AS (
    INSERT INTO batch_costs AS b (batch_id, currency, amount)
    SELECT a.batch_id, $4, sum(a.cost) FROM added a GROUP BY a.batch_id ORDER BY a.batch_id
    ON CONFLICT (batch_id, currency) DO UPDATE SET amount = b.amount + EXCLUDED.amount
)
SELECT l.tenant, sum(p.cost) AS amount
  FROM per_job p JOIN locked l ON l.id = p.job_id
 GROUP BY l.tenant
 ORDER BY l.tenant;

-- name: pool_gpu_samples_prune
-- Samples of pool $1 no interval needs any more: older than the last one at or before $2 (the end
-- of the interval just closed, where the next one starts).
DELETE FROM pool_gpu_samples
 WHERE pool = $1
   AND at < (SELECT max(at) FROM pool_gpu_samples WHERE pool = $1 AND at <= $2);

-- name: pool_gpu_cursor_advance
-- Pool $1's intervals are closed up to $3 (from $2, as locked).
UPDATE pool_gpu_cursor SET closed_until = $3 WHERE pool = $1 AND closed_until = $2;

-- name: pool_gpu_interval_report
-- Pool $1's closed intervals since $2, oldest first, at most $3: GPU time, cost, what went to
-- attempts and what stayed idle.
SELECT starts_at, currency, gpu_seconds, cost, charged, cost - charged AS idle, attempts, tokens
  FROM pool_gpu_intervals
 WHERE pool = $1 AND starts_at >= $2
 ORDER BY starts_at
 LIMIT $3;

-- name: pool_gpu_interval_delete_expired
-- Retention (worker/lading_worker/cleaning.py): at most $2 closed GPU-time intervals that started
-- more than $1 seconds ago. Their attempts keep their costs; the intervals are the pool's record
-- of GPU time and idle cost. Oldest first through pool_gpu_intervals_starts_at (migration 0031).
WITH doomed AS (
    SELECT pool, starts_at FROM pool_gpu_intervals
     WHERE starts_at < now() - make_interval(secs => $1)
     ORDER BY starts_at
     LIMIT $2
       FOR UPDATE SKIP LOCKED
), gone AS (
    DELETE FROM pool_gpu_intervals i USING doomed d WHERE i.pool = d.pool AND i.starts_at = d.starts_at RETURNING 1
)
SELECT count(*)::bigint FROM gone;

-- name: pool_gpu_interval_oldest_age
SELECT extract(epoch FROM clock_timestamp() - min(starts_at))::float8 FROM pool_gpu_intervals;
