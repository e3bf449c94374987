-- The limiter's per-minute counts from a per-second rollup, and grants in batches
-- (lading/limiting.py).
--
-- Until now each grant counted the last 61 s of permit rows: a pool allowed 60,000 requests a
-- minute read up to 60,000 index entries per grant. `limiter_seconds` keeps, per pool and per
-- whole second, the requests and tokens granted in it (tokens as the limiter counts them: the
-- reservation, or the usage it was reconciled to). A grant now reads at most one second of
-- permit rows (the partial second at the window's edge, exactly) plus about 61 rollup rows,
-- whatever the rate.
--
-- The rollup also carries what the provider said that the limiter had not seen
-- (`x-ratelimit-remaining-*` lower than the local view): that difference is added to the second
-- that leaves the window when the provider's own window resets, so the local view is never
-- looser than the provider's.
CREATE TABLE limiter_seconds (
    pool     text        NOT NULL,
    second   timestamptz NOT NULL,   -- date_trunc('second', acquired_at) of the permits it sums
    requests bigint      NOT NULL DEFAULT 0,
    tokens   bigint      NOT NULL DEFAULT 0,
    PRIMARY KEY (pool, second)
);

INSERT INTO limiter_seconds (pool, second, requests, tokens)
SELECT pool, date_trunc('second', acquired_at), count(*), sum(coalesce(tokens_used, tokens_reserved))
  FROM limiter_permits
 GROUP BY 1, 2;

DROP FUNCTION lading_limiter_acquire(text, bigint, bigint, integer, bigint, bigint, bigint, float8, float8, bigint);

-- Requests and tokens of pool p_pool in the window (p_edge, now]: the partial second at the edge
-- from the permit rows, every later second from the rollup. Exact, and bounded by one second of
-- permits. o_oldest is when the window's oldest counted request was made (a rollup row counts
-- from the start of its second: earlier, so a refused asker never sleeps past the moment).
CREATE FUNCTION lading_limiter_window(
    p_pool text, p_edge timestamptz,
    OUT o_requests bigint, OUT o_tokens bigint, OUT o_oldest timestamptz)
    LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_edge_ceil timestamptz := date_trunc('second', p_edge) + interval '1 second';
    v_requests bigint;
    v_tokens bigint;
    v_oldest timestamptz;
BEGIN
    SELECT count(*), coalesce(sum(coalesce(l.tokens_used, l.tokens_reserved)), 0), min(l.acquired_at)
      INTO o_requests, o_tokens, o_oldest
      FROM limiter_permits l
     WHERE l.pool = p_pool AND l.acquired_at > p_edge AND l.acquired_at < v_edge_ceil;
    SELECT coalesce(sum(s.requests), 0), coalesce(sum(s.tokens), 0), min(s.second) FILTER (WHERE s.requests > 0 OR s.tokens > 0)
      INTO v_requests, v_tokens, v_oldest
      FROM limiter_seconds s
     WHERE s.pool = p_pool AND s.second >= v_edge_ceil;
    o_requests := o_requests + v_requests;
    o_tokens := o_tokens + v_tokens;
    o_oldest := coalesce(o_oldest, v_oldest);
END
$$;

-- One round trip grants as many of the asked permits as fit, in the order asked (FIFO: it
-- stops at the first that does not fit). Each asked permit is one request + its reserved tokens
-- (p_tokens[i]) + one in-flight permit, for job p_jobs[i] at fence p_fences[i]. Limits: p_rpm
-- requests and p_tpm tokens in any p_window_s seconds, p_concurrency in flight, p_per_second
-- requests in any second (pacing). The pool row is locked first, then every count is taken
-- with a snapshot from after the lock (each statement of a VOLATILE plpgsql function takes a
-- new one under READ COMMITTED): two replicas can never both take the last permit. All the
-- permits of one call carry the same acquired_at, so they fall into one rollup second.
-- o_permit_ids are the granted permits in order; the other outputs are the pool's counts after
-- the grants, for the caller to say why the next one was refused and when to ask again.
CREATE FUNCTION lading_limiter_acquire_many(
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
    SELECT count(*), min(l.acquired_at) INTO o_last_second, v_oldest_in_second
      FROM limiter_permits l
     WHERE l.pool = p_pool AND l.acquired_at > v_now - interval '1 second';
    FOR i IN 1 .. coalesce(array_length(p_tokens, 1), 0) LOOP
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

-- What the provider's x-ratelimit-* headers said: p_remaining_requests requests and
-- p_remaining_tokens tokens left, whole again in p_requests_reset_s / p_tokens_reset_s. Where
-- the provider has less left than the local view (p_rpm / p_tpm minus the window's counts), the
-- difference is added to the rollup second that leaves the window when the provider's resets
-- (rounded up to the next second):
-- the local view tightens to the provider's and loosens when the provider's does. A NULL says
-- nothing. Under the pool row's lock, like a grant, so observations and grants are serialized.
-- Returns the requests and tokens added.
CREATE FUNCTION lading_limiter_observe(
    p_pool text, p_remaining_requests bigint, p_requests_reset_s float8,
    p_remaining_tokens bigint, p_tokens_reset_s float8,
    p_rpm bigint, p_tpm bigint, p_window_s float8,
    OUT o_requests_added bigint, OUT o_tokens_added bigint)
    LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_now timestamptz;
    v_requests bigint;
    v_tokens bigint;
    v_edge timestamptz;
BEGIN
    o_requests_added := 0;
    o_tokens_added := 0;
    PERFORM 1 FROM pools p WHERE p.name = p_pool FOR UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    v_now := clock_timestamp();
    v_edge := v_now - make_interval(secs => p_window_s);
    SELECT w.o_requests, w.o_tokens INTO v_requests, v_tokens FROM lading_limiter_window(p_pool, v_edge) w;
    IF p_remaining_requests IS NOT NULL AND p_remaining_requests < p_rpm - v_requests THEN
        o_requests_added := p_rpm - v_requests - p_remaining_requests;
        INSERT INTO limiter_seconds AS s (pool, second, requests)
        VALUES (p_pool,
                date_trunc('second', v_edge + make_interval(secs => least(greatest(coalesce(p_requests_reset_s, p_window_s), 0.0),
                                                                          p_window_s))) + interval '1 second',
                o_requests_added)
        ON CONFLICT (pool, second) DO UPDATE SET requests = s.requests + EXCLUDED.requests;
    END IF;
    IF p_remaining_tokens IS NOT NULL AND p_remaining_tokens < p_tpm - v_tokens THEN
        o_tokens_added := p_tpm - v_tokens - p_remaining_tokens;
        INSERT INTO limiter_seconds AS s (pool, second, tokens)
        VALUES (p_pool,
                date_trunc('second', v_edge + make_interval(secs => least(greatest(coalesce(p_tokens_reset_s, p_window_s), 0.0),
                                                                          p_window_s))) + interval '1 second',
                o_tokens_added)
        ON CONFLICT (pool, second) DO UPDATE SET tokens = s.tokens + EXCLUDED.tokens;
    END IF;
END
$$;
