-- The review_decisions audit trail (migration 0003): who decided what about a job under
-- review, when and why. Written in the decision's transaction (lading/reviewing.py).

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
