-- The distributed admission limiter (lading/limiting.py): one row per model request, shared by
-- every worker replica of a pool. A sliding 60-second log, not a token bucket: a bucket lets a
-- full burst plus a minute of refill through in one window (up to twice the limit); the log
-- counts exactly what was sent in any 60 s, so the pool never exceeds requestsPerMinute or
-- tokensPerMinute, whatever the number of workers.
CREATE TABLE limiter_permits (
    id              bigserial PRIMARY KEY,
    pool            text        NOT NULL,
    job_id          bigint      NOT NULL,
    fence           bigint      NOT NULL,
    acquired_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    tokens_reserved integer     NOT NULL CHECK (tokens_reserved >= 0),
    tokens_used     integer     CHECK (tokens_used >= 0),   -- NULL: not reconciled, the reservation counts
    expires_at      timestamptz NOT NULL,                   -- a crashed worker's permit frees itself here
    released_at     timestamptz
);
-- The window: requests and tokens of the last minute.
CREATE INDEX limiter_permits_window ON limiter_permits (pool, acquired_at);
-- Concurrency: permits not yet released.
CREATE INDEX limiter_permits_held ON limiter_permits (pool, expires_at) WHERE released_at IS NULL;

-- A 429 from the provider cools the whole pool down: no worker sends until this time.
ALTER TABLE pools ADD COLUMN cooldown_until timestamptz;
