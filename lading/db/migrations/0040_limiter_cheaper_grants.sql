-- The limiter's grants and releases read and plan less (lading/limiting.py), and a deleted pool's
-- recorded waiters go with it.
--
-- Measured on one connection with nobody else asking (16 permits held, ~1,900 in the table):
-- a release that hands its slot to an attempt of its own replica cost about 0.8 ms of backend
-- CPU, and the pool's row stays locked for all of it, so every grant and release of every
-- replica queues behind it. Of that:
--   - 0.19 ms: lading_limiter_granted_meanwhile, and 0.11 ms: lading_limiter_waiters_granted.
--     Both are LANGUAGE sql functions that PostgreSQL cannot inline (they are called from
--     plpgsql, one returns a record): each call parsed and planned its statement again. And both
--     ran for every grant, although only an attempt that its replica recorded as waiting
--     (limiter_waiters) can have been granted a permit by another replica's release or have a
--     row to forget. Now their statements are written into lading_limiter_acquire_recording (a
--     plpgsql function keeps its plans for the session) and run only when an asked attempt was
--     recorded before: the caller says so (p_record[i] false: recorded by an earlier ask; a
--     release asking for its own attempts passes p_waited_s NULL when none was recorded).
--   - ~0.05 ms: pacing counted the permit rows of the last second (hundreds at a high rate, each
--     a heap visit). The rollup's current and previous seconds hold every request of the last
--     second (and perhaps more): when even that bound leaves room for everything asked, pacing
--     cannot refuse and the permit rows are not read. Only near the pace limit is the exact
--     count taken, as before.
--   - a release that grants the slot to another replica's attempt called
--     lading_limiter_acquire_recording (locking the pool's row a third time and asking for the
--     meanwhile check) and then the waiters function; it now asks lading_limiter_acquire_many
--     and forgets the one waiter row it granted by its key.
-- Same signatures and answers; only the work behind them changes.

-- A row in limiter_waiters only says who waits for a pool. When the pool's row is deleted, no
-- replica asks for that pool again (every grant raises no_data_found), so nothing would ever
-- forget its waiters: they go with the pool now, and those left by pools deleted before go here.
CREATE FUNCTION lading_limiter_forget_pool_waiters() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM limiter_waiters w WHERE w.pool = OLD.name;
    RETURN NULL;
END
$$;
CREATE TRIGGER pools_forget_limiter_waiters AFTER DELETE ON pools
    FOR EACH ROW EXECUTE FUNCTION lading_limiter_forget_pool_waiters();
DELETE FROM limiter_waiters w WHERE NOT EXISTS (SELECT 1 FROM pools p WHERE p.name = w.pool);

-- lading_limiter_acquire_many of migration 0014, with pacing bounded from the rollup first.
CREATE OR REPLACE FUNCTION lading_limiter_acquire_many(
    p_pool text, p_jobs bigint[], p_fences bigint[], p_tokens integer[],
    p_rpm bigint, p_tpm bigint, p_concurrency bigint, p_ttl_s float8, p_window_s float8, p_per_second bigint,
    OUT o_permit_ids bigint[], OUT o_cooling boolean, OUT o_cooldown_left_s float8,
    OUT o_requests bigint, OUT o_tokens bigint, OUT o_in_flight bigint, OUT o_last_second bigint,
    OUT o_window_frees_in_s float8, OUT o_second_frees_in_s float8)
    LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_cooldown timestamptz;
    v_oldest timestamptz;
    v_oldest_in_second timestamptz;
    v_now timestamptz;
    v_id bigint;
    v_granted_tokens bigint := 0;
    v_asked integer := coalesce(array_length(p_tokens, 1), 0);
