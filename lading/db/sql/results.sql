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
