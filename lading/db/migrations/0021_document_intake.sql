-- Single documents (the HTTP API and the queue intake; lading/intake.py).
--
-- One job per (namespace, idempotency key): the primary key of document_submissions decides a
-- race between concurrent submissions of one key, never "SELECT then INSERT". The row keeps the
-- digest of the request it was accepted for, so a repeat is answered with the same job and a
-- different request under the same key is refused. The job row says where the job went.
CREATE TABLE document_submissions (
    namespace       text        NOT NULL,
    idempotency_key text        NOT NULL,
    request_digest  text        NOT NULL,
    job_id          bigint      NOT NULL,   -- no FK, like every per-job table (0001's note)
    created_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (namespace, idempotency_key)
);
-- Keys are kept at least 24 hours, then pruned oldest first.
CREATE INDEX document_submissions_created ON document_submissions (created_at);

-- Documents sent one by one are appended to rolling batches: ordinary batch rows, so status,
-- fairness, quotas and delivery work as for any batch. `rolling_group` names what the batch's
-- documents share (tenant, namespace, pool, endpoint, priority, deadline, schema, policy) and
-- stays set; `open_until` is set while the batch takes more documents. At most one open batch
-- per group; it closes when full (`open_until` cleared) or once `open_until` has passed.
ALTER TABLE batches
    ADD COLUMN rolling_group text,
    ADD COLUMN open_until    timestamptz,
    ADD CONSTRAINT batches_open_only_rolling CHECK (open_until IS NULL OR rolling_group IS NOT NULL);
CREATE UNIQUE INDEX batches_open_rolling ON batches (rolling_group) WHERE open_until IS NOT NULL;
