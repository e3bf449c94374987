-- name: job_document_sources
-- Where the claimed jobs' documents live when they were given by manifest (text IS NULL):
-- the worker fetches each URI and verifies the size and SHA-256 before the model sees it. The
-- batch's namespace bounds which file:// paths it may read (<root>/<namespace>/).
SELECT d.job_id, d.uri, d.sha256, d.bytes, b.namespace
  FROM job_documents d
  JOIN extraction_jobs j ON j.id = d.job_id
  JOIN batches b ON b.id = j.batch_id
 WHERE d.job_id = ANY($1::bigint[]) AND d.uri IS NOT NULL;

-- name: document_get_report
-- The document text: only on explicit request (`lading jobs show --show-document`).
SELECT text FROM job_documents WHERE job_id = $1;
