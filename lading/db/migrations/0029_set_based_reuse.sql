-- Result reuse resolved for a whole claimed batch at once (docs/reuse.md). Migration 0019's
-- lading_reuse_resolve looped over the claimed jobs in PL/pgSQL: per job an advisory lock, up to
-- three index probes, and at the end a second write of every leading job's row to mark its key.
-- The same decisions now take three statements whatever the batch's size:
--
--   1. the advisory locks of the keys of every job that may reuse, in one statement, in lock-id
--      order (one global order, so two resolutions never wait on each other in a cycle);
--   2. one query, which reads a fresh snapshot taken after the locks (a VOLATILE PL/pgSQL function
--      under READ COMMITTED), decides every job: the newest accepted result of its key, another
--      job of its key running outside this batch, its duplicates inside this batch;
--   3. only when some job's mark must change, one update that locks those rows in id order.
--
-- The mark of a leading job is written by the claim itself (job_claim_batch sets reuse_key when
-- the worker passes its producer), in the row version the claim writes anyway; a job that waits
-- has its mark cleared in step 3 (nobody may wait for a waiting job). The single flight is as
-- exact as before: every resolution of a key holds the key's lock and reads after it, and a job's
-- mark is committed (by its claim, or by step 3 of its own resolution) before its resolution
-- releases the lock; so of two copies resolved one after the other, the second sees the first.
-- When the first waited for the second (claimed and marked, not yet resolved), its own mark is
-- gone when the second resolves, and the second leads.
--
-- The lookup of a running job of the same key reads an index of its own. Migration 0019's
-- (extraction_jobs_reuse_in_flight, WHERE state = 'RUNNING') lost to extraction_jobs_running_by_tenant
-- whenever the statistics said no job had a key yet (a freshly loaded backlog): the planner then
-- read every running job of the tenant per claimed job. "Running" is written as a lease here
-- (the CHECK running_has_lease makes a lease exist exactly while a job is RUNNING), which no index
-- on state can serve, so the probe reads this index by (tenant, key) whatever the statistics say.
DROP INDEX extraction_jobs_reuse_in_flight;
CREATE INDEX extraction_jobs_reuse_leading ON extraction_jobs (tenant, reuse_key)
    WHERE lease_until IS NOT NULL AND reuse_key IS NOT NULL;

-- Same signature, same rows as 0019's function: a worker of an earlier release, which claims
-- without marking, gets its marks written in step 3 under the locks, as 0019 wrote them.
CREATE OR REPLACE FUNCTION lading_reuse_resolve(
    p_jobs bigint[], p_fences bigint[], p_worker text, p_model text, p_prompt_version text, p_judging text,
    p_wait_margin_s float8)
    RETURNS TABLE (job_id bigint, decision text, other_job bigint, waits integer, result jsonb, validation jsonb,
                   saved_cost numeric, saved_currency text)
    LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
