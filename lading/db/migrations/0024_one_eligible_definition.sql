-- One definition of an eligible job (a job a claim could take now), in the database, used by
-- every reader: the `job_eligible` fragment (lading/db/sql/jobs.sql) is a call of
-- lading_job_eligible, and the claim plan's contenders' probe calls it too, where migrations 0010
-- and 0018 wrote the condition out a second time.
--
-- A LANGUAGE sql function whose body is one expression is inlined by the planner into the query
-- that calls it (it is not STRICT, not SECURITY DEFINER, has no SET clause, and its arguments are
-- plain columns), so a query reads `state IN ('READY', 'RETRY_SCHEDULED') AND NOT suspended AND
-- ...` as if written out: the claim index's predicate (extraction_jobs_fair_claimable) is still
-- matched, and plans are those of the text written out. It is VOLATILE because it reads
-- clock_timestamp(), the database clock when the row is read, as every lease decision does (a
-- volatile SQL function is inlined all the same). tests/integration/test_eligible_definition.py
-- checks the inlining, that no function of the schema restates the condition, and that the plan
-- and the fragment's readers agree job by job.

CREATE FUNCTION lading_job_eligible(state text, suspended boolean, available_at timestamptz,
                                    deadline_at timestamptz, attempt integer, max_attempts integer)
    RETURNS boolean LANGUAGE sql VOLATILE PARALLEL SAFE AS $$
    SELECT state IN ('READY', 'RETRY_SCHEDULED') AND NOT suspended
       AND available_at <= clock_timestamp() AND deadline_at > clock_timestamp() AND attempt < max_attempts
$$;

-- The claim plan as migration 0018 left it, its contenders' probe now calling lading_job_eligible.
-- (The probe read "now" once per plan before; it reads the clock per row now, as the claim's own
-- statement always has.) Refused if the plan is no longer 0018's: a later migration that changed
-- it must be merged here rather than silently replaced.
DO $$
BEGIN
    IF (SELECT md5(prosrc) FROM pg_proc WHERE proname = 'lading_claim_plan') <> 'e369f5f9abcc780d094c43a6e96564a0' THEN
        RAISE EXCEPTION 'migration 0024 redefines lading_claim_plan as migration 0018 left it, but it has changed since';
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION lading_claim_plan(p_pool text, p_limit integer)
    RETURNS TABLE (tenant text, take integer, vtime double precision, weight integer)
    LANGUAGE plpgsql VOLATILE AS $$
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
       AND EXISTS (SELECT 1 FROM extraction_jobs j
                    WHERE j.pool = p_pool AND j.tenant = q.tenant
                      AND lading_job_eligible(j.state, j.suspended, j.available_at, j.deadline_at,
                                              j.attempt, j.max_attempts)
                      AND lading_claim_rank(j.available_at, j.priority) <= now_ + interval '600 seconds');
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
