-- Single documents' idempotency records (lading/intake.py, migration 0021).

-- name: submission_insert
-- Claim (namespace $1, idempotency key $2) for request digest $3 and job $4. Returns nothing
-- when the key is taken; a concurrent insert of the same key waits for the first to end.
INSERT INTO document_submissions (namespace, idempotency_key, request_digest, job_id)
VALUES ($1, $2, $3, $4)
ON CONFLICT (namespace, idempotency_key) DO NOTHING
RETURNING job_id;

-- name: submission_get
-- The submission holding (namespace $1, idempotency key $2), with its job's batch.
SELECT s.request_digest, s.job_id, b.namespace AS batch_namespace, b.name AS batch_name
  FROM document_submissions s
  JOIN extraction_jobs j ON j.id = s.job_id
  JOIN batches b ON b.id = j.batch_id
 WHERE s.namespace = $1 AND s.idempotency_key = $2;

-- name: submission_delete_expired
-- Retention (lading_worker.cleaning): at most $2 idempotency records of single documents created
-- more than $1 seconds ago, oldest first through document_submissions_created, SKIP LOCKED (a key
-- being claimed is never waited on). The job stays; a later submission of the key is a new job.
WITH doomed AS (
    SELECT namespace, idempotency_key FROM document_submissions
     WHERE created_at < now() - make_interval(secs => $1)
     ORDER BY created_at
     LIMIT $2
       FOR UPDATE SKIP LOCKED
), gone AS (
    DELETE FROM document_submissions s USING doomed d
     WHERE s.namespace = d.namespace AND s.idempotency_key = d.idempotency_key
    RETURNING 1
)
SELECT count(*)::bigint FROM gone;

-- name: submission_oldest_age
SELECT extract(epoch FROM clock_timestamp() - min(created_at))::float8 FROM document_submissions;
