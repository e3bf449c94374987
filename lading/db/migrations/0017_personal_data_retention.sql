-- Personal-data retention (TenantQuota spec.retention; lading/cleaning.py): a terminal job's
-- document (text or URI) is deleted after documentsDays, then the extracted result after
-- resultsDays. The job row stays for audit (digests, states, attempts, verdict) and says when
-- each went, so readers answer "deleted by retention" instead of "not found".
ALTER TABLE extraction_jobs
    ADD COLUMN document_deleted_at timestamptz,
    ADD COLUMN result_deleted_at   timestamptz,
    ADD CONSTRAINT result_deleted_after_document CHECK (result_deleted_at IS NULL OR document_deleted_at IS NOT NULL);

-- The result's JSON goes; the row keeps its fence, schema and verdict (validation).
ALTER TABLE results ALTER COLUMN result DROP NOT NULL;

-- The cleaner's paths, per tenant, oldest finished first: jobs whose document is still kept, and
-- jobs whose document went but whose result is still kept. Once done, a job leaves the index.
CREATE INDEX extraction_jobs_document_retention ON extraction_jobs (tenant, finished_at)
    WHERE finished_at IS NOT NULL AND document_deleted_at IS NULL;
CREATE INDEX extraction_jobs_result_retention ON extraction_jobs (tenant, finished_at)
    WHERE document_deleted_at IS NOT NULL AND result_deleted_at IS NULL;
