-- Deliveries of results to ERP webhooks (lading/delivery/states.py draws the state machine).
--
-- One row per (job, endpoint): the logical delivery. Its delivery_id is the webhook-id of every
-- attempt, so a receiver dedups retries and operator redeliveries by it. The row is written by
-- the database itself when a job whose batch names an endpoint becomes SUCCEEDED, in the same
-- statement (so the same transaction) as the success: the worker's commit and a reviewer's
-- approve/correct alike. Secrets never come here: the dispatcher reads them from its
-- SecretSource (lading/delivery/secrets.py).

CREATE TABLE deliveries (
    delivery_id       uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    job_id            bigint      NOT NULL,    -- no FK: written with the job's own update (see 0001)
    endpoint          text        NOT NULL,    -- "<namespace>/<name>" of the DeliveryEndpoint
    state             text        NOT NULL DEFAULT 'PENDING' CHECK (state IN
                          ('PENDING', 'IN_FLIGHT', 'RETRY_SCHEDULED', 'DELIVERED', 'FAILED_TERMINAL',
                           'UNKNOWN_EXTERNAL')),
    attempt           integer     NOT NULL DEFAULT 0 CHECK (attempt >= 0),  -- every attempt ever made
    budget_attempts   integer     NOT NULL DEFAULT 0 CHECK (budget_attempts >= 0),
                                               -- attempts of the current retry budget (redeliver resets)
    ambiguous_attempts integer    NOT NULL DEFAULT 0 CHECK (ambiguous_attempts >= 0),
                                               -- of those, attempts whose outcome is unknown
    fence             bigint      NOT NULL DEFAULT 0 CHECK (fence >= 0),
    lease_until       timestamptz,
    owner             text,
    next_attempt_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    first_attempt_at  timestamptz,             -- of the current budget: maxAgeSeconds counts from here
    last_status       integer,
    last_error_class  text,
    last_error        text,
    created_at        timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at        timestamptz NOT NULL DEFAULT clock_timestamp(),
    delivered_at      timestamptz,
    resolved_by       text,                    -- `lading deliveries resolve`: who reconciled, and why
    resolved_reason   text,
    UNIQUE (job_id, endpoint),
    CONSTRAINT in_flight_has_lease CHECK ((state = 'IN_FLIGHT') = (lease_until IS NOT NULL AND owner IS NOT NULL)),
    CONSTRAINT delivered_has_time CHECK ((state = 'DELIVERED') = (delivered_at IS NOT NULL)),
    CONSTRAINT resolution_is_complete CHECK ((resolved_by IS NULL) = (resolved_reason IS NULL))
);

-- The dispatcher's claim path: due deliveries by time, without a scan.
CREATE INDEX deliveries_due ON deliveries (next_attempt_at) WHERE state IN ('PENDING', 'RETRY_SCHEDULED');
-- The dispatcher's reaper path: in-flight deliveries by lease expiry.
CREATE INDEX deliveries_leases ON deliveries (lease_until) WHERE state = 'IN_FLIGHT';
-- The operator's path: deliveries waiting for a human.
CREATE INDEX deliveries_settled_unsuccessfully ON deliveries (endpoint, created_at)
    WHERE state IN ('FAILED_TERMINAL', 'UNKNOWN_EXTERNAL');
-- Counts per endpoint and state (metrics, the DeliveryEndpoint's status), as index-only scans.
CREATE INDEX deliveries_by_endpoint_state ON deliveries (endpoint, state);

-- Every attempt: what was tried, by whom, under which fence, and how it ended.
CREATE TABLE delivery_attempts (
    delivery_id  uuid        NOT NULL REFERENCES deliveries (delivery_id),
    fence        bigint      NOT NULL,
    attempt      integer     NOT NULL,
    owner        text        NOT NULL,
    started_at   timestamptz NOT NULL,
    finished_at  timestamptz,
    outcome      text CHECK (outcome IN ('delivered', 'retry', 'failed', 'unknown', 'stale', 'lease-expired')),
    http_status  integer,
    error_class  text,
    error        text,
    latency_ms   integer,
    PRIMARY KEY (delivery_id, fence),
    CONSTRAINT finished_has_outcome CHECK ((finished_at IS NULL) = (outcome IS NULL))
);

-- Endpoint health, shared by every dispatcher replica (the operator mirrors it to the
-- DeliveryEndpoint's status): the circuit breaker and the AuthFailing condition.
ALTER TABLE endpoints
    ADD COLUMN breaker_state      text        NOT NULL DEFAULT 'closed'
                                  CHECK (breaker_state IN ('closed', 'open', 'half_open')),
    ADD COLUMN breaker_failures   integer     NOT NULL DEFAULT 0,  -- consecutive failed attempts
    ADD COLUMN breaker_opens      integer     NOT NULL DEFAULT 0,  -- consecutive openings: the cool-down grows
    ADD COLUMN breaker_open_until timestamptz,                     -- open: no attempts before this
    ADD COLUMN breaker_probe_until timestamptz,                    -- half-open: the probe's lease
    ADD COLUMN breaker_changed_at timestamptz,
    ADD COLUMN auth_failures      integer     NOT NULL DEFAULT 0,  -- consecutive 401/403 answers
    ADD COLUMN auth_failing       boolean     NOT NULL DEFAULT false,
    ADD COLUMN auth_failing_since timestamptz,
    ADD COLUMN last_auth_status   integer;

-- Delivery rows of successes, written by the database in the statement that records the
-- success (the pattern of 0001's outbox trigger). The early exit keeps the cost of claims
-- and heartbeats, which never succeed a job, to one scan of the transition table.
CREATE FUNCTION lading_jobs_deliveries_on_update() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM after_rows WHERE state = 'SUCCEEDED') THEN
        RETURN NULL;
    END IF;
    INSERT INTO deliveries (job_id, endpoint)
    SELECT n.id, b.endpoint
      FROM after_rows n
      JOIN before_rows o ON o.id = n.id
      JOIN batches b ON b.id = n.batch_id
     WHERE n.state = 'SUCCEEDED' AND o.state <> 'SUCCEEDED' AND b.endpoint IS NOT NULL
        ON CONFLICT (job_id, endpoint) DO NOTHING;
    RETURN NULL;
END
$$;

CREATE TRIGGER extraction_jobs_deliveries_update AFTER UPDATE ON extraction_jobs
    REFERENCING OLD TABLE AS before_rows NEW TABLE AS after_rows
    FOR EACH STATEMENT EXECUTE FUNCTION lading_jobs_deliveries_on_update();
