-- Cheaper claims and group commits (the SUCCEEDED path's database work per job): the claim plan
-- reads the claim index whatever the statistics say and is not planned again at every claim (1),
-- one trigger does the work of the three that read every update's transition tables (2), a claim
-- writes one index entry fewer (3), and the budget check is planned once per session (4).
-- (The group commit's own change is in lading/db/sql/jobs.sql: job_finish_many's `closed`.)
--
-- 1. lading_claim_plan asked whether a tenant has an eligible job with EXISTS. On statistics taken
-- while the backlog was all READY (a freshly loaded pool) the planner expected hundreds of
-- matches and read the table from its first page until one turned up: every job claimed and
-- finished since lies before it, so each claim read all of them (334 pages at 8,000 jobs done,
-- about 1 ms a claim, growing with the table). The probe now asks for the tenant's first job in
-- the claim index's order (rank, id), LIMIT 1: no plan but the index's can return it without
-- reading and sorting every match, so it is the plan whatever the statistics.
--
-- The function's statements are planned as PostgreSQL plans them by default (plan_cache_mode auto:
-- five custom plans, then one generic plan kept when it costs no more), whatever the session's
-- setting. A worker's connections force a custom plan for every statement (lading.db.pool,
-- CUSTOM_PLANS), and those of a plpgsql function take the setting too: each claim planned each of
-- the plan's statements again, the contenders' query (with its inlined eligibility and rank) the
-- dearest, about 0.3 ms a claim. Every one of them reads by index under any plan (the probe above;
-- tests/integration/fairness/test_claim_plan_at_scale.py runs them past their custom plans).
DO $$
BEGIN
    IF (SELECT md5(prosrc) FROM pg_proc WHERE proname = 'lading_claim_plan') <> 'cdf1a63298a916d8a0e131097b3217a5' THEN
        RAISE EXCEPTION 'migration 0049 redefines lading_claim_plan as migration 0024 left it, but it has changed since';
    END IF;
END
$$;
CREATE OR REPLACE FUNCTION lading_claim_plan(p_pool text, p_limit integer)
    RETURNS TABLE (tenant text, take integer, vtime double precision, weight integer)
    LANGUAGE plpgsql VOLATILE ROWS 1 SET plan_cache_mode = auto AS $$
DECLARE
    now_        timestamptz := clock_timestamp();
    names       text[];
    weights     integer[];
    caps        integer[];
    vtimes      double precision[];
    n           integer;
    i           integer;
    k           integer;
    pass        integer;
    want        integer := 0;
    alloc       integer[];
    unbounded   integer[];
    running     bigint;
    lowest      double precision;
    second      double precision;
    fresh       double precision;
    l_i         integer[] := '{}';
    l_vt        double precision[] := '{}';
    l_w         integer[] := '{}';
    l_room      integer[] := '{}';
    tried       boolean[];
BEGIN
    IF p_limit <= 0 OR EXISTS (SELECT 1 FROM pools p
                                WHERE p.name = p_pool AND (p.paused OR p.paused_until > now_)) THEN
        RETURN;
    END IF;
    SELECT array_agg(q.tenant ORDER BY q.vtime, q.tenant), array_agg(t.weight ORDER BY q.vtime, q.tenant),
           array_agg(t.max_in_flight ORDER BY q.vtime, q.tenant), array_agg(q.vtime ORDER BY q.vtime, q.tenant)
      INTO names, weights, caps, vtimes
      FROM tenant_queues q
      JOIN tenants t ON t.name = q.tenant
     WHERE q.pool = p_pool
       AND (t.max_in_flight IS NULL OR t.max_in_flight > 0)
       AND lading_tenant_budget_left(q.tenant, now_)
       AND (SELECT j.id FROM extraction_jobs j
             WHERE j.pool = p_pool AND j.tenant = q.tenant
               AND lading_job_eligible(j.state, j.suspended, j.available_at, j.deadline_at,
                                       j.attempt, j.max_attempts)
               AND lading_claim_rank(j.available_at, j.priority) <= now_ + interval '600 seconds'
             ORDER BY lading_claim_rank(j.available_at, j.priority), j.id
             LIMIT 1) IS NOT NULL;
    n := coalesce(cardinality(names), 0);
    IF n = 0 THEN
        RETURN;
    END IF;
    lowest := vtimes[1];
    second := vtimes[2];
    FOR i IN 1..n LOOP
        vtimes[i] := greatest(vtimes[i], CASE WHEN i = 1 THEN second ELSE lowest END
                                         - p_limit::double precision / weights[i]);
    END LOOP;
    unbounded := array_fill(p_limit, ARRAY[n]);
    alloc := lading_fair_fill(vtimes, weights, unbounded, p_limit);
    FOR i IN 1..n LOOP
        IF alloc[i] > 0 THEN
            want := want + 1;
        END IF;
    END LOOP;
    tried := array_fill(false, ARRAY[n]);
    FOR pass IN 1..2 LOOP
        FOR i IN SELECT o.i FROM unnest(names, alloc) WITH ORDINALITY AS o(name, a, i)
                  WHERE pass = 2 OR o.a > 0
                  ORDER BY CASE WHEN pass = 1 THEN o.name END, o.i LOOP
            EXIT WHEN cardinality(l_i) >= want;
            CONTINUE WHEN tried[i];
            IF pass = 1 THEN
                PERFORM 1 FROM tenants t WHERE t.name = names[i] FOR NO KEY UPDATE;
            ELSE
                PERFORM 1 FROM tenants t WHERE t.name = names[i] FOR NO KEY UPDATE SKIP LOCKED;
                CONTINUE WHEN NOT FOUND;
            END IF;
            tried[i] := true;
            SELECT q.vtime INTO fresh FROM tenant_queues q WHERE q.pool = p_pool AND q.tenant = names[i];
            k := p_limit;
            IF caps[i] IS NOT NULL THEN
                SELECT count(*) INTO running FROM extraction_jobs j
                 WHERE j.tenant = names[i] AND j.state = 'RUNNING';
                k := least(p_limit, greatest(0, caps[i] - running::integer));
            END IF;
            CONTINUE WHEN k = 0;
            l_i := l_i || i;
            l_vt := l_vt || greatest(fresh, vtimes[i]);
            l_w := l_w || weights[i];
            l_room := l_room || k;
        END LOOP;
    END LOOP;
    IF cardinality(l_i) = 0 THEN
        RETURN;
    END IF;
    alloc := lading_fair_fill(l_vt, l_w, l_room, p_limit);
    FOR k IN 1..cardinality(l_i) LOOP
        CONTINUE WHEN alloc[k] = 0;
        tenant := names[l_i[k]];
        take := alloc[k];
        vtime := l_vt[k];
        weight := l_w[k];
        RETURN NEXT;
    END LOOP;
