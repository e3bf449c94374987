-- Fair, prioritised claiming across tenants (docs/fairness.md tells the whole scheme).
--
-- A claim (named query job_claim_batch) first asks lading_claim_plan() which tenants to serve
-- and how many jobs each, then takes those jobs through a per-tenant index. The plan:
--   * weighted fair sharing by virtual time: each (pool, tenant) has a `vtime`; serving n jobs
--     adds n / weight; the tenant with the lowest vtime among those with eligible work goes
--     first. It lives in the database, so every worker replica shares it;
--   * per-tenant in-flight cap (tenants.max_in_flight), exact across replicas: a claim locks
--     the tenant's row and counts its RUNNING jobs in a statement that starts after the lock;
--   * per-tenant daily token budget (TenantQuota dailyTokenBudget): tokens are summed per
--     UTC day at finish (tenant_usage); a spent budget stops claims, never fails jobs;
--   * paused pools cost one row read; suspended batches' jobs leave the claim index.

-- The TenantQuota's daily token budget, read from the spec the operator mirrors.
ALTER TABLE tenants ADD COLUMN daily_token_budget bigint
    GENERATED ALWAYS AS ((spec ->> 'dailyTokenBudget')::bigint) STORED;

-- Jobs of a suspended batch carry the flag themselves, so the claim index leaves them out and
-- no claim ever reads them. lading.db.batches.set_suspended flips batch and jobs together.
ALTER TABLE extraction_jobs ADD COLUMN suspended boolean NOT NULL DEFAULT false;

-- Priority classes age: a job ranks by when it became due plus 300 s per class (high 0,
-- normal 1, low 2), so a low job due 10 minutes ago ranks with a high job due now and a
-- constant stream of high work cannot starve it. (lading.db.jobs.CLAIM_AGING_S says the same.)
-- Declared IMMUTABLE for the index: timestamptz + interval is only STABLE because adding days
-- or months depends on the time zone; adding a whole number of seconds does not.
CREATE FUNCTION lading_claim_rank(available_at timestamptz, priority smallint) RETURNS timestamptz
    LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT available_at + make_interval(secs => 300 * priority)
$$;

-- Priority classes are 0, 1 and 2 (accepting.PRIORITIES), so a due job ranks no later than
-- 600 s from now: a claim's index scan stops there instead of reading the jobs whose retries
-- are due much later. (NOT VALID: acceptance only ever wrote these three.)
ALTER TABLE extraction_jobs ADD CONSTRAINT priority_class CHECK (priority BETWEEN 0 AND 2) NOT VALID;

-- The claim's path to a tenant's next jobs, best rank first.
CREATE INDEX extraction_jobs_fair_claimable
    ON extraction_jobs (pool, tenant, lading_claim_rank(available_at, priority), id)
    WHERE state IN ('READY', 'RETRY_SCHEDULED') AND NOT suspended;
-- The in-flight count of a tenant, across pools: its RUNNING jobs.
CREATE INDEX extraction_jobs_running_by_tenant ON extraction_jobs (tenant) WHERE state = 'RUNNING';

-- Scheduling state, one row per (pool, tenant) that ever had a batch in the pool: acceptance
-- registers it (batch_accepted_event, in the accepting transaction), the claim updates it.
CREATE TABLE tenant_queues (
    pool        text             NOT NULL,
    tenant      text             NOT NULL,
    vtime       double precision NOT NULL DEFAULT 0,   -- jobs served / weight, see lading_claim_plan
    served      bigint           NOT NULL DEFAULT 0,   -- jobs ever claimed, for reporting
    served_at   timestamptz,
    PRIMARY KEY (pool, tenant)
);

-- Tokens (prompt + completion) per tenant per UTC day, added at every finish (job_finish_many).
CREATE TABLE tenant_usage (
    tenant  text    NOT NULL,
    day     date    NOT NULL,
    tokens  bigint  NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant, day)
);