BEGIN
    -- 1. One lock per (tenant, key) of the jobs that may reuse, in lock-id order.
    PERFORM pg_advisory_xact_lock(l.lock_id)
       FROM (SELECT DISTINCT hashtextextended(j.tenant || E'\n' ||
                                              lading_reuse_key(j.content_sha256, j.schema, j.validation_policy,
                                                               p_model, p_prompt_version, p_judging), 0) AS lock_id
               FROM unnest(p_jobs, p_fences) AS i(id, fence)
               JOIN extraction_jobs j ON j.id = i.id AND j.fence = i.fence AND j.worker_id = p_worker
               JOIN batches b ON b.id = j.batch_id
               LEFT JOIN tenants t ON t.name = j.tenant
              WHERE b.reuse AND coalesce(t.spec ->> 'resultReuse', 'tenant') <> 'none'
              ORDER BY 1) l;

    -- 2. and 3. Every decision in one query, with a fresh snapshot taken after the locks.
    RETURN QUERY
    WITH c AS MATERIALIZED (
        -- The claimed jobs still owned, with their key and what they may do.
        SELECT j.id, j.fence, j.tenant, j.reuse_key AS old_key,
               lading_reuse_key(j.content_sha256, j.schema, j.validation_policy, p_model, p_prompt_version,
                                p_judging) AS key,
               (b.reuse AND coalesce(t.spec ->> 'resultReuse', 'tenant') <> 'none') AS may_reuse,
               j.deadline_at > clock_timestamp() + make_interval(secs => p_wait_margin_s) AS may_wait
          FROM unnest(p_jobs, p_fences) AS i(id, fence)
          JOIN extraction_jobs j ON j.id = i.id AND j.fence = i.fence AND j.worker_id = p_worker
                                AND j.lease_until > clock_timestamp()
          JOIN batches b ON b.id = j.batch_id
          LEFT JOIN tenants t ON t.name = j.tenant
    ), looked AS (
        -- For a job that may reuse: the newest accepted result of its key; else another job of its
        -- key running outside this batch (a leader), and the first of its copies in this batch.
        SELECT c.*, src.id AS src_id, src.result AS src_result, src.validation AS src_validation,
               src.cost AS src_cost, src.cost_currency AS src_currency,
               CASE WHEN c.may_reuse AND src.id IS NULL AND c.may_wait THEN
                   (SELECT o.id FROM extraction_jobs o
                     WHERE o.tenant = c.tenant AND o.reuse_key = c.key
                       AND o.lease_until > clock_timestamp() AND o.id <> ALL (p_jobs)  -- running
                     LIMIT 1)
               END AS running_id,
               min(c.id) FILTER (WHERE c.may_reuse) OVER (PARTITION BY c.tenant, c.key) AS first_copy
          FROM c
          LEFT JOIN LATERAL (
               SELECT s.id, res.result, res.validation, s.cost, s.cost_currency
                 FROM extraction_jobs s
                 JOIN results res ON res.job_id = s.id
                WHERE c.may_reuse AND s.tenant = c.tenant AND s.reuse_key = c.key AND s.state = 'SUCCEEDED'
                  AND res.result IS NOT NULL
                ORDER BY s.id DESC
                LIMIT 1
               ) src ON true
    ), decided AS (
        SELECT l.*,
               CASE WHEN NOT l.may_reuse THEN 'lead'
                    WHEN l.src_id IS NOT NULL THEN 'reuse'
                    WHEN NOT l.may_wait THEN 'lead'
                    WHEN l.running_id IS NOT NULL THEN 'wait'
                    WHEN l.first_copy <> l.id THEN 'wait'
                    ELSE 'lead' END AS d
          FROM looked l
    ), marks AS (
        -- A waiting job is no leader: its mark goes. Any other job's mark is its key (written by
        -- its claim unless the claim was made without one).
        SELECT d.id, d.fence, CASE WHEN d.d = 'wait' THEN NULL ELSE d.key END AS key
          FROM decided d
         WHERE CASE WHEN d.d = 'wait' THEN d.old_key IS NOT NULL ELSE d.old_key IS DISTINCT FROM d.key END
    ), locked AS (
        SELECT j.id FROM extraction_jobs j WHERE j.id IN (SELECT m.id FROM marks m) ORDER BY j.id FOR UPDATE
    ), marked AS (
        UPDATE extraction_jobs j
           SET reuse_key = m.key
          FROM marks m JOIN locked l ON l.id = m.id
         WHERE j.id = m.id AND j.fence = m.fence AND j.worker_id = p_worker AND j.lease_until > clock_timestamp()
    )
    SELECT d.id, d.d,
           CASE d.d WHEN 'reuse' THEN d.src_id WHEN 'wait' THEN coalesce(d.running_id, d.first_copy) END,
           CASE WHEN d.d = 'wait' THEN
               (SELECT count(*)::integer FROM job_attempts a WHERE a.job_id = d.id AND a.outcome = 'deferred')
           END,
           CASE WHEN d.d = 'reuse' THEN d.src_result END,
           CASE WHEN d.d = 'reuse' THEN d.src_validation END,
           CASE WHEN d.d = 'reuse' THEN d.src_cost END,
           CASE WHEN d.d = 'reuse' THEN d.src_currency END
      FROM decided d
     ORDER BY d.id;
END
$$;

-- The outbox and delivery triggers of every job update (migrations 0001 and 0006) compared the
-- statement's old and new rows with a join the planner could only guess at: a transition table
-- has no statistics, so it planned one row a side and nested loops, which cost n² comparisons (a
-- group commit of 200 jobs: 40,000, most of the commit's time). The same rows now come from one
-- scan of the new rows and a hashed lookup in the old ones, whatever their number.
CREATE OR REPLACE FUNCTION lading_jobs_outbox_on_update() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO outbox_events (event_id, aggregate_type, aggregate_id, type, payload)
    SELECT gen_random_uuid(), 'job', n.id, lading_job_event_type(n.state),
           jsonb_build_object('job_id', n.id, 'tenant', n.tenant, 'batch_id', n.batch_id,
                              'document_key', n.document_key, 'state', n.state, 'fence', n.fence,
                              'attempt', n.attempt, 'error_class', n.last_error_class)
      FROM after_rows n
     WHERE n.state IN ('SUCCEEDED', 'REVIEW_REQUIRED', 'FAILED_TERMINAL', 'CANCELLED')
       AND (n.id, n.state) NOT IN (SELECT o.id, o.state FROM before_rows o);  -- the state changed
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION lading_jobs_deliveries_on_update() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM after_rows WHERE state = 'SUCCEEDED') THEN
        RETURN NULL;
    END IF;
    INSERT INTO deliveries (job_id, endpoint)
    SELECT n.id, b.endpoint
      FROM after_rows n
      JOIN batches b ON b.id = n.batch_id
     WHERE n.state = 'SUCCEEDED' AND b.endpoint IS NOT NULL
       AND n.id NOT IN (SELECT o.id FROM before_rows o WHERE o.state = 'SUCCEEDED')  -- newly succeeded
        ON CONFLICT (job_id, endpoint) DO NOTHING;
    RETURN NULL;
END
$$;
