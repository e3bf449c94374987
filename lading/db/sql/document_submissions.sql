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

-- name: submission_insert_many
-- Claim many (namespace $1[i], idempotency key $2[i]) for request digest $3[i] at once, each for a
-- new job id, in the order given (callers sort by namespace and key: one lock order). Returns the
-- claimed ones with their job ids; a key taken already is left out, and one being claimed by
-- another transaction is waited for, as `submission_insert` does.
INSERT INTO document_submissions (namespace, idempotency_key, request_digest, job_id)
SELECT k.namespace, k.idempotency_key, k.request_digest, nextval('extraction_jobs_id_seq')
  FROM unnest($1::text[], $2::text[], $3::text[]) WITH ORDINALITY AS k(namespace, idempotency_key, request_digest, n)
 ORDER BY k.n
ON CONFLICT (namespace, idempotency_key) DO NOTHING
RETURNING namespace, idempotency_key, job_id;

-- name: submission_get_many
-- The submissions holding (namespace $1[i], idempotency key $2[i]), with their jobs' batches.
SELECT s.namespace, s.idempotency_key, s.request_digest, s.job_id, b.namespace AS batch_namespace,
       b.name AS batch_name
  FROM unnest($1::text[], $2::text[]) AS k(namespace, idempotency_key)
  JOIN document_submissions s ON s.namespace = k.namespace AND s.idempotency_key = k.idempotency_key
  JOIN extraction_jobs j ON j.id = s.job_id
  JOIN batches b ON b.id = j.batch_id;

-- name: submission_delete_many
-- Release keys claimed earlier in the caller's transaction whose documents were refused.
DELETE FROM document_submissions s
 USING unnest($1::text[], $2::text[]) AS k(namespace, idempotency_key)
 WHERE s.namespace = k.namespace AND s.idempotency_key = k.idempotency_key;

-- name: submission_keys_taken
-- Which of document keys $2 rolling batch $1 holds already (keys are unique per batch).
SELECT document_key FROM extraction_jobs WHERE batch_id = $1 AND document_key = ANY($2::text[]);

-- name: submission_jobs_append
-- Documents appended to rolling batch $1, which the caller holds locked: the batch counts them
-- (ordinals follow its count before), one READY job each (ids $2, document keys $3, request
-- hashes $4, content SHA-256 $5) and its document row (text $6 or URI $7, $8 bytes); tenant $9,
-- pool $10, schema $11, validation policy $12, priority $13, max attempts $14, deadline $15
-- seconds from now. One statement for the whole group.
WITH given AS (
    SELECT * FROM unnest($2::bigint[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::integer[])
           WITH ORDINALITY AS g(id, document_key, request_hash, content_sha256, text, uri, bytes, n)
), counted AS (
    UPDATE batches SET total_jobs = total_jobs + cardinality($2::bigint[]) WHERE id = $1
    RETURNING total_jobs - cardinality($2::bigint[]) AS base, clock_timestamp() AS now
), job AS (
    INSERT INTO extraction_jobs (id, tenant, batch_id, ordinal, document_key, request_hash, content_sha256, pool,
                                 schema, validation_policy, priority, max_attempts, deadline_at)
    SELECT g.id, $9, $1, c.base + g.n::integer - 1, g.document_key, g.request_hash, g.content_sha256, $10, $11,
           $12, $13, $14, c.now + make_interval(secs => $15)
      FROM given g CROSS JOIN counted c
     ORDER BY g.n
    RETURNING id
)
INSERT INTO job_documents (job_id, text, uri, sha256, bytes)
SELECT g.id, g.text, g.uri, CASE WHEN g.uri IS NULL THEN NULL ELSE g.content_sha256 END, g.bytes
  FROM given g JOIN job ON job.id = g.id;
