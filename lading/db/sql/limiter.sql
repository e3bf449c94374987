-- Queries of the distributed admission limiter (lading/limiting.py).

-- name: limiter_try_acquire
-- One request + $4 reserved tokens + one in-flight permit of pool $1, all three or none, under
-- limits $5 requests/min, $6 tokens/min, $7 concurrent; for job $2 at fence $3, expiring after
-- $8 seconds; the per-minute limits counted over the last $9 seconds. Requests are also paced:
-- at most $10 in any second, so a minute's budget is spread over the minute instead of sent in
-- one burst (hosted APIs enforce per-minute limits over shorter periods too). The function
-- (migration 0011) locks the pool row first; see it for why that must be its own statement.
SELECT o_permit_id AS permit_id, o_cooling AS cooling, o_cooldown_left_s AS cooldown_left_s,
       o_requests AS requests, o_tokens AS tokens, o_in_flight AS in_flight, o_last_second AS last_second,
       o_window_frees_in_s AS window_frees_in_s, o_second_frees_in_s AS second_frees_in_s
  FROM lading_limiter_acquire($1, $2, $3, $4, $5, $6, $7, $8, $9, $10);

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
