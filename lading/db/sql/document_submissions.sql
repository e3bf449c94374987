-- Single documents' idempotency records (lading/intake.py, migration 0021).

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

-- name: submission_get_many
-- The submissions holding (namespace $1[i], idempotency key $2[i]), with their jobs' batches.
SELECT s.namespace, s.idempotency_key, s.request_digest, s.job_id, b.namespace AS batch_namespace,
       b.name AS batch_name
  FROM unnest($1::text[], $2::text[]) AS k(namespace, idempotency_key)
  JOIN document_submissions s ON s.namespace = k.namespace AND s.idempotency_key = k.idempotency_key
  JOIN extraction_jobs j ON j.id = s.job_id
  JOIN batches b ON b.id = j.batch_id;

-- name: submission_keys_taken
-- Which of document keys $2 rolling batch $1 holds already (keys are unique per batch).
SELECT document_key FROM extraction_jobs WHERE batch_id = $1 AND document_key = ANY($2::text[]);

-- name: submission_claim_group
-- The first statement of a group's acceptance (lading/intake.py), in one round trip: claim each
-- document's keys, then read the group's admission context.
--   documents: namespace $1[i], idempotency key $2[i], request digest $3[i]; $4[i] true for an HTTP
--   POST, whose record (api_requests) is claimed first; in the order given (callers sort by
--   namespace and key: one lock order)
--   1. the POSTs' records, with the transaction's lock_timeout set to $5 (how long a key another
--      transaction holds is waited for: then the statement fails); a record answered before is
--      left alone
--   2. lock_timeout set to $6 for the rest of the transaction, once every record is claimed (and
--      plan_cache_mode, below)
--   3. the documents' keys, each for a new job id: a POST's only when its record is ours now; a
--      key taken already is left out, one being claimed by another transaction is waited for
--   4. the admission context (sql/admission.sql) of namespaces $7, pools $8, endpoints $9
--   5. when a key was claimed: an open rolling batch of the slots $10 for document key $11, locked
--      (batch_rolling_pick; never waits): the batch the group's documents most likely go to,
--      picked before their rules are decided (empty $10: none); and which of document keys $12 it
--      holds (submission_keys_taken)
-- For the rest of the transaction, statements run their generic plans (plan_cache_mode): left to
-- choose, PostgreSQL re-plans the group's last statement for about a third of its executions
-- (0.1 to 0.3 ms each) for a plan no better on the few rows a group touches.
-- The InitPlans order the steps: `wait` is read before the first record is inserted, `recorded`
-- (every record's claim) before the first key is. Returns one row: the records and keys claimed
-- (as arrays), the context, and the batch picked (its columns NULL when none, its keys empty).
WITH wait AS MATERIALIZED (
    SELECT set_config('lock_timeout', $5, true) AS lock_timeout
), given AS MATERIALIZED (
    SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::boolean[]) WITH ORDINALITY
                  AS g(namespace, idempotency_key, request_digest, recorded, n)
), records AS (
    INSERT INTO api_requests (namespace, idempotency_key, request_sha256, status, location, body)
    SELECT g.namespace, g.idempotency_key, g.request_digest, 202, '', '{}'::jsonb
      FROM given g
     WHERE g.recorded AND (SELECT lock_timeout FROM wait) IS NOT NULL
     ORDER BY g.n
    ON CONFLICT (namespace, idempotency_key) DO NOTHING
    RETURNING namespace, idempotency_key
), recorded AS MATERIALIZED (
    SELECT set_config('lock_timeout', $6, true) || set_config('plan_cache_mode', 'force_generic_plan', true)
               AS lock_timeout,
           coalesce(array_agg(r.namespace), '{}') AS namespaces, coalesce(array_agg(r.idempotency_key), '{}') AS keys
      FROM records r
), claimed AS (
    INSERT INTO document_submissions (namespace, idempotency_key, request_digest, job_id)
    SELECT g.namespace, g.idempotency_key, g.request_digest, nextval('extraction_jobs_id_seq')
      FROM given g
     WHERE (SELECT lock_timeout FROM recorded) IS NOT NULL
       AND (NOT g.recorded OR (g.namespace, g.idempotency_key) IN (
                SELECT * FROM unnest((SELECT namespaces FROM recorded), (SELECT keys FROM recorded))))
     ORDER BY g.n
    ON CONFLICT (namespace, idempotency_key) DO NOTHING
    RETURNING namespace, idempotency_key, job_id
), asked AS (
    SELECT $7::text[] AS namespaces, $8::text[] AS pools, $9::text[] AS endpoints
), wanted AS (
    SELECT CASE WHEN EXISTS (SELECT 1 FROM claimed) THEN $10::text[] ELSE '{}' END AS groups,
           $11::text AS document_key
), picked AS (
    SELECT * FROM {{batch_rolling_pick}} AS p
), holds AS (
    SELECT coalesce(array_agg(j.document_key), '{}') AS keys
      FROM extraction_jobs j
     WHERE j.batch_id = (SELECT p.id FROM picked p) AND j.document_key = ANY ($12::text[])
)
SELECT r.namespaces AS recorded_namespaces, r.keys AS recorded_keys,
       coalesce(c.namespaces, '{}') AS claimed_namespaces, coalesce(c.keys, '{}') AS claimed_keys,
       coalesce(c.job_ids, '{}') AS claimed_job_ids,
       {{admission_context}} AS context,
       p.id AS picked_id, p.namespace AS picked_namespace, p.name AS picked_name, p.total_jobs AS picked_total_jobs,
       p.taking AS picked_taking, p.key_taken AS picked_key_taken, h.keys AS picked_holds
  FROM recorded r
 CROSS JOIN holds h
 CROSS JOIN (SELECT array_agg(namespace) AS namespaces, array_agg(idempotency_key) AS keys, array_agg(job_id) AS job_ids
               FROM claimed) AS c
  LEFT JOIN picked p ON true;

