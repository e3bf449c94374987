-- A release hands its slot to the longest-waiting attempt of another replica in its own
-- transaction, and the NOTIFY carries the grant (lading/limiting.py).
--
-- Until now a release that did not hand its slot to an attempt of its own process (none waited,
-- or it had already handed over `handoff_streak` slots in a row) freed the slot and NOTIFYed
-- every replica. Each replica's asker then woke and asked for it, and all but one were refused:
-- the slot stood empty for a NOTIFY, a wake-up and a grant query, and every replica paid a query.
--
-- Now a replica whose ask is refused for concurrency records its waiting attempts here, with its
-- LISTEN connection's backend pid. Such a release grants the slot, under the pool's row lock like
-- every grant, to the attempt of another replica that has waited longest, and NOTIFYs that
-- replica the permit (payload: pool, listener pid, permit, job, fence, tokens, tab-separated).
-- The slot is never free between the release and the grant. Only when no other replica's
-- attempt is recorded, or the grant is refused (requests, tokens, pacing, cooldown), does the
-- release NOTIFY every replica with the pool's name, as before.
--
-- An attempt is recorded once, and forgotten when granted (by whichever path) or when its
-- replica's LISTEN connection is gone. A recorded attempt that gave up meanwhile is granted
-- all the same; its replica gives the permit straight back (a release). Waiters only say who
-- waits: the table is UNLOGGED (nothing of it needs to survive a crash of the database).
CREATE UNLOGGED TABLE limiter_waiters (
    pool      text        NOT NULL,
    job_id    bigint      NOT NULL,
    fence     bigint      NOT NULL,
    tokens    integer     NOT NULL CHECK (tokens >= 0),
    listener  integer     NOT NULL,   -- pg_backend_pid() of the waiting replica's LISTEN connection
    since     timestamptz NOT NULL,   -- when the attempt began to wait
    PRIMARY KEY (pool, job_id, fence)
);
CREATE INDEX limiter_waiters_oldest ON limiter_waiters (pool, since);

-- Forget the recorded waiters of pool p_pool among (p_jobs, p_fences): they were just granted.
CREATE FUNCTION lading_limiter_waiters_granted(p_pool text, p_jobs bigint[], p_fences bigint[])
    RETURNS void LANGUAGE sql VOLATILE AS $$
    DELETE FROM limiter_waiters w
     USING unnest(p_jobs, p_fences) AS g(job_id, fence)
     WHERE w.pool = p_pool AND w.job_id = g.job_id AND w.fence = g.fence;
$$;

-- The asked attempts (p_jobs, p_fences) that waited p_waited_s seconds, which a release in another
-- replica granted a permit since (its NOTIFY may not have been heard yet): their position in the
-- asked arrays (1-based) and permit.
CREATE FUNCTION lading_limiter_granted_meanwhile(
    p_pool text, p_jobs bigint[], p_fences bigint[], p_waited_s float8[],
    OUT o_at integer[], OUT o_permits bigint[])
    LANGUAGE sql STABLE AS $$
    SELECT coalesce(array_agg(a.i::integer ORDER BY a.i), '{}'), coalesce(array_agg(l.id ORDER BY a.i), '{}')
      FROM unnest(p_jobs, p_fences, p_waited_s) WITH ORDINALITY AS a(job_id, fence, waited_s, i)
      JOIN limiter_permits l
        ON l.pool = p_pool AND l.released_at IS NULL AND l.expires_at > clock_timestamp()
       AND l.job_id = a.job_id AND l.fence = a.fence
       AND l.acquired_at >= clock_timestamp() - make_interval(secs => a.waited_s);
$$;

