-- job_documents: a job's document, its text inline or (given by manifest) its URI, SHA-256 and
-- size (migration 0008). The claim (job_claim_batch) reads it with the job; these are the rest.

-- name: document_get_report
-- The document text: only on explicit request (`lading jobs show --show-document`).
SELECT text FROM job_documents WHERE job_id = $1;

-- name: document_delete_expired
-- Retention (worker/lading_worker/cleaning.py): the documents (text or URI) of at most $3 jobs of tenant $1 that
-- ended more than $2 days ago, oldest first (extraction_jobs_document_retention, migration 0017).
-- The job row is locked first (parent before child; SKIP LOCKED, so a job being read or changed
-- is passed over) and marked with when its document went; its digests stay. Only a terminal job
-- (finished_at set) qualifies: a job waiting, running or awaiting review keeps its text.
WITH doomed AS (
    SELECT id FROM extraction_jobs
     WHERE tenant = $1 AND finished_at IS NOT NULL AND document_deleted_at IS NULL
       AND finished_at < now() - make_interval(days => $2)
     ORDER BY finished_at
     LIMIT $3
       FOR UPDATE SKIP LOCKED
), documents_gone AS (
    DELETE FROM job_documents d USING doomed WHERE d.job_id = doomed.id RETURNING 1
), marked AS (
    UPDATE extraction_jobs j SET document_deleted_at = clock_timestamp()
      FROM doomed WHERE j.id = doomed.id
    RETURNING 1
)
SELECT count(*)::bigint FROM marked;

-- name: document_oldest_retained_age
-- Retention's gauge: age in seconds since the oldest ended job of tenant $1 that still has its
-- document ended (NULL when none), from extraction_jobs_document_retention (a min() on its
-- (tenant, finished_at) order: one index probe).
SELECT extract(epoch FROM clock_timestamp() - min(finished_at))::float8
  FROM extraction_jobs
 WHERE tenant = $1 AND finished_at IS NOT NULL AND document_deleted_at IS NULL;
