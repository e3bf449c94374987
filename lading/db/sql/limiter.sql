-- Queries of the distributed admission limiter (lading/limiting.py).

-- name: limiter_lock_pool
-- Serialise acquisitions of pool $1 for the rest of the transaction; returns its cooldown.
-- A separate statement on purpose: the usage query that follows must run with a snapshot taken
-- AFTER this lock is held, or it could miss a permit committed while we waited for the lock.
SELECT cooldown_until, cooldown_until > clock_timestamp() AS cooling,
       extract(epoch FROM cooldown_until - clock_timestamp())::float8 AS cooldown_left_s
  FROM pools WHERE name = $1 FOR UPDATE;

-- name: limiter_try_acquire
-- One request + $4 reserved tokens + one in-flight permit of pool $1, all three or none, under
-- limits $5 requests/min, $6 tokens/min, $7 concurrent; for job $2 at fence $3, expiring after
-- $8 seconds, counting the last $9 seconds as the window. Requests are also paced: at most $10
-- in any second, so a minute's budget is spread over the minute instead of sent in one burst
-- (hosted APIs enforce per-minute limits over shorter periods too). Returns the permit id
-- (NULL when refused) and the usage that decided.
WITH usage AS (
    SELECT count(*) FILTER (WHERE acquired_at > clock_timestamp() - make_interval(secs => $9)) AS requests,
           coalesce(sum(coalesce(tokens_used, tokens_reserved))
                    FILTER (WHERE acquired_at > clock_timestamp() - make_interval(secs => $9)), 0) AS tokens,
           count(*) FILTER (WHERE released_at IS NULL AND expires_at > clock_timestamp()) AS in_flight,
           min(acquired_at) FILTER (WHERE acquired_at > clock_timestamp() - make_interval(secs => $9)) AS oldest,
           count(*) FILTER (WHERE acquired_at > clock_timestamp() - interval '1 second') AS last_second,
           min(acquired_at) FILTER (WHERE acquired_at > clock_timestamp() - interval '1 second') AS oldest_in_second
      FROM limiter_permits
     WHERE pool = $1
       AND (acquired_at > clock_timestamp() - make_interval(secs => $9)
            OR (released_at IS NULL AND expires_at > clock_timestamp()))
), granted AS (
    INSERT INTO limiter_permits (pool, job_id, fence, tokens_reserved, expires_at)
    SELECT $1, $2, $3, $4::integer, clock_timestamp() + make_interval(secs => $8)
      FROM usage
     WHERE usage.requests + 1 <= $5::bigint AND usage.tokens + $4::integer <= $6::bigint AND usage.in_flight + 1 <= $7::bigint
       AND usage.last_second + 1 <= $10::bigint
    RETURNING id
)
SELECT (SELECT id FROM granted) AS permit_id, u.requests, u.tokens, u.in_flight, u.last_second,
       extract(epoch FROM u.oldest + make_interval(secs => $9) - clock_timestamp())::float8 AS window_frees_in_s,
       extract(epoch FROM u.oldest_in_second + interval '1 second' - clock_timestamp())::float8 AS second_frees_in_s
  FROM usage u;

-- name: limiter_release
-- After the call: free the concurrency permit and reconcile the reservation with the tokens the
-- provider reported ($2; NULL keeps the reservation, e.g. a request that timed out after it was
-- sent may have been consumed).
-- Waiting acquirers in every process are woken at once (NOTIFY on commit), not at their next poll.
UPDATE limiter_permits
   SET released_at = clock_timestamp(), tokens_used = $2
 WHERE id = $1 AND released_at IS NULL
RETURNING id, pg_notify('lading_limiter', pool);

-- name: limiter_cooldown
-- Cool pool $1 down for $2 seconds (never shortening a longer cooldown).
UPDATE pools
   SET cooldown_until = greatest(coalesce(cooldown_until, clock_timestamp()),
                                 clock_timestamp() + make_interval(secs => $2)),
       updated_at = clock_timestamp()
 WHERE name = $1
RETURNING cooldown_until;

-- name: limiter_prune
-- Forget permits of pool $1 that no longer count for anything: out of the window and released
-- or expired.
DELETE FROM limiter_permits
 WHERE pool = $1
   AND acquired_at < clock_timestamp() - interval '120 seconds'
   AND (released_at IS NOT NULL OR expires_at < clock_timestamp());

-- name: limiter_usage
-- What pool $1 used in the last minute, for status and tests.
SELECT count(*) FILTER (WHERE acquired_at > clock_timestamp() - interval '60 seconds') AS requests,
       coalesce(sum(coalesce(tokens_used, tokens_reserved))
                FILTER (WHERE acquired_at > clock_timestamp() - interval '60 seconds'), 0)::bigint AS tokens,
       count(*) FILTER (WHERE released_at IS NULL AND expires_at > clock_timestamp()) AS in_flight
  FROM limiter_permits
 WHERE pool = $1;
