-- name: batch_insert
-- Returns nothing when a batch with the same (tenant, idempotency key) exists: the caller
-- then compares request hashes. Concurrent inserts of the same key wait for each other.
INSERT INTO batches (tenant, namespace, name, uid, idempotency_key, request_hash, hash_version, schema,
                     pool, validation_policy, priority, deadline_s, endpoint, suspended, total_jobs)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)
ON CONFLICT (tenant, idempotency_key) DO NOTHING
RETURNING id, clock_timestamp() AS now;

-- name: batch_get_by_key
SELECT id, request_hash, hash_version, total_jobs FROM batches WHERE tenant = $1 AND idempotency_key = $2;

-- name: batch_job_ids
SELECT id FROM extraction_jobs WHERE batch_id = $1 ORDER BY ordinal;

-- name: batch_counts
-- Per-state counts of one batch, for status and `lading run`'s progress.
SELECT state, count(*)::int AS n FROM extraction_jobs WHERE batch_id = $1 GROUP BY state;

-- name: batch_timing
-- When the batch was accepted and when its last job settled (or last changed).
SELECT b.created_at AS started_at,
       (SELECT max(coalesce(j.finished_at, j.updated_at)) FROM extraction_jobs j WHERE j.batch_id = b.id) AS last_change_at
  FROM batches b WHERE b.id = $1;

-- name: batch_set_suspended
-- Suspend ($2 true) or resume batch $1 together with its jobs: the jobs' own flag keeps a
-- suspended batch out of the claim index (extraction_jobs_fair_claimable), so no claim reads
-- them. Suspension marks unfinished jobs (a running one stays out once it is rescheduled);
-- resumption clears every mark and wakes idle claimers of the batch's pool at commit.
-- The jobs are locked in id order first (docs/architecture.md, "Lock order"): running ones are
-- also locked, in id order, by their workers' heartbeats and group commits.
WITH batch AS (
    UPDATE batches SET suspended = $2 WHERE id = $1 RETURNING id, pool
), locked AS (
    SELECT j.id
      FROM extraction_jobs j JOIN batch b ON j.batch_id = b.id
     WHERE j.suspended <> $2
       AND (NOT $2 OR j.state IN ('READY', 'RETRY_SCHEDULED', 'RUNNING'))
     ORDER BY j.id
       FOR UPDATE OF j
), marked AS (
    UPDATE extraction_jobs j
       SET suspended = $2
      FROM locked l
     WHERE j.id = l.id AND j.suspended <> $2
       AND (NOT $2 OR j.state IN ('READY', 'RETRY_SCHEDULED', 'RUNNING'))
    RETURNING j.id
)
SELECT b.id, (SELECT count(*) FROM marked)::int AS jobs,
       CASE WHEN NOT $2 THEN pg_notify('lading_jobs', b.pool) END IS NULL AS notified
  FROM batch b;

-- name: batch_exists
SELECT EXISTS (SELECT 1 FROM batches WHERE tenant = $1 AND idempotency_key = $2);

-- name: batch_accepted_event
-- One outbox event per accepted batch, and a wake-up for idle claimers of its pool; both
-- take effect at commit. Runs after the job rows are in, in the accepting transaction, so it
-- also registers the tenant's queue in the pool for fair claiming and, for a batch accepted
-- suspended, marks its jobs so they never enter the claim index (docs/fairness.md).
WITH event AS (
    INSERT INTO outbox_events (event_id, aggregate_type, aggregate_id, type, payload)
    VALUES (gen_random_uuid(), 'batch', $1, 'batch.accepted.v1', $2)
), queue AS (
    INSERT INTO tenant_queues (pool, tenant)
    SELECT b.pool, b.tenant FROM batches b WHERE b.id = $1
    ON CONFLICT DO NOTHING
), held AS (
    UPDATE extraction_jobs j
       SET suspended = true
      FROM batches b
     WHERE b.id = $1 AND b.suspended AND j.batch_id = b.id
)
SELECT pg_notify('lading_jobs', $3);

-- name: batch_job_id_array
-- The batch's job ids in batch order as ONE int8[] value: a million ids decode to a list of
-- ints without a Record per row.
SELECT coalesce(array_agg(id ORDER BY ordinal), '{}') AS ids FROM extraction_jobs WHERE batch_id = $1;
