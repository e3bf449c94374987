-- Result reuse by content digest (docs/reuse.md): a job whose document, extraction schema, model,
-- prompt version and validation policy match an accepted result of its tenant takes that result
-- instead of calling the model, and two such jobs in flight at once make one model call.
--
--   extraction_jobs.reuse_key    the digest of what decides a result (lading_reuse_key), written
--                                by the worker when it starts an attempt that calls the model (the
--                                job then leads: duplicates wait for it) or takes a result. A
--                                SUCCEEDED job with a key (the worker's success, a reviewer's
--                                approval or correction) is a result later jobs may take.
--   extraction_jobs.reused_from  the job whose result this one took (set with SUCCEEDED only).
--   batches.reuse                ExtractionBatch spec.reuse: false opts the batch's jobs out of
--                                taking results and of waiting for duplicates.
--
-- The worker asks lading_reuse_resolve() for each claimed batch of jobs; the state changes it
-- leads to are ordinary finishes in sql/jobs.sql (job_finish_reused_many, and a given-back retry
-- of outcome `deferred` for a job waiting on its duplicate).

ALTER TABLE extraction_jobs
    ADD COLUMN reuse_key   text,
    ADD COLUMN reused_from bigint,   -- no FK: see the note on foreign keys in 0001
    ADD CONSTRAINT reused_only_when_succeeded CHECK (reused_from IS NULL OR state = 'SUCCEEDED') NOT VALID;

ALTER TABLE batches ADD COLUMN reuse boolean NOT NULL DEFAULT true;

-- Two more attempt outcomes: `reused` (the result was taken from reused_from: no model call, no
-- tokens) and `deferred` (a duplicate was being extracted: the claim was given back unstarted,
-- not counted against maxAttempts). NOT VALID: every existing row satisfies the old, narrower list.
ALTER TABLE job_attempts DROP CONSTRAINT job_attempts_outcome_check;
ALTER TABLE job_attempts ADD CONSTRAINT job_attempts_outcome_check CHECK (outcome IN (
    'ok', 'transient', 'timeout-ambiguous', 'invalid-output', 'validation-failed', 'terminal', 'lease-expired',
    'stale', 'cancelled', 'reused', 'deferred')) NOT VALID;

-- The lookup of a tenant's accepted results of one key, newest first.
CREATE INDEX extraction_jobs_reusable ON extraction_jobs (tenant, reuse_key, id)
    WHERE state = 'SUCCEEDED' AND reuse_key IS NOT NULL;
-- A batch's reused jobs, counted for its status (only reused jobs are in it).
CREATE INDEX extraction_jobs_reused_by_batch ON extraction_jobs (batch_id) WHERE reused_from IS NOT NULL;
-- The lookup of a running job of the same key (single flight).
CREATE INDEX extraction_jobs_reuse_in_flight ON extraction_jobs (tenant, reuse_key)
    WHERE state = 'RUNNING' AND reuse_key IS NOT NULL;

-- THE definition of "the same result": the document's SHA-256, the extraction schema, the
-- validation policy, the model, the prompt version and the pool's settings that change a verdict
-- (the last three say what the worker calls and how it judges: lading.reuse.Producer). Canonical
-- JSON, so no choice of values can make two different tuples collide. The tenant is not in it: it
-- is compared as a column, and reuse never crosses tenants.
CREATE FUNCTION lading_reuse_key(
    p_content_sha256 text, p_schema text, p_validation_policy text, p_model text, p_prompt_version text,
    p_judging text)
    RETURNS text
    LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT encode(sha256(convert_to(
        jsonb_build_array(1, p_content_sha256, p_schema, p_validation_policy, p_model, p_prompt_version,
                          p_judging)::text,
        'UTF8')), 'hex')
$$;

-- What each of the jobs (p_jobs, p_fences) that worker p_worker just claimed does, given that the
-- worker calls model p_model with prompt version p_prompt_version and judges with p_judging:
--
--   reuse  an accepted result of the same tenant and key exists (the newest is taken: other_job,
--          result, validation, and what that job cost, for the cost-saved metric);
--   wait   no such result, but another job of the same tenant and key is running (other_job)
--          and this one's deadline is more than p_wait_margin_s away: it gives its claim back
--          and is tried again shortly (waits: how often it already did);
--   lead   anything else: it calls the model, and its key is written so that duplicates wait.
--
-- A job of a batch with reuse = false, or of a tenant whose TenantQuota says resultReuse: none,
-- always leads (and a later job may still take its result). Jobs no longer owned are left out.
--
-- Single flight needs the check and the mark to be one step per key across every worker: each
-- key's transaction-level advisory lock is taken first, in lock-id order (one global order, so
-- two resolutions never wait on each other in a cycle), and each statement after it reads a
-- fresh snapshot (a VOLATILE plpgsql function under READ COMMITTED), so it sees the marks every
-- earlier holder committed. The marks are written at the end, in one statement that locks the
-- job rows in id order (docs/architecture.md, "Lock order"); duplicates within one call are
-- recognised in memory.
CREATE FUNCTION lading_reuse_resolve(
    p_jobs bigint[], p_fences bigint[], p_worker text, p_model text, p_prompt_version text, p_judging text,
    p_wait_margin_s float8)
    RETURNS TABLE (job_id bigint, decision text, other_job bigint, waits integer, result jsonb, validation jsonb,
                   saved_cost numeric, saved_currency text)
    LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    r           record;
    src         record;
    leader      bigint;
    mark_ids    bigint[] := '{}';
    mark_fences bigint[] := '{}';
    mark_keys   text[] := '{}';
    lead_keys   text[] := '{}';
    lead_ids    bigint[] := '{}';
    pos         integer;
