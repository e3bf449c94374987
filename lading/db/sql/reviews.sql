-- Human review (run by lading/reviewing.py): the review queue, what a reviewer decides on,
-- the corrected result and the review_decisions audit trail (migration 0003).
--
-- No statement here changes extraction_jobs.state: the decision's state change is
-- job_review_decide in jobs.sql, guarded like every other move. The writes below run in
-- that statement's transaction, after it, while it holds the job's row lock.

-- name: job_review_queue_list
-- One keyset page of the jobs waiting for a reviewer, in id order: ids after $1 (0 = from the
-- start), at most $2 rows (the caller asks for one more than it shows, to learn whether
-- another page exists), of tenant $3 (NULL = every tenant). Walks
-- extraction_jobs_review_queue_by_id (migration 0003); the failed check ids come from the
-- stored verdict ({"failed_checks": [{"check": ...}, ...]}), [] when it has none.
SELECT j.id, j.tenant, b.namespace AS batch_namespace, b.name AS batch_name, j.document_key,
       j.validation_policy, j.updated_at AS waiting_since,
       extract(epoch FROM now() - j.updated_at)::float8 AS waiting_age_s,
       coalesce(jsonb_path_query_array(r.validation, '$.failed_checks[*].check'), '[]'::jsonb) AS failed_checks
  FROM extraction_jobs j
  JOIN batches b ON b.id = j.batch_id
  LEFT JOIN results r ON r.job_id = j.id
 WHERE j.state = 'REVIEW_REQUIRED'
   AND j.id > $1
   AND ($3::text IS NULL OR j.tenant = $3)
 ORDER BY j.id
 LIMIT $2;

-- name: job_get_for_correction
-- What judging a correction of job $1 needs: its schema, its validation policy and its
-- document's text (which the policy's evidence checks quote).
SELECT j.schema, j.validation_policy, d.text
  FROM extraction_jobs j
  JOIN job_documents d ON d.job_id = j.id
 WHERE j.id = $1;

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

-- name: review_decision_insert
-- $5..$8: previous result and verdict, corrected result and verdict (NULL unless corrected).
INSERT INTO review_decisions (job_id, decision, reviewer, reason, previous_result, previous_validation,
                              corrected_result, corrected_validation)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
RETURNING id, decided_at;

-- name: review_decision_list_of_job
-- The decisions about job $1, oldest first (review_decisions' unique index on job_id).
SELECT id, job_id, decision, reviewer, reason, decided_at, previous_result, previous_validation,
       corrected_result, corrected_validation
  FROM review_decisions
 WHERE job_id = $1
 ORDER BY id;

-- name: result_get_for_approval
-- The stored result an approval would deliver.
SELECT result FROM results WHERE job_id = $1;