BEGIN
    o_permit_ids := '{}';
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
    SELECT w.o_requests, w.o_tokens, w.o_oldest INTO o_requests, o_tokens, v_oldest
      FROM lading_limiter_window(p_pool, v_now - make_interval(secs => p_window_s)) w;
    SELECT count(*) INTO o_in_flight
      FROM limiter_permits l
     WHERE l.pool = p_pool AND l.released_at IS NULL AND l.expires_at > v_now;
    -- Pacing: the last second (now - 1 s, now] lies within the rollup's current and previous
    -- seconds, so their requests bound its count from above. Only when the bound leaves too little
    -- room for what is asked are the permit rows counted exactly.
    SELECT coalesce(sum(s.requests), 0) INTO o_last_second
      FROM limiter_seconds s
     WHERE s.pool = p_pool AND s.second >= date_trunc('second', v_now) - interval '1 second';
    IF o_last_second + v_asked > p_per_second THEN
        SELECT count(*), min(l.acquired_at) INTO o_last_second, v_oldest_in_second
          FROM limiter_permits l
         WHERE l.pool = p_pool AND l.acquired_at > v_now - interval '1 second';
    END IF;
    FOR i IN 1 .. v_asked LOOP
        EXIT WHEN o_requests + 1 > p_rpm OR o_tokens + p_tokens[i] > p_tpm OR o_in_flight + 1 > p_concurrency
               OR o_last_second + 1 > p_per_second;
        INSERT INTO limiter_permits (pool, job_id, fence, acquired_at, tokens_reserved, expires_at)
        VALUES (p_pool, p_jobs[i], p_fences[i], v_now, p_tokens[i], v_now + make_interval(secs => p_ttl_s))
        RETURNING id INTO v_id;
        o_permit_ids := o_permit_ids || v_id;
        o_requests := o_requests + 1;
        o_tokens := o_tokens + p_tokens[i];
        o_in_flight := o_in_flight + 1;
        o_last_second := o_last_second + 1;
        v_granted_tokens := v_granted_tokens + p_tokens[i];
    END LOOP;
    IF array_length(o_permit_ids, 1) > 0 THEN
        INSERT INTO limiter_seconds AS s (pool, second, requests, tokens)
        VALUES (p_pool, date_trunc('second', v_now), array_length(o_permit_ids, 1), v_granted_tokens)
        ON CONFLICT (pool, second) DO UPDATE
            SET requests = s.requests + EXCLUDED.requests, tokens = s.tokens + EXCLUDED.tokens;
        v_oldest := coalesce(v_oldest, v_now);
        v_oldest_in_second := coalesce(v_oldest_in_second, v_now);
    END IF;
    o_window_frees_in_s := extract(epoch FROM v_oldest + make_interval(secs => p_window_s) - v_now);
    o_second_frees_in_s := extract(epoch FROM v_oldest_in_second + interval '1 second' - v_now);
END
$$;

