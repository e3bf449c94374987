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
