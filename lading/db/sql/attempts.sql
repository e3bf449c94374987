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
