-- What each tenant has queued (jobs READY, RUNNING or RETRY_SCHEDULED, and their documents'
-- bytes), kept as counters instead of counted from extraction_jobs at each admission: what
-- maxQueuedJobs and maxQueuedBytes bound (lading.applying), read in one index range.
--
-- The counters are kept by statement-level triggers with transition tables on extraction_jobs and
-- job_documents, so every path that inserts jobs, moves them in or out of the counted states
-- (claim, commit, reaper, cancellation, reuse, review) or deletes them (retention) keeps them right
-- without knowing about them: one counter update per statement and tenant, not per row.
--
-- A tenant's count is the sum of its rows: each statement that changes it inserts one row per
-- tenant (its delta), so nothing ever waits for a counter row and concurrent workers committing
-- jobs of one tenant never queue on one row nor deadlock on two. Now and then (one statement in 32
-- that adds to a tenant) the tenant's rows are folded into one, taking only rows no other
-- transaction holds (SKIP LOCKED): a tenant has a few dozen rows, read in one index range.
--
-- Bytes follow the document rows: a document row adds its bytes when it is inserted while its job
-- is counted, and a job moving in or out of the counted states adds or removes its document's
-- bytes. A document row is therefore inserted with its job (same statement) or after it, as every
-- acceptance path does; inserted before its job, its bytes would not be counted. The other table's
-- rows are read by primary key, one per changed row (never a join the planner could turn into a
-- scan of a large table).
CREATE TABLE tenant_queued (
    tenant text   NOT NULL,
    jobs   bigint NOT NULL DEFAULT 0,
    bytes  bigint NOT NULL DEFAULT 0
);
CREATE INDEX tenant_queued_tenant ON tenant_queued (tenant);

CREATE FUNCTION lading_queued_state(state text) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN state IN ('READY', 'RUNNING', 'RETRY_SCHEDULED');

-- Now and then (one call in 32), fold the rows of `tenants` into one row each, skipping rows
-- another transaction holds: the sums stay, and nothing waits.
CREATE FUNCTION lading_tenant_queued_fold(tenants text[]) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF tenants IS NULL OR random() >= 1.0 / 32 THEN
        RETURN;
    END IF;
    WITH gone AS (
        DELETE FROM tenant_queued
         WHERE ctid = ANY (ARRAY(SELECT ctid FROM tenant_queued WHERE tenant = ANY (tenants)
                                   FOR UPDATE SKIP LOCKED))
        RETURNING tenant, jobs, bytes
    )
    INSERT INTO tenant_queued (tenant, jobs, bytes)
    SELECT tenant, sum(jobs), sum(bytes) FROM gone GROUP BY tenant HAVING sum(jobs) <> 0 OR sum(bytes) <> 0;
END $$;

CREATE FUNCTION lading_tenant_queued_jobs_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    changed text[];
BEGIN
    WITH added AS (
        INSERT INTO tenant_queued (tenant, jobs)
        SELECT n.tenant, count(*)
          FROM lading_new_jobs n
         WHERE lading_queued_state(n.state)
         GROUP BY n.tenant
        RETURNING tenant
    )
    SELECT array_agg(tenant) INTO changed FROM added;
    PERFORM lading_tenant_queued_fold(changed);
    RETURN NULL;
END $$;

CREATE FUNCTION lading_tenant_queued_jobs_updated() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    changed text[];
    counted_before_all boolean;
    counted_before_none boolean;
    counted_after_all boolean;
    counted_after_none boolean;
