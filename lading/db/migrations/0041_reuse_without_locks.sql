-- Result reuse resolved without advisory locks (docs/reuse.md). Migration 0029's
-- lading_reuse_resolve first took one transaction-level advisory lock per (tenant, key) of the
-- claimed jobs, in a statement of its own that joined every claimed job to its batch and tenant
-- and computed its key a first time: on the SUCCEEDED path, where every document is distinct and
-- no lock is ever contended, that statement was about a third of the database's work per job.
--
-- The locks are not needed when every mark is committed before any resolution reads the marks:
--
--   * a worker of this release marks a job in its claim (job_claim_batch), which commits before
--     the job's resolution begins;
--   * a job whose claim left it unmarked (a worker of a release before migration 0029) is marked
--     here and gives its claim back as if it waited ('wait', other_job: a copy running elsewhere or
--     the first copy in this batch, else the job itself): when it is claimed again its mark is
--     already committed. (A job that may not wait, its deadline too close, leads as before.)
--
-- Single flight then holds without any lock. Say jobs X and Y of one key, in two claimed batches,
-- both led. X's resolution did not see Y's mark: it read before Y's claim committed (a mark goes
-- only when its job waits, and a leader does not wait; a leader that finished successfully would
-- have been reused). So tX < sX < tY (t: the claim's commit; s: the resolution's snapshot, taken
-- after its own claim). Likewise tY < sY < tX: a contradiction. At most one of them leads.
-- What the locks added was only an order between two copies claimed in the same instant: without
-- them both may see the other and both wait (each given back for a jittered pause, doubling), where
-- before the second one checked led; never both lead.
--
-- The marks are written by a statement of their own, run only when a mark changes (a copy waits,
-- or a job came unmarked): an UPDATE runs the table's statement-level triggers even when it changes
-- no row, which cost the resolution of a batch of distinct documents more than its own lookups.
CREATE TYPE lading_reuse_decision AS (
    job_id bigint, decision text, other_job bigint, waits integer, result jsonb, validation jsonb,
    saved_cost numeric, saved_currency text,
    fence bigint, mark boolean, mark_key text  -- whether the job's mark changes, and to what
);

-- Same signature and rows as 0029's function, so a worker of an earlier release keeps working.
CREATE OR REPLACE FUNCTION lading_reuse_resolve(
    p_jobs bigint[], p_fences bigint[], p_worker text, p_model text, p_prompt_version text, p_judging text,
    p_wait_margin_s float8)
    RETURNS TABLE (job_id bigint, decision text, other_job bigint, waits integer, result jsonb, validation jsonb,
                   saved_cost numeric, saved_currency text)
    LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    decisions lading_reuse_decision[];
    any_mark  boolean;
BEGIN
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
        -- key running outside this batch (a leader), and the first of its marked copies in this batch.
        SELECT c.*, c.old_key IS NOT DISTINCT FROM c.key AS marked,
               src.id AS src_id, src.result AS src_result, src.validation AS src_validation,
               src.cost AS src_cost, src.cost_currency AS src_currency,
               CASE WHEN c.may_reuse AND src.id IS NULL AND c.may_wait THEN
                   (SELECT o.id FROM extraction_jobs o
                     WHERE o.tenant = c.tenant AND o.reuse_key = c.key
                       AND o.lease_until > clock_timestamp() AND o.id <> ALL (p_jobs)  -- running
                     LIMIT 1)
               END AS running_id,
               min(c.id) FILTER (WHERE c.may_reuse AND c.old_key IS NOT DISTINCT FROM c.key)
                   OVER (PARTITION BY c.tenant, c.key) AS first_copy
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
                    WHEN NOT l.marked THEN 'wait'  -- marked now, decided when claimed again
                    WHEN l.running_id IS NOT NULL THEN 'wait'
                    WHEN l.first_copy <> l.id THEN 'wait'
                    ELSE 'lead' END AS d
          FROM looked l
    ), out AS (
        SELECT d.id, d.d, d.fence, d.key, d.marked, d.old_key, d.src_id, d.src_result, d.src_validation, d.src_cost,
               d.src_currency, d.running_id, d.first_copy,
               -- A job that waits for a copy is no leader: its mark goes. A job that waits to be
               -- marked keeps the mark written here; any other job's mark is its key.
               CASE WHEN d.d = 'wait' AND d.marked THEN d.old_key IS NOT NULL ELSE NOT d.marked END AS mark
          FROM decided d
    )
    SELECT array_agg(ROW(
               o.id, o.d,
               CASE o.d WHEN 'reuse' THEN o.src_id
                        WHEN 'wait' THEN coalesce(o.running_id, CASE WHEN o.first_copy <> o.id THEN o.first_copy END,
                                                  o.id)
               END,
               CASE WHEN o.d = 'wait' THEN
                   (SELECT count(*)::integer FROM job_attempts a WHERE a.job_id = o.id AND a.outcome = 'deferred')
               END,
               CASE WHEN o.d = 'reuse' THEN o.src_result END,
               CASE WHEN o.d = 'reuse' THEN o.src_validation END,
               CASE WHEN o.d = 'reuse' THEN o.src_cost END,
               CASE WHEN o.d = 'reuse' THEN o.src_currency END,
               o.fence, o.mark, CASE WHEN o.d = 'wait' AND o.marked THEN NULL ELSE o.key END
           )::lading_reuse_decision ORDER BY o.id),
           coalesce(bool_or(o.mark), false)
      INTO decisions, any_mark
      FROM out o;

    IF any_mark THEN
        -- The rows in id order first (docs/architecture.md, "Lock order"), then the marks of the
        -- jobs still owned.
        PERFORM 1 FROM extraction_jobs j
          WHERE j.id IN (SELECT d.job_id FROM unnest(decisions) d WHERE d.mark)
          ORDER BY j.id
            FOR UPDATE;
        UPDATE extraction_jobs j
           SET reuse_key = d.mark_key
          FROM unnest(decisions) d
         WHERE d.mark AND j.id = d.job_id AND j.fence = d.fence AND j.worker_id = p_worker
           AND j.lease_until > clock_timestamp();
    END IF;

    RETURN QUERY
    SELECT d.job_id, d.decision, d.other_job, d.waits, d.result, d.validation, d.saved_cost, d.saved_currency
      FROM unnest(decisions) d;
END
$$;
