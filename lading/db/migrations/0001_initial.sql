-- Lading schema v1: tenants, pools, endpoints, batches, jobs, attempts, results, outbox.
-- PostgreSQL is the authority: a job exists once its row is committed.

CREATE TABLE tenants (
    name            text PRIMARY KEY,
    namespaces      text[]      NOT NULL DEFAULT '{}',
    weight          integer     NOT NULL DEFAULT 1 CHECK (weight > 0),
    max_queued_jobs bigint      CHECK (max_queued_jobs >= 0),
    max_in_flight   integer     CHECK (max_in_flight >= 0),
    spec            jsonb       NOT NULL DEFAULT '{}',
    updated_at      timestamptz NOT NULL DEFAULT clock_timestamp()
);

CREATE TABLE pools (
    name        text PRIMARY KEY,                 -- "<namespace>/<name>" of the InferencePool
    provider    text        NOT NULL CHECK (provider IN ('builtin', 'openai-compatible', 'vllm')),
    model       text,
    spec        jsonb       NOT NULL DEFAULT '{}',
    paused      boolean     NOT NULL DEFAULT false,
    updated_at  timestamptz NOT NULL DEFAULT clock_timestamp()
);

CREATE TABLE endpoints (
    name        text PRIMARY KEY,                 -- "<namespace>/<name>" of the DeliveryEndpoint
    url         text        NOT NULL,
    spec        jsonb       NOT NULL DEFAULT '{}',
    updated_at  timestamptz NOT NULL DEFAULT clock_timestamp()
);

CREATE TABLE batches (
    id                bigserial PRIMARY KEY,
    tenant            text        NOT NULL REFERENCES tenants (name),
    namespace         text        NOT NULL,
    name              text        NOT NULL,
    uid               text        NOT NULL,
    idempotency_key   text        NOT NULL,
    request_hash      text        NOT NULL,
    hash_version      integer     NOT NULL,
    schema            text        NOT NULL,
    pool              text        NOT NULL REFERENCES pools (name),
    validation_policy text        NOT NULL,
    priority          smallint    NOT NULL,
    deadline_s        integer     NOT NULL CHECK (deadline_s > 0),
    endpoint          text,
    suspended         boolean     NOT NULL DEFAULT false,
    total_jobs        integer     NOT NULL CHECK (total_jobs >= 0),
    created_at        timestamptz NOT NULL DEFAULT clock_timestamp(),
    UNIQUE (tenant, idempotency_key)
);

CREATE TABLE extraction_jobs (
    id                bigserial PRIMARY KEY,
    tenant            text        NOT NULL,
    batch_id          bigint      NOT NULL,   -- no FK: see the note on foreign keys below
    ordinal           integer     NOT NULL,      -- position in the batch, for stable listing
    document_key      text        NOT NULL,
    request_hash      text        NOT NULL,
    content_sha256    text        NOT NULL,
    object_version    integer     NOT NULL DEFAULT 1,
    pool              text        NOT NULL,
    schema            text        NOT NULL,
    validation_policy text        NOT NULL,
    state             text        NOT NULL DEFAULT 'READY' CHECK (state IN
                          ('READY', 'RUNNING', 'RETRY_SCHEDULED', 'REVIEW_REQUIRED',
                           'SUCCEEDED', 'FAILED_TERMINAL', 'CANCELLED')),
    priority          smallint    NOT NULL DEFAULT 1,
    attempt           integer     NOT NULL DEFAULT 0 CHECK (attempt >= 0),
    max_attempts      integer     NOT NULL CHECK (max_attempts > 0),
    fence             bigint      NOT NULL DEFAULT 0 CHECK (fence >= 0),
    lease_until       timestamptz,
    worker_id         text,
    available_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    deadline_at       timestamptz NOT NULL,
    created_at        timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at        timestamptz NOT NULL DEFAULT clock_timestamp(),
    finished_at       timestamptz,
    last_error_class  text,
    last_error        text,
    -- A job's idempotency key is its batch's key (unique per tenant, on batches) plus its
    -- document key (unique per batch, here); this constraint also serves lookups by batch.
    UNIQUE (batch_id, document_key),
    -- A running job always has a lease and an owner; no other state keeps one.
    CONSTRAINT running_has_lease CHECK ((state = 'RUNNING') = (lease_until IS NOT NULL AND worker_id IS NOT NULL)),
    -- Terminal states carry their finishing time, and only they do.
    CONSTRAINT terminal_has_finished_at CHECK (
        (state IN ('SUCCEEDED', 'FAILED_TERMINAL', 'CANCELLED')) = (finished_at IS NOT NULL)),
    CONSTRAINT attempts_within_budget CHECK (attempt <= max_attempts)
);

-- The claimer's path: next eligible job of a pool, by priority then age, without a scan.
CREATE INDEX extraction_jobs_claimable ON extraction_jobs (pool, priority, available_at, id)
    WHERE state IN ('READY', 'RETRY_SCHEDULED');
