-- name: job_document_sources
-- Where the claimed jobs' documents live when they were given by manifest (text IS NULL):
-- the worker fetches each URI and verifies the size and SHA-256 before the model sees it.
SELECT job_id, uri, sha256, bytes
  FROM job_documents
 WHERE job_id = ANY($1::bigint[]) AND uri IS NOT NULL;
