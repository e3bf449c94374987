-- job_documents: a job's document, its text inline or (given by manifest) its URI, SHA-256 and
-- size (migration 0008). The claim (job_claim_batch) reads it with the job; these are the rest.

-- name: document_get_report
-- The document text: only on explicit request (`lading jobs show --show-document`).
SELECT text FROM job_documents WHERE job_id = $1;