END
$$;

-- 2. Every update of extraction_jobs fired three statement triggers, each reading the statement's
-- transition tables on its own: the outbox event of a job that settled (migrations 0001, 0029),
-- the deliveries of a job that succeeded (0006, 0029) and the tenants' queue counters (0025). A
-- claim, which concerns none of them, paid for three trigger calls and four scans of its rows; a
-- group commit for four scans before the work. One trigger now reads the new rows once to learn
-- which of the three have work, then does exactly what the three did, in the order they fired
-- (by name: deliveries, outbox, counters).
CREATE FUNCTION lading_jobs_on_update() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    any_settled boolean;
    any_succeeded boolean;
    counted_after_all boolean;
    counted_after_none boolean;
    counted_before_all boolean;
    counted_before_none boolean;
    changed text[];
BEGIN
    SELECT coalesce(bool_or(state IN ('SUCCEEDED', 'REVIEW_REQUIRED', 'FAILED_TERMINAL', 'CANCELLED')), false),
           coalesce(bool_or(state = 'SUCCEEDED'), false),
           coalesce(bool_and(lading_queued_state(state)), true),
           NOT coalesce(bool_or(lading_queued_state(state)), false)
      INTO any_settled, any_succeeded, counted_after_all, counted_after_none
      FROM lading_new_jobs;

    -- The deliveries of each newly succeeded job of a batch with an endpoint.
    IF any_succeeded THEN
        INSERT INTO deliveries (job_id, endpoint)
        SELECT n.id, b.endpoint
          FROM lading_new_jobs n
          JOIN batches b ON b.id = n.batch_id
         WHERE n.state = 'SUCCEEDED' AND b.endpoint IS NOT NULL
           AND n.id NOT IN (SELECT o.id FROM lading_old_jobs o WHERE o.state = 'SUCCEEDED')  -- newly succeeded
            ON CONFLICT (job_id, endpoint) DO NOTHING;
    END IF;

    -- The outbox event of each job whose state changed to a settled one.
    IF any_settled THEN
        INSERT INTO outbox_events (event_id, aggregate_type, aggregate_id, type, payload)
        SELECT gen_random_uuid(), 'job', n.id, lading_job_event_type(n.state),
               jsonb_build_object('job_id', n.id, 'tenant', n.tenant, 'batch_id', n.batch_id,
                                  'document_key', n.document_key, 'state', n.state, 'fence', n.fence,
                                  'attempt', n.attempt, 'error_class', n.last_error_class)
          FROM lading_new_jobs n
         WHERE n.state IN ('SUCCEEDED', 'REVIEW_REQUIRED', 'FAILED_TERMINAL', 'CANCELLED')
           AND (n.id, n.state) NOT IN (SELECT o.id, o.state FROM lading_old_jobs o);  -- the state changed
    END IF;

    -- The queue counters (lading_tenant_queued_jobs_updated, migration 0025): most updates move no
    -- job in or out of the counted states (a claim, a lease's renewal), a worker's commit moves
    -- every job out.
    IF counted_after_all OR counted_after_none THEN
        SELECT coalesce(bool_and(lading_queued_state(state)), true),
               NOT coalesce(bool_or(lading_queued_state(state)), false)
          INTO counted_before_all, counted_before_none FROM lading_old_jobs;
        IF (counted_before_all AND counted_after_all) OR (counted_before_none AND counted_after_none) THEN
            RETURN NULL;
        END IF;
    END IF;
    IF counted_before_all AND counted_after_none THEN
        WITH added AS (
            INSERT INTO tenant_queued (tenant, jobs, bytes)
            SELECT n.tenant, -count(*), -coalesce(sum((SELECT d.bytes FROM job_documents d WHERE d.job_id = n.id)), 0)
              FROM lading_new_jobs n
             GROUP BY n.tenant
            RETURNING tenant
        )
        SELECT array_agg(tenant) INTO changed FROM added;
    ELSE
        WITH added AS (
            INSERT INTO tenant_queued (tenant, jobs, bytes)
            SELECT n.tenant, sum(CASE WHEN lading_queued_state(n.state) THEN 1 ELSE -1 END),
                   coalesce(sum((CASE WHEN lading_queued_state(n.state) THEN 1 ELSE -1 END)
                                * (SELECT d.bytes FROM job_documents d WHERE d.job_id = n.id)), 0)
              FROM lading_new_jobs n
              JOIN lading_old_jobs o ON o.id = n.id
             WHERE lading_queued_state(n.state) <> lading_queued_state(o.state)
             GROUP BY n.tenant
            RETURNING tenant
        )
        SELECT array_agg(tenant) INTO changed FROM added;
    END IF;
    PERFORM lading_tenant_queued_fold(changed);
    RETURN NULL;
END $$;

DROP TRIGGER extraction_jobs_deliveries_update ON extraction_jobs;
DROP TRIGGER extraction_jobs_outbox_update ON extraction_jobs;
DROP TRIGGER tenant_queued_jobs_updated ON extraction_jobs;
DROP FUNCTION lading_jobs_deliveries_on_update();
DROP FUNCTION lading_jobs_outbox_on_update();
DROP FUNCTION lading_tenant_queued_jobs_updated();
CREATE TRIGGER extraction_jobs_updated AFTER UPDATE ON extraction_jobs
    REFERENCING OLD TABLE AS lading_old_jobs NEW TABLE AS lading_new_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION lading_jobs_on_update();

-- 3. A claim wrote each job's new version into two partial indexes of running jobs: its tenant
-- (extraction_jobs_running_by_tenant, migration 0010: the claim plan counts a capped tenant's
-- running jobs, the pool reports too) and its tenant and result-reuse key
-- (extraction_jobs_reuse_leading, migration 0029: lading_reuse_resolve looks for a running copy).
-- One index keyed (tenant, reuse_key) on running jobs serves both: the count reads its first
-- column, the copy's lookup both. The lookup says "running" by state as well as by lease (the
-- CHECK running_has_lease makes them the same jobs), so that the index's predicate is proven; it
-- is the only index on running jobs led by the tenant, so no other can win on statistics that say
-- no job has a key yet (what 0029's index was for). A claim writes one index entry fewer per job.
DROP INDEX extraction_jobs_reuse_leading;
DROP INDEX extraction_jobs_running_by_tenant;
CREATE INDEX extraction_jobs_running_by_tenant ON extraction_jobs (tenant, reuse_key) WHERE state = 'RUNNING';

-- lading_reuse_resolve as migration 0041 left it, its lookup of a running copy saying state = 'RUNNING'.
DO $$
BEGIN
    IF (SELECT md5(prosrc) FROM pg_proc WHERE proname = 'lading_reuse_resolve') <> 'e489a0014570df03fe7936bae43764b0' THEN
        RAISE EXCEPTION 'migration 0049 redefines lading_reuse_resolve as migration 0041 left it, but it has changed since';
    END IF;
END
$$;
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
                       AND o.state = 'RUNNING'  -- the index's predicate (extraction_jobs_running_by_tenant)
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


-- 4. lading_tenant_budget_left (migration 0018), which the claim plan asks for every contender,
-- was a LANGUAGE sql function that cannot be inlined (it reads tenants): PostgreSQL parses,
-- analyzes and plans the body of such a function again at every execution of the statement that
-- calls it, about 0.25 ms a claim. The same statement in plpgsql is planned once per session.
-- NULL for an unknown tenant, as before (no row).
CREATE OR REPLACE FUNCTION lading_tenant_budget_left(p_tenant text, p_at timestamptz) RETURNS boolean
    LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (
        SELECT (t.daily_token_budget IS NULL
                OR coalesce((SELECT u.tokens FROM tenant_usage u
                              WHERE u.tenant = t.name AND u.day = (p_at AT TIME ZONE 'UTC')::date), 0)
                   < t.daily_token_budget)
           AND (t.budget_currency IS NULL
                OR (SELECT (t.budget_daily IS NULL OR s.today < t.budget_daily)
                       AND (t.budget_monthly IS NULL OR s.month < t.budget_monthly)
                      FROM lading_tenant_spend(t.name, t.budget_currency, p_at) s))
          FROM tenants t
         WHERE t.name = p_tenant);
END $$;