BEGIN
    FOR r IN
        SELECT c.*
          FROM (SELECT j.id, j.fence, j.tenant, j.reuse_key AS old_key,
                       lading_reuse_key(j.content_sha256, j.schema, j.validation_policy, p_model, p_prompt_version,
                                        p_judging) AS key,
                       (b.reuse AND coalesce(t.spec ->> 'resultReuse', 'tenant') <> 'none') AS may_reuse,
                       j.deadline_at > clock_timestamp() + make_interval(secs => p_wait_margin_s) AS may_wait
                  FROM unnest(p_jobs, p_fences) AS i(id, fence)
                  JOIN extraction_jobs j ON j.id = i.id AND j.fence = i.fence AND j.worker_id = p_worker
                                        AND j.lease_until > clock_timestamp()
                  JOIN batches b ON b.id = j.batch_id
                  LEFT JOIN tenants t ON t.name = j.tenant) c
         ORDER BY hashtextextended(c.tenant || E'\n' || c.key, 0), c.id
    LOOP
        PERFORM pg_advisory_xact_lock(hashtextextended(r.tenant || E'\n' || r.key, 0));
        job_id := r.id;
        other_job := NULL; waits := NULL; result := NULL; validation := NULL;
        saved_cost := NULL; saved_currency := NULL;
        IF r.may_reuse THEN
            SELECT s.id, res.result, res.validation,
                   (to_jsonb(s) ->> 'cost')::numeric AS cost, to_jsonb(s) ->> 'cost_currency' AS currency
              INTO src
              FROM extraction_jobs s
              JOIN results res ON res.job_id = s.id
             WHERE s.tenant = r.tenant AND s.reuse_key = r.key AND s.state = 'SUCCEEDED'
               AND res.result IS NOT NULL
             ORDER BY s.id DESC
             LIMIT 1;
            IF FOUND THEN
                decision := 'reuse';
                other_job := src.id;
                result := src.result;
                validation := src.validation;
                saved_cost := src.cost;
                saved_currency := src.currency;
                IF r.old_key IS DISTINCT FROM r.key THEN
                    mark_ids := array_append(mark_ids, r.id);
                    mark_fences := array_append(mark_fences, r.fence);
                    mark_keys := array_append(mark_keys, r.key);
                END IF;
                RETURN NEXT;
                CONTINUE;
            END IF;
            IF r.may_wait THEN
                pos := array_position(lead_keys, r.tenant || E'\n' || r.key);
                IF pos IS NOT NULL THEN
                    leader := lead_ids[pos];
                ELSE
                    SELECT o.id INTO leader
                      FROM extraction_jobs o
                     WHERE o.tenant = r.tenant AND o.reuse_key = r.key AND o.state = 'RUNNING'
                       AND o.id <> r.id AND o.lease_until > clock_timestamp()
                     LIMIT 1;
                END IF;
                IF leader IS NOT NULL THEN
                    decision := 'wait';
                    other_job := leader;
                    SELECT count(*)::integer INTO waits
                      FROM job_attempts a WHERE a.job_id = r.id AND a.outcome = 'deferred';
                    IF r.old_key IS NOT NULL THEN
                        -- A waiting job is no leader: nobody may wait for it.
                        mark_ids := array_append(mark_ids, r.id);
                        mark_fences := array_append(mark_fences, r.fence);
                        mark_keys := array_append(mark_keys, NULL::text);
                    END IF;
                    leader := NULL;
                    RETURN NEXT;
                    CONTINUE;
                END IF;
            END IF;
        END IF;
        decision := 'lead';
        lead_keys := array_append(lead_keys, r.tenant || E'\n' || r.key);
        lead_ids := array_append(lead_ids, r.id);
        IF r.old_key IS DISTINCT FROM r.key THEN
            mark_ids := array_append(mark_ids, r.id);
            mark_fences := array_append(mark_fences, r.fence);
            mark_keys := array_append(mark_keys, r.key);
        END IF;
        RETURN NEXT;
    END LOOP;
    IF cardinality(mark_ids) > 0 THEN
        WITH m AS (
            SELECT * FROM unnest(mark_ids, mark_fences, mark_keys) AS m(id, fence, key)
        ), locked AS (
            SELECT j.id FROM extraction_jobs j WHERE j.id = ANY (mark_ids) ORDER BY j.id FOR UPDATE
        )
        UPDATE extraction_jobs j
           SET reuse_key = m.key
          FROM m JOIN locked l ON l.id = m.id
         WHERE j.id = m.id AND j.fence = m.fence AND j.worker_id = p_worker AND j.lease_until > clock_timestamp();
    END IF;
END
$$;
