-- name: batch_insert
-- Returns nothing when a batch with the same (tenant, idempotency key) exists: the caller
-- then compares request hashes. Concurrent inserts of the same key wait for each other.
INSERT INTO batches (tenant, namespace, name, uid, idempotency_key, request_hash, hash_version, schema,
                     pool, validation_policy, priority, deadline_s, endpoint, suspended, total_jobs, reuse)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)
ON CONFLICT (tenant, idempotency_key) DO NOTHING
RETURNING id, clock_timestamp() AS now;

-- name: batch_get_by_key
SELECT id, request_hash, hash_version, total_jobs FROM batches WHERE tenant = $1 AND idempotency_key = $2;

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

-- name: batch_cost_get
-- What batch $1's attempts cost, per currency (one row unless its pool's pricing was removed and
-- set again in another currency): its running sums (batch_costs, migration 0027), added in the
-- statements that add to its jobs' sums; no row for a batch nothing of which was priced.
SELECT currency, amount
  FROM batch_costs
 WHERE batch_id = $1
 ORDER BY currency;

-- name: batch_get_observed
-- One batch as the operator reports it, in one round trip: identity, per-state counts, the age
-- of the oldest job eligible to run now, and the latest finishing time. $1 tenant, $2 idempotency key.
SELECT b.id, b.total_jobs, b.created_at, b.suspended, b.endpoint,
       coalesce((SELECT jsonb_object_agg(c.state, c.n)
                   FROM (SELECT state, count(*) AS n FROM extraction_jobs WHERE batch_id = b.id GROUP BY state) c),
                '{}'::jsonb) AS counts,
       (SELECT extract(epoch FROM clock_timestamp() - min(j.available_at))::float8
          FROM extraction_jobs j
         WHERE j.batch_id = b.id AND {{job_eligible}}
       ) AS oldest_eligible_s,
       (SELECT max(j.finished_at) FROM extraction_jobs j WHERE j.batch_id = b.id) AS last_finished_at
  FROM batches b
 WHERE b.tenant = $1 AND b.idempotency_key = $2;

-- name: batch_tenant_by_key
-- The tenant a batch was accepted under, by its idempotency key alone (a deleted batch whose
-- namespace no quota covers any more).
SELECT tenant FROM batches WHERE idempotency_key = $1 ORDER BY id LIMIT 1;

-- name: batch_list_report
-- Batches in progress (a job not yet settled: waiting or running), oldest first, at most $1,
-- with per-state counts. The open set comes from the claimable and leases indexes; the counts
-- from the (batch_id, document_key) index, one batch at a time; the jobs that took an earlier
-- result (reused) from extraction_jobs_reused_by_batch (migration 0019).
WITH open AS (
    SELECT batch_id FROM extraction_jobs WHERE state IN ('READY', 'RETRY_SCHEDULED')
     UNION
    SELECT batch_id FROM extraction_jobs WHERE state = 'RUNNING'
), picked AS (
    SELECT b.id, b.tenant, b.namespace, b.name, b.pool, b.total_jobs, b.suspended, b.created_at
      FROM batches b
     WHERE b.id IN (SELECT batch_id FROM open)
     ORDER BY b.id
     LIMIT $1
)
SELECT p.id, p.tenant, p.namespace, p.name, p.pool, p.total_jobs, p.suspended, p.created_at,
       extract(epoch FROM now() - p.created_at)::float8 AS age_s, c.states, c.counts,
       (SELECT count(*)::int FROM extraction_jobs r WHERE r.batch_id = p.id AND r.reused_from IS NOT NULL) AS reused
  FROM picked p
 CROSS JOIN LATERAL (
       SELECT array_agg(s.state ORDER BY s.state) AS states, array_agg(s.n ORDER BY s.state) AS counts
         FROM (SELECT state, count(*)::int AS n FROM extraction_jobs WHERE batch_id = p.id GROUP BY state) s
       ) c
 ORDER BY p.id;

-- name: batch_open_rolling
-- Open a rolling batch for group $15 (open until now + $16 seconds) unless one is open already:
-- returns nothing then (batches_open_rolling decides; a concurrent opener waits for the first).
INSERT INTO batches (tenant, namespace, name, uid, idempotency_key, request_hash, hash_version, schema,
                     pool, validation_policy, priority, deadline_s, endpoint, suspended, total_jobs,
                     rolling_group, open_until)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16,
        clock_timestamp() + make_interval(secs => $17))
ON CONFLICT (rolling_group) WHERE open_until IS NOT NULL DO NOTHING
RETURNING id;

-- name: batch_lock_open_rolling
-- The open batch of rolling group $1, locked until the caller's transaction ends (appends to
-- one batch take turns), with whether it still takes documents and whether document key $2 is
-- in it already.
SELECT b.id, b.namespace, b.name, b.total_jobs, b.open_until > clock_timestamp() AS taking,
       EXISTS (SELECT 1 FROM extraction_jobs j WHERE j.batch_id = b.id AND j.document_key = $2) AS key_taken
  FROM batches b
 WHERE b.rolling_group = $1 AND b.open_until IS NOT NULL
   FOR UPDATE OF b;

-- name: batch_close_rolling
-- Batch $1 takes no more documents (the next one of its group opens a new batch).
UPDATE batches SET open_until = NULL WHERE id = $1 AND open_until IS NOT NULL;

-- fragment: batch_rolling_pick
-- An open batch of the rolling groups `wanted.groups` (the slots of one group; CTE `wanted`, with
-- `document_key`) that no other transaction holds, lowest id first, locked until the caller's
-- transaction ends (SKIP LOCKED: concurrent documents of one group append to different batches
-- instead of queuing on one row), with whether it still takes documents and whether
-- `wanted.document_key` is in it already. That look-up is a LATERAL join, not an EXISTS: a generic
-- plan made on a small extraction_jobs turned the EXISTS into one hashed scan of every job with that
-- key (the index's second column: a walk of the whole index, per group, growing with the table),
-- where a LATERAL keeps the look-up of (batch, key) in the index.
SELECT b.id, b.namespace, b.name, b.total_jobs, b.open_until > clock_timestamp() AS taking,
       t.taken IS NOT NULL AS key_taken
  FROM batches b
  LEFT JOIN LATERAL (SELECT true AS taken FROM extraction_jobs j
                      WHERE j.batch_id = b.id AND j.document_key = (SELECT w.document_key FROM wanted w)
                      LIMIT 1) t ON true
 WHERE b.rolling_group = ANY ((SELECT w.groups FROM wanted w)::text[]) AND b.open_until IS NOT NULL
 ORDER BY b.id
 LIMIT 1
   FOR UPDATE OF b SKIP LOCKED

-- name: batch_pick_open_rolling
-- batch_rolling_pick for the slots $1 and document key $2.
WITH wanted AS (SELECT $1::text[] AS groups, $2::text AS document_key)
SELECT * FROM {{batch_rolling_pick}} AS picked;
