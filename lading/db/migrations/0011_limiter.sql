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

-- One round trip per grant: lock the pool's row, then count and insert with a snapshot taken
-- after the lock is held (each statement of a VOLATILE plpgsql function takes a new snapshot
-- under READ COMMITTED), so two replicas can never both take the last permit. The lock is held
-- for the function's few statements only. Refused: permit_id is NULL and the rest says why.
CREATE FUNCTION lading_limiter_acquire(
    p_pool text, p_job bigint, p_fence bigint, p_tokens integer,
    p_rpm bigint, p_tpm bigint, p_concurrency bigint, p_ttl_s float8, p_window_s float8, p_per_second bigint,
    OUT o_permit_id bigint, OUT o_cooling boolean, OUT o_cooldown_left_s float8,
    OUT o_requests bigint, OUT o_tokens bigint, OUT o_in_flight bigint, OUT o_last_second bigint,
    OUT o_window_frees_in_s float8, OUT o_second_frees_in_s float8)
    LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_cooldown timestamptz;
    v_oldest timestamptz;
    v_oldest_in_second timestamptz;
    v_now timestamptz;
BEGIN
    SELECT p.cooldown_until INTO v_cooldown FROM pools p WHERE p.name = p_pool FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'InferencePool % is not registered', p_pool USING ERRCODE = 'no_data_found';
    END IF;
    v_now := clock_timestamp();
    o_cooling := coalesce(v_cooldown > v_now, false);
    IF o_cooling THEN
        o_cooldown_left_s := extract(epoch FROM v_cooldown - v_now);
        RETURN;
    END IF;
    SELECT count(*) FILTER (WHERE l.acquired_at > v_now - make_interval(secs => p_window_s)),
           coalesce(sum(coalesce(l.tokens_used, l.tokens_reserved))
                    FILTER (WHERE l.acquired_at > v_now - make_interval(secs => p_window_s)), 0),
           count(*) FILTER (WHERE l.released_at IS NULL AND l.expires_at > v_now),
           count(*) FILTER (WHERE l.acquired_at > v_now - interval '1 second'),
           min(l.acquired_at) FILTER (WHERE l.acquired_at > v_now - make_interval(secs => p_window_s)),
           min(l.acquired_at) FILTER (WHERE l.acquired_at > v_now - interval '1 second')
      INTO o_requests, o_tokens, o_in_flight, o_last_second, v_oldest, v_oldest_in_second
      FROM limiter_permits l
     WHERE l.pool = p_pool
       AND (l.acquired_at > v_now - make_interval(secs => p_window_s)
            OR (l.released_at IS NULL AND l.expires_at > v_now));
    o_window_frees_in_s := extract(epoch FROM v_oldest + make_interval(secs => p_window_s) - v_now);
    o_second_frees_in_s := extract(epoch FROM v_oldest_in_second + interval '1 second' - v_now);
    IF o_requests + 1 <= p_rpm AND o_tokens + p_tokens <= p_tpm AND o_in_flight + 1 <= p_concurrency
       AND o_last_second + 1 <= p_per_second THEN
        INSERT INTO limiter_permits (pool, job_id, fence, tokens_reserved, expires_at)
        VALUES (p_pool, p_job, p_fence, p_tokens, v_now + make_interval(secs => p_ttl_s))
        RETURNING id INTO o_permit_id;
    END IF;
END
$$;