-- name: submission_jobs_append_finish
-- The last statement of a group's acceptance (lading/intake.py), in one round trip:
--   documents appended to rolling batch $1, which the caller holds locked ($1 NULL and empty
--   arrays: none): the batch counts them (ordinals follow its count before), one READY job each
--   (ids $2, document keys $3, request hashes $4, content SHA-256 $5) and its document row (text
--   $6 or URI $7, $8 bytes); tenant $9, pool $10, schema $11, validation policy $12, priority $13,
--   max attempts $14, deadline $15 seconds from now
--   the tenants' queues registered for fair claiming: pool $16[i], tenant $17[i] (a no-op when
--   registered)
--   keys released that the transaction claimed for refused documents: ($18[i], $19[i]) of
--   document_submissions, ($20[i], $21[i]) of api_requests (a refused POST keeps no record)
--   the POSTs' answers: key ($22[i], $23[i]), status $24[i], Location $25[i], body $26[i] (JSON),
--   request digest $28[i]
--   the idle claimers of pools $27 woken at commit (NOTIFY lading_jobs, as job_notify_available)
-- The documents are counted in their tenant's queue counters here, in one counter row (jobs and
-- bytes together, lading_tenant_queued_add, migration 0032), instead of by the two insert
-- triggers (a row each, and the document rows' reads of their jobs): `exempt` sets
-- lading.queued_counted before any job or document row is inserted, so each insert's AFTER
-- STATEMENT trigger is skipped when its statement ends (the trigger's WHEN is read then);
-- `inserted` reads both inserts to their end (which ends them), and only then `queued` writes the
-- row and sets the setting back to 'off', so whatever the transaction inserts next is counted by
-- the triggers again. The order rests on the reads, not on how the CTEs are written.
WITH exempt AS MATERIALIZED (
    SELECT set_config('lading.queued_counted', 'on', true) AS setting
), given AS (
    SELECT * FROM unnest($2::bigint[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::integer[])
           WITH ORDINALITY AS g(id, document_key, request_hash, content_sha256, text, uri, bytes, n)
     WHERE (SELECT setting FROM exempt) = 'on'
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
), document AS (
    INSERT INTO job_documents (job_id, text, uri, sha256, bytes)
    SELECT g.id, g.text, g.uri, CASE WHEN g.uri IS NULL THEN NULL ELSE g.content_sha256 END, g.bytes
      FROM given g JOIN job ON job.id = g.id
    RETURNING bytes
), inserted AS MATERIALIZED (
    SELECT (SELECT count(*) FROM job) AS jobs, (SELECT coalesce(sum(bytes), 0) FROM document)::bigint AS bytes
), queued AS (
    SELECT set_config('lading.queued_counted', 'off', true) AS setting,
           (SELECT count(lading_tenant_queued_add($9, i.jobs, i.bytes)) FROM inserted i WHERE i.jobs > 0) AS added
      FROM inserted
), queue AS (
    INSERT INTO tenant_queues (pool, tenant)
    SELECT * FROM unnest($16::text[], $17::text[])
    ON CONFLICT DO NOTHING
), unclaimed AS (
    DELETE FROM document_submissions s
     USING unnest($18::text[], $19::text[]) AS k(namespace, idempotency_key)
     WHERE s.namespace = k.namespace AND s.idempotency_key = k.idempotency_key
), released AS (
    DELETE FROM api_requests r
     USING unnest($20::text[], $21::text[]) AS k(namespace, idempotency_key)
     WHERE r.namespace = k.namespace AND r.idempotency_key = k.idempotency_key
), answered AS (
    -- Each record exists (this transaction's claim inserted it): written through the conflict on
    -- its key, which finds it by the primary key whatever plan the statement runs.
    INSERT INTO api_requests AS r (namespace, idempotency_key, request_sha256, status, location, body)
    SELECT k.namespace, k.idempotency_key, k.request_sha256, k.status, k.location, k.body::jsonb
      FROM unnest($22::text[], $23::text[], $24::integer[], $25::text[], $26::text[], $28::text[])
           AS k(namespace, idempotency_key, status, location, body, request_sha256)
    ON CONFLICT (namespace, idempotency_key) DO UPDATE
       SET status = EXCLUDED.status, location = EXCLUDED.location, body = EXCLUDED.body
)
SELECT q.setting, (SELECT count(pg_notify('lading_jobs', pool)) FROM unnest($27::text[]) AS pool) FROM queued q;
