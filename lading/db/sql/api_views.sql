-- The HTTP intake's reads over jobs, batches and results (lading/db/api_views.py). Every read is
-- confined to the caller's namespaces ($ns: text[]) in the same statement, so an object of another
-- namespace and one that does not exist look the same (404).

-- name: api_job_get
SELECT j.id, j.state, j.document_key, j.attempt, j.max_attempts, j.available_at, j.deadline_at,
       j.created_at, j.updated_at, j.finished_at, j.last_error_class, j.result_deleted_at,
       b.namespace, b.name AS batch_name
  FROM extraction_jobs j
  JOIN batches b ON b.id = j.batch_id
 WHERE j.id = $1 AND b.namespace = ANY ($2::text[]);

-- name: api_job_result
SELECT j.id, j.state, j.document_key, j.finished_at, j.result_deleted_at, r.result, r.validation,
       r.schema, r.validation_policy
  FROM extraction_jobs j
  JOIN batches b ON b.id = j.batch_id
  LEFT JOIN results r ON r.job_id = j.id
 WHERE j.id = $1 AND b.namespace = ANY ($2::text[]);

-- name: api_batch_find
-- The newest batch named $2 in namespace $1 (a name used again after a deletion names the new one),
-- through batches_namespace_name.
SELECT id, tenant, namespace, name, uid, idempotency_key, pool, endpoint, suspended, total_jobs, created_at
  FROM batches
 WHERE namespace = $1 AND name = $2
 ORDER BY id DESC
 LIMIT 1;

-- name: api_batch_results_page
-- One page of a batch's results in document-key order after key $2 ('' from the start), at most $3
-- rows: keyset paging on the (batch_id, document_key) unique index.
SELECT j.id, j.document_key, j.state, j.result_deleted_at, r.result, r.validation
  FROM extraction_jobs j
  LEFT JOIN results r ON r.job_id = j.id
 WHERE j.batch_id = $1 AND j.document_key > $2
 ORDER BY j.document_key
 LIMIT $3;

-- name: api_tenant_drain_rate
-- How fast tenant $1's queue drained over the last $2 seconds: jobs (and their document bytes) that
-- left it, finished (extraction_jobs_document_retention) or sent to review (the review queue index).
WITH left_queue AS (
    SELECT j.id FROM extraction_jobs j
     WHERE j.tenant = $1 AND j.finished_at > clock_timestamp() - make_interval(secs => $2)
     UNION ALL
    SELECT j.id FROM extraction_jobs j
     WHERE j.state = 'REVIEW_REQUIRED' AND j.updated_at > clock_timestamp() - make_interval(secs => $2)
       AND j.tenant = $1
)
SELECT count(*)::float8 / $2 AS jobs_per_s,
       coalesce(sum(d.bytes), 0)::float8 / $2 AS bytes_per_s
  FROM left_queue l LEFT JOIN job_documents d ON d.job_id = l.id;

-- name: api_job_namespace
-- The namespace of job $1's batch: asked before a Kubernetes user's access to it is reviewed.
SELECT b.namespace FROM extraction_jobs j JOIN batches b ON b.id = j.batch_id WHERE j.id = $1;