BEGIN
    -- Most updates move no job in or out of the counted states (a claim, a lease's renewal, a
    -- finished job's later changes), and a worker's commit moves every job out: told apart by
    -- scanning the two tables, so neither needs their join.
    SELECT coalesce(bool_and(lading_queued_state(state)), true), NOT coalesce(bool_or(lading_queued_state(state)), false)
      INTO counted_before_all, counted_before_none FROM lading_old_jobs;
    SELECT coalesce(bool_and(lading_queued_state(state)), true), NOT coalesce(bool_or(lading_queued_state(state)), false)
      INTO counted_after_all, counted_after_none FROM lading_new_jobs;
    IF (counted_before_all AND counted_after_all) OR (counted_before_none AND counted_after_none) THEN
        RETURN NULL;
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

CREATE FUNCTION lading_tenant_queued_jobs_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    changed text[];
BEGIN
    WITH added AS (
        INSERT INTO tenant_queued (tenant, jobs, bytes)
        SELECT o.tenant, -count(*), -coalesce(sum((SELECT d.bytes FROM job_documents d WHERE d.job_id = o.id)), 0)
          FROM lading_old_jobs o
         WHERE lading_queued_state(o.state)
         GROUP BY o.tenant
        RETURNING tenant
    )
    SELECT array_agg(tenant) INTO changed FROM added;
    PERFORM lading_tenant_queued_fold(changed);
    RETURN NULL;
END $$;

CREATE FUNCTION lading_tenant_queued_documents_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    changed text[];
BEGIN
    WITH added AS (
        INSERT INTO tenant_queued (tenant, bytes)
        SELECT j.tenant, sum(n.bytes)
          FROM lading_new_documents n
          CROSS JOIN LATERAL (SELECT tenant, state FROM extraction_jobs WHERE id = n.job_id LIMIT 1) j
         WHERE lading_queued_state(j.state)
         GROUP BY j.tenant
        RETURNING tenant
    )
    SELECT array_agg(tenant) INTO changed FROM added;
    PERFORM lading_tenant_queued_fold(changed);
    RETURN NULL;
END $$;

CREATE FUNCTION lading_tenant_queued_documents_updated() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    changed text[];
BEGIN
    WITH added AS (
        INSERT INTO tenant_queued (tenant, bytes)
        SELECT j.tenant, sum(n.bytes - o.bytes)
          FROM lading_new_documents n
          JOIN lading_old_documents o ON o.job_id = n.job_id
          CROSS JOIN LATERAL (SELECT tenant, state FROM extraction_jobs WHERE id = n.job_id LIMIT 1) j
         WHERE n.bytes <> o.bytes AND lading_queued_state(j.state)
         GROUP BY j.tenant
        RETURNING tenant
    )
    SELECT array_agg(tenant) INTO changed FROM added;
    PERFORM lading_tenant_queued_fold(changed);
    RETURN NULL;
END $$;

CREATE FUNCTION lading_tenant_queued_documents_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    changed text[];
BEGIN
    WITH added AS (
        INSERT INTO tenant_queued (tenant, bytes)
        SELECT j.tenant, -sum(o.bytes)
          FROM lading_old_documents o
          CROSS JOIN LATERAL (SELECT tenant, state FROM extraction_jobs WHERE id = o.job_id LIMIT 1) j
         WHERE lading_queued_state(j.state)
         GROUP BY j.tenant
        RETURNING tenant
    )
    SELECT array_agg(tenant) INTO changed FROM added;
    PERFORM lading_tenant_queued_fold(changed);
    RETURN NULL;
END $$;

CREATE TRIGGER tenant_queued_jobs_inserted AFTER INSERT ON extraction_jobs
    REFERENCING NEW TABLE AS lading_new_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION lading_tenant_queued_jobs_inserted();
CREATE TRIGGER tenant_queued_jobs_updated AFTER UPDATE ON extraction_jobs
    REFERENCING OLD TABLE AS lading_old_jobs NEW TABLE AS lading_new_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION lading_tenant_queued_jobs_updated();
CREATE TRIGGER tenant_queued_jobs_deleted AFTER DELETE ON extraction_jobs
    REFERENCING OLD TABLE AS lading_old_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION lading_tenant_queued_jobs_deleted();
CREATE TRIGGER tenant_queued_documents_inserted AFTER INSERT ON job_documents
    REFERENCING NEW TABLE AS lading_new_documents
    FOR EACH STATEMENT EXECUTE FUNCTION lading_tenant_queued_documents_inserted();
CREATE TRIGGER tenant_queued_documents_updated AFTER UPDATE ON job_documents
    REFERENCING OLD TABLE AS lading_old_documents NEW TABLE AS lading_new_documents
    FOR EACH STATEMENT EXECUTE FUNCTION lading_tenant_queued_documents_updated();
CREATE TRIGGER tenant_queued_documents_deleted AFTER DELETE ON job_documents
    REFERENCING OLD TABLE AS lading_old_documents
    FOR EACH STATEMENT EXECUTE FUNCTION lading_tenant_queued_documents_deleted();

-- What is queued now (CREATE TRIGGER locked both tables against writes until this commits).
INSERT INTO tenant_queued (tenant, jobs, bytes)
SELECT j.tenant, count(*), coalesce(sum(d.bytes), 0)
  FROM extraction_jobs j
  LEFT JOIN job_documents d ON d.job_id = j.id
 WHERE lading_queued_state(j.state)
 GROUP BY j.tenant;