-- lading_limiter_acquire_recording of migration 0033. The check for permits granted meanwhile and
-- the forgetting of granted waiters run only when an asked attempt was recorded before: p_record
-- has a false (an earlier ask recorded it), or, without p_record, p_waited_s is given. An attempt
-- recorded again by a replica that listens on a new connection (its LISTEN connection was lost)
-- takes the new listener pid and keeps its place (since).
CREATE OR REPLACE FUNCTION lading_limiter_acquire_recording(
    p_pool text, p_jobs bigint[], p_fences bigint[], p_tokens integer[],
    p_rpm bigint, p_tpm bigint, p_concurrency bigint, p_ttl_s float8, p_window_s float8, p_per_second bigint,
    p_listener integer, p_record boolean[], p_waited_s float8[],
    OUT o_permit_ids bigint[], OUT o_cooling boolean, OUT o_cooldown_left_s float8,
    OUT o_requests bigint, OUT o_tokens bigint, OUT o_in_flight bigint, OUT o_last_second bigint,
    OUT o_window_frees_in_s float8, OUT o_second_frees_in_s float8, OUT o_recorded integer,
    OUT o_meanwhile_at integer[], OUT o_meanwhile_permits bigint[])
    LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_granted integer;
    v_asked integer;
    v_recorded_before boolean := p_waited_s IS NOT NULL AND (p_record IS NULL OR false = ANY (p_record));
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    PERFORM 1 FROM pools p WHERE p.name = p_pool FOR UPDATE;  -- before reading what was granted meanwhile
    o_meanwhile_at := '{}';
    o_meanwhile_permits := '{}';
    IF v_recorded_before THEN
        SELECT coalesce(array_agg(a.i::integer ORDER BY a.i), '{}'), coalesce(array_agg(l.id ORDER BY a.i), '{}')
          INTO o_meanwhile_at, o_meanwhile_permits
          FROM unnest(p_jobs, p_fences, p_waited_s) WITH ORDINALITY AS a(job_id, fence, waited_s, i)
          JOIN limiter_permits l
            ON l.pool = p_pool AND l.released_at IS NULL AND l.expires_at > clock_timestamp()
           AND l.job_id = a.job_id AND l.fence = a.fence
           AND l.acquired_at >= clock_timestamp() - make_interval(secs => a.waited_s);
        IF array_length(o_meanwhile_at, 1) > 0 THEN
            SELECT coalesce(array_agg(a.job_id ORDER BY a.i), '{}'), coalesce(array_agg(a.fence ORDER BY a.i), '{}'),
                   coalesce(array_agg(a.tokens ORDER BY a.i), '{}'), coalesce(array_agg(a.record ORDER BY a.i), '{}'),
                   coalesce(array_agg(a.waited_s ORDER BY a.i), '{}')
              INTO p_jobs, p_fences, p_tokens, p_record, p_waited_s
              FROM unnest(p_jobs, p_fences, p_tokens, p_record, p_waited_s) WITH ORDINALITY
                   AS a(job_id, fence, tokens, record, waited_s, i)
             WHERE a.i <> ALL (o_meanwhile_at);
        END IF;
    END IF;
    v_asked := coalesce(array_length(p_jobs, 1), 0);
    SELECT a.o_permit_ids, a.o_cooling, a.o_cooldown_left_s, a.o_requests, a.o_tokens, a.o_in_flight,
           a.o_last_second, a.o_window_frees_in_s, a.o_second_frees_in_s
      INTO o_permit_ids, o_cooling, o_cooldown_left_s, o_requests, o_tokens, o_in_flight,
           o_last_second, o_window_frees_in_s, o_second_frees_in_s
      FROM lading_limiter_acquire_many(p_pool, p_jobs, p_fences, p_tokens, p_rpm, p_tpm, p_concurrency,
                                       p_ttl_s, p_window_s, p_per_second) a;
    v_granted := coalesce(array_length(o_permit_ids, 1), 0);
    o_recorded := 0;
    IF v_granted > 0 AND v_recorded_before THEN
        DELETE FROM limiter_waiters w
         USING unnest(p_jobs[1:v_granted], p_fences[1:v_granted]) AS g(job_id, fence)
         WHERE w.pool = p_pool AND w.job_id = g.job_id AND w.fence = g.fence;
    END IF;
    IF v_granted < v_asked AND NOT o_cooling AND p_listener IS NOT NULL
       AND o_requests + 1 <= p_rpm AND o_tokens + p_tokens[v_granted + 1] <= p_tpm
       AND o_last_second + 1 <= p_per_second AND o_in_flight + 1 > p_concurrency THEN
        INSERT INTO limiter_waiters (pool, job_id, fence, tokens, listener, since)
        SELECT p_pool, a.job_id, a.fence, a.tokens, p_listener, clock_timestamp() - make_interval(secs => a.waited_s)
          FROM unnest(p_jobs, p_fences, p_tokens, p_record, p_waited_s) WITH ORDINALITY
               AS a(job_id, fence, tokens, record, waited_s, i)
         WHERE a.i > v_granted AND a.record
        ON CONFLICT (pool, job_id, fence) DO UPDATE SET listener = EXCLUDED.listener
         WHERE limiter_waiters.listener <> EXCLUDED.listener;
        GET DIAGNOSTICS o_recorded = ROW_COUNT;
    END IF;
END
$$;

