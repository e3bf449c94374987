-- The limiter hands a released permit's slot to the same process's next waiting attempt in the
-- release itself, and learns what the provider counts for a prompt (lading/limiting.py).
--
-- Until now a release freed the slot and woke every replica (NOTIFY); each woken replica then
-- asked for it in a second round trip and all but one were refused. A process that releases a
-- permit while attempts of its own wait for the pool's concurrency now releases and asks in one
-- call: one round trip per slot handed over instead of a release, a wake-up in every replica and
-- as many grant queries. It NOTIFYs the other replicas only when the slot stays free.
--
-- Grants and releases commit without waiting for the WAL flush (synchronous_commit off for
-- their transaction alone; the limiter's queries in sql/limiter.sql do the same): a grant holds
-- the pool's row lock until it commits, so every grant of every replica used to queue behind
-- one disk flush after another. The rows stay exactly as consistent and visible as before;
-- only a crash of the database itself can lose the grants and releases of its last fraction
-- of a second (wal_writer_delay, 200 ms by default, three times at most). Forgetting grants can
-- let the pool's next minute send a few requests more than its limits: the provider's 429 then
-- cools the pool down and the attempts are given back. Forgetting a release only holds a slot
-- until the permit expires.

-- Release permit p_permit (settling its tokens to p_tokens_used; NULL keeps the reservation) and,
-- in the same transaction, ask for the permits of (p_jobs, p_fences, p_tokens) exactly as
-- lading_limiter_acquire_many does (same limits, same answers). The pool row is locked first, as
-- by every grant, so locks are taken in the same order (pool, permit, rollup second) everywhere.
-- A release that grants nothing NOTIFYs lading_limiter: the slot stays free for other replicas.
CREATE FUNCTION lading_limiter_release_acquire(
    p_permit bigint, p_tokens_used bigint,
    p_pool text, p_jobs bigint[], p_fences bigint[], p_tokens integer[],
    p_rpm bigint, p_tpm bigint, p_concurrency bigint, p_ttl_s float8, p_window_s float8, p_per_second bigint,
    OUT o_permit_ids bigint[], OUT o_cooling boolean, OUT o_cooldown_left_s float8,
    OUT o_requests bigint, OUT o_tokens bigint, OUT o_in_flight bigint, OUT o_last_second bigint,
    OUT o_window_frees_in_s float8, OUT o_second_frees_in_s float8)
    LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    PERFORM 1 FROM pools p WHERE p.name = p_pool FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'InferencePool % is not registered', p_pool USING ERRCODE = 'no_data_found';
    END IF;
    WITH released AS (
        UPDATE limiter_permits
           SET released_at = clock_timestamp(), tokens_used = p_tokens_used
         WHERE id = p_permit AND released_at IS NULL
        RETURNING pool, acquired_at, tokens_reserved, tokens_used
    )
    UPDATE limiter_seconds s
       SET tokens = s.tokens + (r.tokens_used - r.tokens_reserved)
      FROM released r
     WHERE r.tokens_used IS NOT NULL AND r.tokens_used <> r.tokens_reserved
       AND s.pool = r.pool AND s.second = date_trunc('second', r.acquired_at);
    SELECT a.o_permit_ids, a.o_cooling, a.o_cooldown_left_s, a.o_requests, a.o_tokens, a.o_in_flight,
           a.o_last_second, a.o_window_frees_in_s, a.o_second_frees_in_s
      INTO o_permit_ids, o_cooling, o_cooldown_left_s, o_requests, o_tokens, o_in_flight,
           o_last_second, o_window_frees_in_s, o_second_frees_in_s
      FROM lading_limiter_acquire_many(p_pool, p_jobs, p_fences, p_tokens, p_rpm, p_tpm, p_concurrency,
                                       p_ttl_s, p_window_s, p_per_second) a;
    IF coalesce(array_length(o_permit_ids, 1), 0) = 0 THEN
        PERFORM pg_notify('lading_limiter', p_pool);
    END IF;
END
$$;

-- What a pool's provider counts for a prompt, per extraction schema: the factor a worker applies
-- to its own prompt estimate (characters at 3 per token) so that a reservation matches what the
-- provider reports. Learned from answers' usage by every worker (a high percentile of recent
-- ratios with a margin, `lading.limiting.PromptEstimator`) and written here, so a worker that
-- starts (or restarts) reserves what the pool's provider was seen to count from its first
-- request, instead of the conservative default, without learning it again.
CREATE TABLE limiter_estimates (
    pool       text        NOT NULL,
    schema     text        NOT NULL,
    factor     float8      NOT NULL CHECK (factor > 0 AND factor <= 1000),
    samples    integer     NOT NULL CHECK (samples >= 0),
    updated_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (pool, schema)
);
