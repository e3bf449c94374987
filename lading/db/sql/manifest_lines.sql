-- manifest_lines: a transaction-local staging table for one manifest batch's acceptance.
-- The validated manifest is COPYed in, checked as a whole, hashed in key order, then moved
-- into extraction_jobs and job_documents with one set-based statement. ON COMMIT DROP: it never
-- outlives the acceptance transaction; TRUNCATE lets a second manifest batch of the same
-- transaction (lading run) reuse it.

-- name: manifest_lines_create
CREATE TEMP TABLE IF NOT EXISTS manifest_lines (
    line    integer NOT NULL,
    key     text    NOT NULL,
    uri     text    NOT NULL,
    sha256  text    NOT NULL,
    bytes   integer NOT NULL
) ON COMMIT DROP;

-- name: manifest_lines_truncate
TRUNCATE manifest_lines;

-- name: manifest_lines_duplicate_key
-- The first key that appears twice, with the lines of its first two appearances.
SELECT key, (array_agg(line ORDER BY line))[1] AS first_line, (array_agg(line ORDER BY line))[2] AS line
  FROM manifest_lines
 GROUP BY key
HAVING count(*) > 1
 ORDER BY 3
 LIMIT 1;

-- name: manifest_lines_pairs
-- (key, sha256) in code point order of the key, the order the batch request hash sorts by.
SELECT key, sha256 FROM manifest_lines ORDER BY key COLLATE "C";

-- name: manifest_lines_insert_jobs
-- One job per line, in manifest order, and its document row (URI, digest, size; never the
-- text), in one statement: the CTE is materialised once, so each line gets one id and no join
-- is needed to pair documents with jobs. The job request hash is the canonical JSON template
-- of lading.jobs.hashing.job_request_template with the digest spliced in: $3 is the part
-- before the digest (with its opening quote), $4 the part after. $1 tenant, $2 batch, $5 pool,
-- $6 schema, $7 validation policy, $8 priority, $9 max attempts, $10 deadline.
-- Counted in the tenant's queue counters in one row, as submission_jobs_append_finish counts (the
-- insert triggers skipped, the setting back to 'off' once both inserts have ended). Returns the new
-- jobs' ids in manifest order as ONE int8[] value (what job_ids_of_batch would read back).
WITH exempt AS MATERIALIZED (
    SELECT set_config('lading.queued_counted', 'on', true) AS setting
), lines AS MATERIALIZED (
    SELECT nextval('extraction_jobs_id_seq') AS id, ordinal, key, uri, sha256, bytes
      FROM (SELECT (row_number() OVER (ORDER BY line) - 1)::integer AS ordinal, key, uri, sha256, bytes
              FROM manifest_lines WHERE (SELECT setting FROM exempt) = 'on' ORDER BY line) AS ordered
), jobs AS (
    INSERT INTO extraction_jobs (id, tenant, batch_id, ordinal, document_key, request_hash, content_sha256, pool,
                                 schema, validation_policy, priority, max_attempts, deadline_at)
    SELECT id, $1, $2, ordinal, key, encode(sha256($3::bytea || convert_to(sha256, 'UTF8') || $4::bytea), 'hex'),
           sha256, $5, $6, $7, $8, $9, $10
      FROM lines
    RETURNING 1
), documents AS (
    INSERT INTO job_documents (job_id, uri, sha256, bytes)
    SELECT id, uri, sha256, bytes FROM lines
    RETURNING bytes
), inserted AS MATERIALIZED (
    SELECT (SELECT count(*) FROM jobs) AS jobs, (SELECT count(*) FROM documents) AS documents,
           (SELECT coalesce(sum(bytes), 0) FROM documents)::bigint AS bytes
)
SELECT coalesce((SELECT array_agg(id ORDER BY ordinal) FROM lines), '{}') AS ids,
       set_config('lading.queued_counted', 'off', true) AS setting,
       (SELECT count(lading_tenant_queued_add($1, i.jobs, i.bytes)) FROM inserted i WHERE i.jobs > 0) AS added
  FROM inserted i;