-- lading_limiter_acquire_many, and, when the next asked permit is refused for concurrency alone,
-- record the asked attempts not granted whose p_record flag is set (those not recorded before) as
-- waiting in replica p_listener, since p_waited_s seconds ago. An asked attempt that a release in
-- another replica granted a permit while it waited is not granted a second one: o_meanwhile_at
-- and o_meanwhile_permits say which it is and its permit, and o_permit_ids are granted to a prefix
-- of the others.
CREATE FUNCTION lading_limiter_acquire_recording(
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
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    PERFORM 1 FROM pools p WHERE p.name = p_pool FOR UPDATE;  -- before reading what was granted meanwhile
    o_meanwhile_at := '{}';
    o_meanwhile_permits := '{}';
    IF p_waited_s IS NOT NULL THEN
        SELECT g.o_at, g.o_permits INTO o_meanwhile_at, o_meanwhile_permits
          FROM lading_limiter_granted_meanwhile(p_pool, p_jobs, p_fences, p_waited_s) g;
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
    IF v_granted > 0 THEN
        PERFORM lading_limiter_waiters_granted(p_pool, p_jobs[1:v_granted], p_fences[1:v_granted]);
    END IF;
    IF v_granted < v_asked AND NOT o_cooling AND p_listener IS NOT NULL
       AND o_requests + 1 <= p_rpm AND o_tokens + p_tokens[v_granted + 1] <= p_tpm
       AND o_last_second + 1 <= p_per_second AND o_in_flight + 1 > p_concurrency THEN
        INSERT INTO limiter_waiters (pool, job_id, fence, tokens, listener, since)
        SELECT p_pool, a.job_id, a.fence, a.tokens, p_listener, clock_timestamp() - make_interval(secs => a.waited_s)
          FROM unnest(p_jobs, p_fences, p_tokens, p_record, p_waited_s) WITH ORDINALITY
               AS a(job_id, fence, tokens, record, waited_s, i)
         WHERE a.i > v_granted AND a.record
        ON CONFLICT (pool, job_id, fence) DO NOTHING;
        GET DIAGNOSTICS o_recorded = ROW_COUNT;
    END IF;
END
$$;

-- Release permit p_permit (settling its tokens to p_tokens_used; NULL keeps the reservation), then,
-- in the same transaction under the pool's row lock:
--   1. ask for the permits of (p_jobs, p_fences, p_tokens): the releasing replica's own waiting
--      attempts, which have waited p_waited_s (lading_limiter_release_acquire of migration 0028,
--      and an attempt granted a permit meanwhile by another replica's release is not granted a
--      second: lading_limiter_acquire_recording);
--   2. when none was asked (p_jobs empty), or those asked were granted meanwhile, grant the slot
--      to the longest-waiting recorded attempt of another replica whose LISTEN connection is
--      alive, and NOTIFY it the permit;
--   3. when nothing was granted, NOTIFY every replica with the pool's name.
-- o_handed_to: the listener pid of the replica granted in 2, NULL otherwise.
CREATE FUNCTION lading_limiter_release_grant(
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
    IF coalesce(array_length(p_jobs, 1), 0) > 0 THEN
        SELECT a.o_permit_ids, a.o_cooling, a.o_cooldown_left_s, a.o_requests, a.o_tokens, a.o_in_flight,
               a.o_last_second, a.o_window_frees_in_s, a.o_second_frees_in_s, a.o_meanwhile_at, a.o_meanwhile_permits
          INTO o_permit_ids, o_cooling, o_cooldown_left_s, o_requests, o_tokens, o_in_flight,
               o_last_second, o_window_frees_in_s, o_second_frees_in_s, o_meanwhile_at, o_meanwhile_permits
          FROM lading_limiter_acquire_recording(p_pool, p_jobs, p_fences, p_tokens, p_rpm, p_tpm, p_concurrency,
                                                p_ttl_s, p_window_s, p_per_second, NULL, NULL, p_waited_s) a;
    END IF;
    IF coalesce(array_length(p_jobs, 1), 0) = 0
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
              FROM lading_limiter_acquire_recording(
                       p_pool, ARRAY[v_waiter.job_id], ARRAY[v_waiter.fence], ARRAY[v_waiter.tokens],
                       p_rpm, p_tpm, p_concurrency, p_ttl_s, p_window_s, p_per_second, NULL, NULL, NULL) a;
            IF coalesce(array_length(v_other, 1), 0) > 0 THEN
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
