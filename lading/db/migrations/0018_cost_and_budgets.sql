-- Cost per attempt, job, batch and tenant, and money budgets (docs/cost.md).
--
--   * every finished attempt records what it cost (job_attempts.cost, exact numeric, with its
--     currency), priced by the worker from its pool's spec.pricing; a job sums its attempts
--     (extraction_jobs.cost), a batch sums its jobs, a tenant's spend is kept per currency and
--     UTC day (tenant_spend), stale attempts included: their calls were paid for;
--   * TenantQuota spec.budget {currency, monthly, daily}: a tenant whose spend in the budget's
--     currency reached the calendar month's (or the UTC day's) amount is no longer a contender of
--     the claim plan: its jobs wait, never fail, until the month (day) ends or the budget rises.
--     lading_tenant_budget_left() is the one definition of "may still spend", with the daily
--     token budget of migration 0010, and the claim plan asks it for every contender.

ALTER TABLE job_attempts
    ADD COLUMN cost          numeric,
    ADD COLUMN cost_currency text,
    ADD CONSTRAINT attempt_cost_has_currency CHECK ((cost IS NULL) = (cost_currency IS NULL)),
    ADD CONSTRAINT attempt_cost_not_negative CHECK (cost >= 0);

-- The sum of the job's priced attempts, in the currency of its first one (a pool's currency does
-- not change under a job: lading.applying refuses to change a priced pool's currency).
ALTER TABLE extraction_jobs
    ADD COLUMN cost          numeric,
    ADD COLUMN cost_currency text,
    ADD CONSTRAINT job_cost_has_currency CHECK ((cost IS NULL) = (cost_currency IS NULL));

-- What a tenant spent, per currency and UTC day, added at every finish (job_finish_many) like
-- tenant_usage's tokens. A month's spend is the sum of at most 31 rows of the primary key.
CREATE TABLE tenant_spend (
    tenant    text    NOT NULL,
    currency  text    NOT NULL,
    day       date    NOT NULL,
    amount    numeric NOT NULL DEFAULT 0 CHECK (amount >= 0),
    PRIMARY KEY (tenant, currency, day)
);

-- The TenantQuota's money budget, read from the spec the operator mirrors (validated decimal
-- strings, lading.models.specs.MoneyBudget).
ALTER TABLE tenants
    ADD COLUMN budget_currency text GENERATED ALWAYS AS (spec -> 'budget' ->> 'currency') STORED,
    ADD COLUMN budget_monthly  numeric GENERATED ALWAYS AS ((spec -> 'budget' ->> 'monthly')::numeric) STORED,
    ADD COLUMN budget_daily    numeric GENERATED ALWAYS AS ((spec -> 'budget' ->> 'daily')::numeric) STORED;

-- What tenant p_tenant spent in p_currency on the UTC day of p_at and in its calendar month.
CREATE FUNCTION lading_tenant_spend(p_tenant text, p_currency text, p_at timestamptz)
    RETURNS TABLE (today numeric, month numeric)
    LANGUAGE sql STABLE AS $$
    SELECT coalesce(sum(s.amount) FILTER (WHERE s.day = (p_at AT TIME ZONE 'UTC')::date), 0),
           coalesce(sum(s.amount), 0)
      FROM tenant_spend s
     WHERE s.tenant = p_tenant AND s.currency = p_currency
       AND s.day >= date_trunc('month', p_at AT TIME ZONE 'UTC')::date
       AND s.day <= (p_at AT TIME ZONE 'UTC')::date
$$;

-- THE definition of "tenant p_tenant may still spend at p_at": within its daily token budget
-- (migration 0010) and within its money budget, daily and monthly. False for an unknown tenant.
-- The claim plan asks it for every contender; status and reports read the same amounts.
CREATE FUNCTION lading_tenant_budget_left(p_tenant text, p_at timestamptz) RETURNS boolean
    LANGUAGE sql STABLE AS $$
    SELECT (t.daily_token_budget IS NULL
            OR coalesce((SELECT u.tokens FROM tenant_usage u
                          WHERE u.tenant = t.name AND u.day = (p_at AT TIME ZONE 'UTC')::date), 0)
               < t.daily_token_budget)
       AND (t.budget_currency IS NULL
            OR (SELECT (t.budget_daily IS NULL OR s.today < t.budget_daily)
                   AND (t.budget_monthly IS NULL OR s.month < t.budget_monthly)
                  FROM lading_tenant_spend(t.name, t.budget_currency, p_at) s))
      FROM tenants t
     WHERE t.name = p_tenant
$$;

-- The claim plan of migration 0010, its contenders now filtered by lading_tenant_budget_left
-- instead of the token budget alone. Everything else is unchanged (see 0010 for the scheme).
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