-- The reaper's path: running jobs by lease expiry.
CREATE INDEX extraction_jobs_leases ON extraction_jobs (lease_until) WHERE state = 'RUNNING';
-- The reaper's other path: waiting jobs whose deadline passed.
CREATE INDEX extraction_jobs_waiting_deadline ON extraction_jobs (deadline_at)
    WHERE state IN ('READY', 'RETRY_SCHEDULED');

-- A note on foreign keys: the per-job tables (extraction_jobs -> batches, and
-- job_documents, job_attempts, results -> extraction_jobs) have none on purpose. A foreign
-- key check costs a lookup per row, which doubled the cost of accepting a 10,000-document
-- batch and taxes every claim and completion. Their rows are only ever written by the
-- acceptance, claim and finish statements in lading/db/sql, together with or after the row
-- they refer to, and nothing is ever deleted, so the reference holds by construction;
-- tests/integration/test_referential_integrity.py checks it after the concurrency tests.
CREATE TABLE job_documents (
    job_id  bigint PRIMARY KEY,
    text    text    NOT NULL,
    bytes   integer NOT NULL CHECK (bytes >= 0)
);

CREATE TABLE job_attempts (
    job_id       bigint      NOT NULL,
    fence        bigint      NOT NULL,
    attempt      integer     NOT NULL,
    worker_id    text        NOT NULL,
    started_at   timestamptz NOT NULL,
    finished_at  timestamptz,
    outcome      text CHECK (outcome IN ('ok', 'transient', 'timeout-ambiguous', 'invalid-output',
                                         'validation-failed', 'terminal', 'lease-expired', 'stale',
                                         'cancelled')),
    error_class  text,
    error        text,
    tokens_in    integer,
    tokens_out   integer,
    latency_ms   integer,
    PRIMARY KEY (job_id, fence),
    CONSTRAINT finished_has_outcome CHECK ((finished_at IS NULL) = (outcome IS NULL))
);

CREATE TABLE results (
    job_id            bigint PRIMARY KEY,
    fence             bigint      NOT NULL,
    schema            text        NOT NULL,
    validation_policy text        NOT NULL,
    result            jsonb       NOT NULL,
    validation        jsonb       NOT NULL,    -- {"passed": bool, "failed_checks": [...]}
    created_at        timestamptz NOT NULL DEFAULT clock_timestamp()
);

CREATE TABLE outbox_events (
    id             bigserial PRIMARY KEY,
    event_id       uuid        NOT NULL UNIQUE,
    aggregate_type text        NOT NULL,
    aggregate_id   bigint      NOT NULL,
    type           text        NOT NULL,
    payload        jsonb       NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    published_at   timestamptz,
    claim_owner    text,
    claim_until    timestamptz
);
CREATE INDEX outbox_events_unpublished ON outbox_events (id) WHERE published_at IS NULL;

-- Counters that must survive restarts (metrics are per process).
CREATE TABLE stale_completions (
    job_id      bigint      NOT NULL,
    fence       bigint      NOT NULL,
    worker_id   text        NOT NULL,
    at          timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- Outbox rows of job state changes are written by the database itself, in the same
-- statement as the change, so no code path (executor, reaper, reviewer, cancellation) can
-- commit a state change without its event or an event without it. Acceptance writes one
-- `batch.accepted.v1` event per batch in its own transaction (lading/accepting.py).
-- Statement-level triggers with transition tables: one INSERT ... SELECT per statement,
-- not one per row, which keeps batched claims/completions cheap.
CREATE FUNCTION lading_job_event_type(state text) RETURNS text
    LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE state
        WHEN 'SUCCEEDED'       THEN 'extraction.completed.v1'
        WHEN 'REVIEW_REQUIRED' THEN 'extraction.review_required.v1'
        WHEN 'FAILED_TERMINAL' THEN 'extraction.failed.v1'
        WHEN 'CANCELLED'       THEN 'extraction.cancelled.v1'
    END
$$;

CREATE FUNCTION lading_jobs_outbox_on_update() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO outbox_events (event_id, aggregate_type, aggregate_id, type, payload)
    SELECT gen_random_uuid(), 'job', n.id, lading_job_event_type(n.state),
           jsonb_build_object('job_id', n.id, 'tenant', n.tenant, 'batch_id', n.batch_id,
                              'document_key', n.document_key, 'state', n.state, 'fence', n.fence,
                              'attempt', n.attempt, 'error_class', n.last_error_class)
      FROM after_rows n JOIN before_rows o ON o.id = n.id
     WHERE n.state <> o.state
       AND n.state IN ('SUCCEEDED', 'REVIEW_REQUIRED', 'FAILED_TERMINAL', 'CANCELLED');
    RETURN NULL;
END
$$;

CREATE TRIGGER extraction_jobs_outbox_update AFTER UPDATE ON extraction_jobs
    REFERENCING OLD TABLE AS before_rows NEW TABLE AS after_rows
    FOR EACH STATEMENT EXECUTE FUNCTION lading_jobs_outbox_on_update();
