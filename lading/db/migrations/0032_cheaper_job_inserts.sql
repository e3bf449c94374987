-- Less work per job row that acceptance writes, with every value, index and counter as before.
-- (Each part was measured on `hack/bench.py accept`; docs/benchmarks.md has the numbers.)
--
-- 1. The claim index's rank (lading_claim_rank, migration 0010) is evaluated for every job row
--    written into extraction_jobs_fair_claimable. Its body added an interval to a timestamptz,
--    an operator PostgreSQL declares STABLE, so the IMMUTABLE function could not be inlined and
--    each row paid a call of a SQL function (about a quarter of that index's cost on insert).
--    The same arithmetic done in UTC (timestamptz -> timestamp at offset 0, plus the whole
--    seconds, back to timestamptz at offset 0) uses only IMMUTABLE operators: the function is
--    now inlined, in the index expression and in the claim's conditions alike, and gives the
--    same value for every input (a whole number of seconds does not depend on a time zone;
--    infinity stays infinity; out of range fails as before). The index holds the same keys,
--    so it is not rebuilt.
CREATE OR REPLACE FUNCTION lading_claim_rank(available_at timestamptz, priority smallint) RETURNS timestamptz
    LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT timezone(interval '0', timezone(interval '0', available_at) + make_interval(secs => 300 * priority))
$$;

-- 2. A statement that inserts document rows counted each row's bytes for its job's tenant by
--    reading the job by primary key, one index descent per row (migration 0025). The rows of an
--    accepted batch (and of a manifest, or a group of submitted documents) have job ids that
--    are nearly consecutive: when the inserted rows' ids span less than twice their number,
--    the jobs are read as one range of the primary key and joined, which costs a fraction of
--    the per-row descents. Otherwise (ids far apart) the per-row path stays, so the read is
--    never a scan of more than twice the inserted rows.
CREATE OR REPLACE FUNCTION lading_tenant_queued_documents_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    changed text[];
    low bigint;
    high bigint;
    inserted bigint;
BEGIN
    SELECT min(job_id), max(job_id), count(*) INTO low, high, inserted FROM lading_new_documents;
    IF inserted = 0 THEN
        RETURN NULL;
    END IF;
    IF high - low < 2 * inserted THEN
        WITH added AS (
            INSERT INTO tenant_queued (tenant, bytes)
            SELECT j.tenant, sum(n.bytes)
              FROM (SELECT id, tenant, state FROM extraction_jobs WHERE id BETWEEN low AND high OFFSET 0) j
              JOIN lading_new_documents n ON n.job_id = j.id
             WHERE lading_queued_state(j.state)
             GROUP BY j.tenant
            RETURNING tenant
        )
        SELECT array_agg(tenant) INTO changed FROM added;
    ELSE
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
    END IF;
    PERFORM lading_tenant_queued_fold(changed);
    RETURN NULL;
END $$;

-- 3. An inline batch's acceptance knows what it adds to its tenant's queue (n READY jobs, the sum
--    of their documents' bytes) without reading a row back: it writes that one counter row
--    itself (lading_tenant_queued_add) and sets `lading.queued_counted` to 'on' for its
--    transaction (set_config(..., true)), which skips the two insert triggers' work: the job
--    rows' and the document rows' aggregation, and the document rows' reads of their jobs. Every
--    other path that inserts jobs or documents (a manifest batch, a submitted document) leaves
--    the setting unset and is counted by the triggers as before; updates and deletes always are.
CREATE FUNCTION lading_tenant_queued_add(tenant text, jobs bigint, bytes bigint) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO tenant_queued (tenant, jobs, bytes) VALUES (tenant, jobs, bytes);
    PERFORM lading_tenant_queued_fold(ARRAY[tenant]);
END $$;

DROP TRIGGER tenant_queued_jobs_inserted ON extraction_jobs;
CREATE TRIGGER tenant_queued_jobs_inserted AFTER INSERT ON extraction_jobs
    REFERENCING NEW TABLE AS lading_new_jobs
    FOR EACH STATEMENT WHEN (current_setting('lading.queued_counted', true) IS DISTINCT FROM 'on')
    EXECUTE FUNCTION lading_tenant_queued_jobs_inserted();
DROP TRIGGER tenant_queued_documents_inserted ON job_documents;
CREATE TRIGGER tenant_queued_documents_inserted AFTER INSERT ON job_documents
    REFERENCING NEW TABLE AS lading_new_documents
    FOR EACH STATEMENT WHEN (current_setting('lading.queued_counted', true) IS DISTINCT FROM 'on')
    EXECUTE FUNCTION lading_tenant_queued_documents_inserted();
