-- Pools priced by the GPU hour, reused attempts at cost 0, and attempts that never finished
-- counted at their reservation (docs/cost.md).
--
--   * A vLLM pool may be priced by `spec.pricing.gpuHourPrice` instead of per token. Its attempts
--     finish with their cost pending: cost NULL, cost_currency set (the constraint below allows
--     that pair; before this migration NULL cost meant NULL currency). The allocator
--     (lading_elected.gpu_costs, one elected process) closes each 60 s interval of such a pool:
--     the GPU time of the pool's ready replicas in it, priced, is split among the attempts
--     pending in it by their tokens, and added to the attempts, their jobs, batches and tenants.
--   * pool_gpu_samples: the ready replicas and GPUs per replica of a vLLM pool, written by the
--     operator each time it observes the vLLM Deployment (lading.db.gpu_time); a step function
--     in time, each sample holding until the next.
--   * pool_gpu_intervals: one row per closed interval that had GPU time or attempts, with its
--     cost and what of it went to attempts; an interval without tokens is idle, charged to no
--     tenant. pool_gpu_cursor: the end of the last closed interval of each pool. Closing an
--     interval is one transaction that moves the cursor under its row lock, so an interval is
--     charged exactly once, whatever crashes or replicas.
--   * job_attempts.reserved_tokens_in/out: the reservation (prompt estimate, output budget) the
--     worker noted before sending the request of a priced pool. An attempt the reaper closes
--     (its worker died or lost its lease mid-call) may have been billed: it is charged this
--     reservation at the pool's prices (job_reap_many).

-- NOT VALID: every existing row satisfies the older, stricter constraint; new rows are checked.
ALTER TABLE job_attempts
    DROP CONSTRAINT attempt_cost_has_currency,
    ADD CONSTRAINT attempt_cost_has_currency CHECK (cost IS NULL OR cost_currency IS NOT NULL) NOT VALID,
    ADD COLUMN reserved_tokens_in  bigint CHECK (reserved_tokens_in >= 0),
    ADD COLUMN reserved_tokens_out bigint CHECK (reserved_tokens_out >= 0);

-- The attempts whose cost waits for their interval to close: a few minutes' worth at most.
CREATE INDEX job_attempts_cost_pending ON job_attempts (finished_at)
    WHERE cost IS NULL AND cost_currency IS NOT NULL;

CREATE TABLE pool_gpu_samples (
    pool           text        NOT NULL,
    at             timestamptz NOT NULL DEFAULT clock_timestamp(),
    ready_replicas integer     NOT NULL CHECK (ready_replicas >= 0),
    gpus           integer     NOT NULL CHECK (gpus >= 0),
    PRIMARY KEY (pool, at)
);

CREATE TABLE pool_gpu_cursor (
    pool         text        PRIMARY KEY,
    closed_until timestamptz NOT NULL
);

CREATE TABLE pool_gpu_intervals (
    pool        text        NOT NULL,
    starts_at   timestamptz NOT NULL,
    currency    text        NOT NULL,
    gpu_seconds numeric     NOT NULL CHECK (gpu_seconds >= 0),
    cost        numeric     NOT NULL CHECK (cost >= 0),
    charged     numeric     NOT NULL CHECK (charged >= 0 AND charged <= cost),
    attempts    integer     NOT NULL CHECK (attempts >= 0),
    tokens      bigint      NOT NULL CHECK (tokens >= 0),
    closed_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (pool, starts_at)
);
