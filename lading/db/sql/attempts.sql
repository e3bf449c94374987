-- job_attempts: one row per model call of a job, under its fence (written by the claim and
-- job_finish_many in jobs.sql).

-- name: attempt_list_report
-- Every attempt of job $1 in fence order, at most $2 (primary key (job_id, fence)).
SELECT fence, attempt, worker_id, started_at, finished_at, outcome, error_class, error,
       tokens_in, tokens_out, latency_ms
  FROM job_attempts
 WHERE job_id = $1
 ORDER BY fence
 LIMIT $2;

-- name: attempt_costs_of_job
-- What each attempt of job $1 cost (NULL: its pool is unpriced), in fence order, at most $2, and the
-- job's sum (extraction_jobs.cost) on every row.
SELECT a.fence, a.cost, a.cost_currency, j.cost AS job_cost, j.cost_currency AS job_currency
  FROM extraction_jobs j
  JOIN job_attempts a ON a.job_id = j.id
 WHERE j.id = $1
 ORDER BY a.fence
 LIMIT $2;

-- name: attempt_note_reservation
-- Before the request of attempt (job $1, fence $2) of a priced pool is sent: the tokens it reserves
-- ($3 prompt estimate, $4 output budget). Should the attempt never finish (its worker dies, its
-- lease is lost mid-call), the reaper charges them (job_reap_many): the request may have been
-- billed. Only an open attempt is noted; returns whether it was.
UPDATE job_attempts
   SET reserved_tokens_in = $3, reserved_tokens_out = $4
 WHERE job_id = $1 AND fence = $2 AND finished_at IS NULL
RETURNING true;

-- name: attempt_reaped_costs
-- What the reaper just charged the attempts it closed of jobs $1 (their fence before the reap, now
-- fence - 1, closed as lease-expired): per tenant, pool and currency, for lading_cost_total.
SELECT j.tenant, j.pool, a.cost_currency AS currency, sum(a.cost) AS amount
  FROM extraction_jobs j
  JOIN job_attempts a ON a.job_id = j.id AND a.fence = j.fence - 1
 WHERE j.id = ANY($1::bigint[]) AND a.outcome = 'lease-expired' AND a.cost > 0
 GROUP BY j.tenant, j.pool, a.cost_currency
 ORDER BY j.tenant, j.pool, a.cost_currency;