-- lading_limiter_release_grant of migration 0033: p_waited_s NULL says that none of the asked
-- attempts was recorded as waiting (nothing to check or forget for them); the slot granted to
-- another replica's recorded attempt is asked of lading_limiter_acquire_many, and that one waiter
-- row is forgotten by its key.
CREATE OR REPLACE FUNCTION lading_limiter_release_grant(
    p_permit bigint, p_tokens_used bigint,
    p_pool text, p_jobs bigint[], p_fences bigint[], p_tokens integer[],
    p_rpm bigint, p_tpm bigint, p_concurrency bigint, p_ttl_s float8, p_window_s float8, p_per_second bigint,
    p_listener integer, p_waited_s float8[],
    OUT o_permit_ids bigint[], OUT o_cooling boolean, OUT o_cooldown_left_s float8,
    OUT o_requests bigint, OUT o_tokens bigint, OUT o_in_flight bigint, OUT o_last_second bigint,
    OUT o_window_frees_in_s float8, OUT o_second_frees_in_s float8, OUT o_handed_to integer,
    OUT o_meanwhile_at integer[], OUT o_meanwhile_permits bigint[])
    LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_waiter limiter_waiters%ROWTYPE;
    v_other bigint[];
    v_asked integer := coalesce(array_length(p_jobs, 1), 0);
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
    o_permit_ids := '{}';
    o_meanwhile_at := '{}';
    o_meanwhile_permits := '{}';
    IF v_asked > 0 THEN
        SELECT a.o_permit_ids, a.o_cooling, a.o_cooldown_left_s, a.o_requests, a.o_tokens, a.o_in_flight,
               a.o_last_second, a.o_window_frees_in_s, a.o_second_frees_in_s, a.o_meanwhile_at, a.o_meanwhile_permits
          INTO o_permit_ids, o_cooling, o_cooldown_left_s, o_requests, o_tokens, o_in_flight,
               o_last_second, o_window_frees_in_s, o_second_frees_in_s, o_meanwhile_at, o_meanwhile_permits
          FROM lading_limiter_acquire_recording(p_pool, p_jobs, p_fences, p_tokens, p_rpm, p_tpm, p_concurrency,
                                                p_ttl_s, p_window_s, p_per_second, NULL, NULL, p_waited_s) a;
    END IF;
    IF v_asked = 0
       OR (coalesce(array_length(o_permit_ids, 1), 0) = 0 AND array_length(o_meanwhile_at, 1) > 0) THEN
        LOOP
            SELECT * INTO v_waiter FROM limiter_waiters w
             WHERE w.pool = p_pool AND w.listener IS DISTINCT FROM p_listener
             ORDER BY w.since LIMIT 1;
            EXIT WHEN NOT FOUND;
            IF NOT EXISTS (SELECT 1 FROM pg_stat_get_activity(v_waiter.listener)) THEN
                -- Its replica is gone: forget every attempt it recorded.
                DELETE FROM limiter_waiters w WHERE w.pool = p_pool AND w.listener = v_waiter.listener;
                CONTINUE;
            END IF;
            SELECT a.o_permit_ids, a.o_cooling, a.o_cooldown_left_s, a.o_requests, a.o_tokens, a.o_in_flight,
                   a.o_last_second, a.o_window_frees_in_s, a.o_second_frees_in_s
              INTO v_other, o_cooling, o_cooldown_left_s, o_requests, o_tokens, o_in_flight,
                   o_last_second, o_window_frees_in_s, o_second_frees_in_s
              FROM lading_limiter_acquire_many(
                       p_pool, ARRAY[v_waiter.job_id], ARRAY[v_waiter.fence], ARRAY[v_waiter.tokens],
                       p_rpm, p_tpm, p_concurrency, p_ttl_s, p_window_s, p_per_second) a;
            IF coalesce(array_length(v_other, 1), 0) > 0 THEN
                DELETE FROM limiter_waiters w
                 WHERE w.pool = p_pool AND w.job_id = v_waiter.job_id AND w.fence = v_waiter.fence;
                o_handed_to := v_waiter.listener;
                PERFORM pg_notify('lading_limiter', concat_ws(E'\t', p_pool, v_waiter.listener, v_other[1],
                                                              v_waiter.job_id, v_waiter.fence, v_waiter.tokens));
                RETURN;
            END IF;
            EXIT;
        END LOOP;
    END IF;
    IF coalesce(array_length(o_permit_ids, 1), 0) = 0 THEN
        PERFORM pg_notify('lading_limiter', p_pool);
    END IF;
END
$$;
