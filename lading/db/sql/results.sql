-- The results table: what an attempt extracted (written by job_finish_many in jobs.sql) and
-- what a reviewer's correction replaced it with. Reviewer writes run in the transaction of the
-- decision's guarded state change (job_review_decide), after it, while it holds the job's row lock.

-- name: result_get_for_approval
-- The stored result an approval would deliver.
SELECT result FROM results WHERE job_id = $1;

-- name: result_replace_corrected
-- Store the reviewer's result $2 and the policy's verdict on it $3 as job $1's result, and
-- return the result and verdict it replaced (NULL when the job had none: the CTE reads the
-- snapshot from before this statement). The fence stays that of the attempt that extracted.
WITH previous AS (
    SELECT result, validation FROM results WHERE job_id = $1
)
INSERT INTO results AS r (job_id, fence, schema, validation_policy, result, validation)
SELECT j.id, j.fence, j.schema, j.validation_policy, $2::jsonb, $3::jsonb
  FROM extraction_jobs j
 WHERE j.id = $1
    ON CONFLICT (job_id) DO UPDATE SET result = excluded.result, validation = excluded.validation
RETURNING (SELECT result FROM previous) AS previous_result,
          (SELECT validation FROM previous) AS previous_validation;

-- name: result_get_report
SELECT fence, schema, validation_policy, result, validation, created_at FROM results WHERE job_id = $1;

-- name: result_delete_expired
-- Retention (worker/lading_worker/cleaning.py): the extracted JSON of at most $3 jobs of tenant $1 that ended
-- more than $2 days ago and whose document already went (text first), oldest first
-- (extraction_jobs_result_retention, migration 0017). The results row keeps fence, schema and
-- verdict. A job with a delivery still to send keeps its result until the delivery settles; the
-- job row is locked first (SKIP LOCKED), and `delivery_redeliver` takes it FOR SHARE, so a
-- redelivery and this deletion never both succeed.
WITH doomed AS (
    SELECT j.id FROM extraction_jobs j
     WHERE j.tenant = $1 AND j.document_deleted_at IS NOT NULL AND j.result_deleted_at IS NULL
       AND j.finished_at < now() - make_interval(days => $2)
       AND NOT EXISTS (SELECT 1 FROM deliveries d
                        WHERE d.job_id = j.id AND d.state IN ('PENDING', 'IN_FLIGHT', 'RETRY_SCHEDULED'))
     ORDER BY j.finished_at
     LIMIT $3
       FOR UPDATE OF j SKIP LOCKED
), cleared AS (
    UPDATE results r SET result = NULL FROM doomed WHERE r.job_id = doomed.id RETURNING 1
), marked AS (
    UPDATE extraction_jobs j SET result_deleted_at = clock_timestamp()
      FROM doomed WHERE j.id = doomed.id
    RETURNING 1
)
SELECT count(*)::bigint FROM marked;

-- name: result_oldest_retained_age
-- Retention's gauge: age in seconds since the oldest ended job of tenant $1 whose document went
-- and whose result is still kept ended (NULL when none), from extraction_jobs_result_retention.
SELECT extract(epoch FROM clock_timestamp() - min(finished_at))::float8
  FROM extraction_jobs
 WHERE tenant = $1 AND document_deleted_at IS NOT NULL AND result_deleted_at IS NULL;