INSERT INTO tenant_queues (pool, tenant)
SELECT DISTINCT pool, tenant FROM extraction_jobs ON CONFLICT DO NOTHING;
UPDATE extraction_jobs j SET suspended = true
  FROM batches b
 WHERE b.id = j.batch_id AND b.suspended AND j.state IN ('READY', 'RETRY_SCHEDULED', 'RUNNING');

-- Water-filling by virtual finish time: hand out `total` jobs one at a time, each to the
-- tenant whose next job would finish earliest in virtual time (vtime + (given + 1) / weight),
-- never beyond its cap. Over many claims this is weighted fair queueing; within one batch it
-- splits in proportion to the weights once the vtimes are level.
CREATE FUNCTION lading_fair_fill(vtimes double precision[], weights integer[], caps integer[], total integer)
    RETURNS integer[]
    LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    n       integer := coalesce(cardinality(vtimes), 0);
    given   integer[] := array_fill(0, ARRAY[greatest(n, 1)]);
    best    integer;
    tag     double precision;
    best_tag double precision;
    i       integer;
BEGIN
    IF n = 1 THEN
        RETURN ARRAY[least(total, caps[1])];
    END IF;
    FOR step IN 1..total LOOP
        best := NULL;
        FOR i IN 1..n LOOP
            CONTINUE WHEN given[i] >= caps[i];
            tag := vtimes[i] + (given[i] + 1)::double precision / weights[i];
            IF best IS NULL OR tag < best_tag THEN
                best := i;
                best_tag := tag;
            END IF;
        END LOOP;
        EXIT WHEN best IS NULL;
        given[best] := given[best] + 1;
    END LOOP;
    RETURN given[1:n];
END
$$;

-- The claim plan of pool p_pool for up to p_limit jobs: which tenants, how many each, and the
-- virtual time to charge from. A VOLATILE function, so each statement here reads a fresh
-- snapshot: the in-flight count taken after a tenant's lock sees every claim committed before.
--
--  1. Contenders: the pool's tenants within budget with a due job (one index probe each),
--     by vtime. A tenant back from idle has a stale, low vtime: it is lifted to one batch's
--     worth below the lowest other contender, so idleness banks no more credit than that.
--  2. A first water-fill says which tenants this batch would serve; their tenants rows are
--     locked (FOR NO KEY UPDATE, which batch inserts' key-share locks do not conflict with),
--     waiting for a concurrent claim that holds one: claims of one tenant are serialised
--     across replicas, which is what makes its vtime and cap exact. A tenant found at its cap
--     is replaced by the next contender that no other claim holds.
--  3. Under each lock: the fresh vtime and, for a capped tenant, its RUNNING count across
--     pools and replicas; the headroom bounds its share.
--  4. The batch is water-filled among the locked tenants within their headroom.
CREATE FUNCTION lading_claim_plan(p_pool text, p_limit integer)
    RETURNS TABLE (tenant text, take integer, vtime double precision, weight integer)
    LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    now_        timestamptz := clock_timestamp();
    today       date := (now_ AT TIME ZONE 'UTC')::date;
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
       AND (t.daily_token_budget IS NULL
            OR coalesce((SELECT u.tokens FROM tenant_usage u WHERE u.tenant = q.tenant AND u.day = today), 0)
               < t.daily_token_budget)
       AND EXISTS (SELECT 1 FROM extraction_jobs j
                    WHERE j.pool = p_pool AND j.tenant = q.tenant
                      AND j.state IN ('READY', 'RETRY_SCHEDULED') AND NOT j.suspended
                      AND lading_claim_rank(j.available_at, j.priority) <= now_ + interval '600 seconds'
                      AND j.available_at <= now_ AND j.deadline_at > now_ AND j.attempt < j.max_attempts);
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
    -- Pass 1 waits for the tenants the batch wants, in name order (one global order, so two
    -- claims never wait on each other in a cycle). Pass 2 replaces any found at their cap with
    -- the next contenders by vtime, never waiting (this claim holds locks by then).
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
            -- Read after the lock: the vtime and in-flight count every earlier claim left.
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
