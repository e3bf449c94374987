-- Queries of the distributed admission limiter (lading/limiting.py).

-- name: limiter_try_acquire
-- Up to N permits of pool $1 at once, in the order asked, each one request + $4[i] reserved
-- tokens + one in-flight permit for job $2[i] at fence $3[i], under limits $5 requests/min,
-- $6 tokens/min, $7 concurrent; expiring after $8 seconds; the per-minute limits counted over
-- the last $9 seconds. Requests are also paced: at most $10 in any second, so a minute's budget
-- is spread over the minute instead of sent in one burst (hosted APIs enforce per-minute limits
-- over shorter periods too). The function (migration 0014) locks the pool row first, grants a
-- prefix of what was asked and counts from the per-second rollup; see it for why.
-- The transaction commits without waiting for the WAL flush (synchronous_commit off for it
-- alone): the pool row stays locked until the commit, and every grant of every replica waits
-- behind it. What a database crash can lose is the last fraction of a second of grants and
-- releases (see migration 0028).
SELECT o_permit_ids AS permit_ids, o_cooling AS cooling, o_cooldown_left_s AS cooldown_left_s,
       o_requests AS requests, o_tokens AS tokens, o_in_flight AS in_flight, o_last_second AS last_second,
       o_window_frees_in_s AS window_frees_in_s, o_second_frees_in_s AS second_frees_in_s,
       set_config('synchronous_commit', 'off', true) AS commit_mode
  FROM lading_limiter_acquire_many($1, $2, $3, $4, $5, $6, $7, $8, $9, $10);

-- name: limiter_release
-- After the call: free the concurrency permit and settle the tokens it counts ($2: the usage to
-- count instead of the reservation; NULL keeps the reservation, e.g. a request that timed out
-- after it was sent may have been consumed, or a provider that counts reservations). The
-- rollup second of the permit follows the difference.
-- Waiting acquirers in every process are woken at once (NOTIFY on commit), not at their next poll.
-- Commits without waiting for the WAL flush, like a grant.
WITH released AS (
    UPDATE limiter_permits
       SET released_at = clock_timestamp(), tokens_used = $2
     WHERE id = $1 AND released_at IS NULL
    RETURNING id, pool, acquired_at, tokens_reserved, tokens_used
), rolled AS (
    UPDATE limiter_seconds s
       SET tokens = s.tokens + (r.tokens_used - r.tokens_reserved)
      FROM released r
     WHERE r.tokens_used IS NOT NULL AND r.tokens_used <> r.tokens_reserved
       AND s.pool = r.pool AND s.second = date_trunc('second', r.acquired_at)
)
SELECT id, pg_notify('lading_limiter', pool), set_config('synchronous_commit', 'off', true) FROM released;

-- name: limiter_acquire_recording
-- limiter_try_acquire ($1..$10), and when the next asked permit is refused for concurrency alone,
-- the attempts not granted whose $12[i] is set are recorded as waiting in the replica whose
-- LISTEN connection has backend pid $11, since $13[i] seconds ago (migration 0033): a release in
-- another replica may then grant one of them its slot directly. Granted attempts are forgotten.
-- An asked attempt granted a permit by such a release while it waited is not granted another:
-- meanwhile_at (1-based positions in the asked arrays) and meanwhile_permits name them, and
-- permit_ids go to a prefix of the other asked attempts.
SELECT o_permit_ids AS permit_ids, o_cooling AS cooling, o_cooldown_left_s AS cooldown_left_s,
       o_requests AS requests, o_tokens AS tokens, o_in_flight AS in_flight, o_last_second AS last_second,
       o_window_frees_in_s AS window_frees_in_s, o_second_frees_in_s AS second_frees_in_s,
       o_recorded AS recorded, o_meanwhile_at AS meanwhile_at, o_meanwhile_permits AS meanwhile_permits
  FROM lading_limiter_acquire_recording($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13);

-- name: limiter_release_grant
-- Release permit $1 ($2: the tokens to count, NULL keeps the reservation), then in the same
-- transaction (migration 0033): ask for the permits of $4/$5/$6 (this replica's own waiting
-- attempts, waiting for $14 seconds, NULL when none of them was recorded as waiting (migration
-- 0040): those granted meanwhile elsewhere are named as in
-- limiter_acquire_recording) under limits $7..$12 like limiter_try_acquire; or, with none asked, grant the slot to
-- the longest-waiting recorded attempt of another replica than the one listening as backend pid
-- $13, and NOTIFY it the permit; when nothing was granted, NOTIFY every replica (payload: $3).
-- handed_to: the listener pid of the replica granted the slot, NULL when none was.
SELECT o_permit_ids AS permit_ids, o_cooling AS cooling, o_cooldown_left_s AS cooldown_left_s,
       o_requests AS requests, o_tokens AS tokens, o_in_flight AS in_flight, o_last_second AS last_second,
       o_window_frees_in_s AS window_frees_in_s, o_second_frees_in_s AS second_frees_in_s,
       o_handed_to AS handed_to, o_meanwhile_at AS meanwhile_at, o_meanwhile_permits AS meanwhile_permits
  FROM lading_limiter_release_grant($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14);

-- name: limiter_waiters_forget
-- The replica listening as backend pid $2 stops: forget the attempts it recorded as waiting for
-- pool $1, so that no release grants them a slot.
DELETE FROM limiter_waiters WHERE pool = $1 AND listener = $2;

-- name: limiter_observe
-- The provider's x-ratelimit-* headers for pool $1: $2 requests left, whole again in $3 s; $4
-- tokens left, whole again in $5 s (NULL: not said). Where they show less room than the local
-- view (limits $6 requests/min, $7 tokens/min over $8 s), the local view is tightened to them
-- (migration 0014). Returns what was added.
SELECT o_requests_added AS requests_added, o_tokens_added AS tokens_added
  FROM lading_limiter_observe($1, $2, $3, $4, $5, $6, $7, $8);

-- name: limiter_cooldown
-- Cool pool $1 down for $2 seconds (never shortening a longer cooldown); returns how long the
-- pool now cools down, in seconds.
UPDATE pools
   SET cooldown_until = greatest(coalesce(cooldown_until, clock_timestamp()),
                                 clock_timestamp() + make_interval(secs => $2)),
       updated_at = clock_timestamp()
 WHERE name = $1
RETURNING extract(epoch FROM cooldown_until - clock_timestamp())::float8 AS cooldown_left_s;

-- name: limiter_prune
-- Forget permits of pool $1 that no longer count for anything: out of the window and released
-- or expired. Locked in id order, skipping rows another pruner is already deleting. Also forget
-- the waiting attempts recorded by replicas whose LISTEN connection is gone (migration 0033),
-- skipping those a release is deleting.
WITH dead AS (
    SELECT w.pool, w.job_id, w.fence
      FROM limiter_waiters w
     WHERE w.pool = $1 AND NOT EXISTS (SELECT 1 FROM pg_stat_get_activity(w.listener))
     ORDER BY w.pool, w.job_id, w.fence
       FOR UPDATE SKIP LOCKED
), gone AS (
    DELETE FROM limiter_waiters w
     USING dead d
     WHERE w.pool = d.pool AND w.job_id = d.job_id AND w.fence = d.fence
), doomed AS (
    SELECT p.id
      FROM limiter_permits p
     WHERE p.pool = $1
       AND p.acquired_at < clock_timestamp() - interval '120 seconds'
       AND (p.released_at IS NOT NULL OR p.expires_at < clock_timestamp())
     ORDER BY p.id
       FOR UPDATE SKIP LOCKED
)
DELETE FROM limiter_permits p
 USING doomed d
 WHERE p.id = d.id;

-- name: limiter_prune_seconds
-- Forget rollup seconds of pool $1 that left every window. Locked in key order, skipping rows
-- another pruner is already deleting.
WITH doomed AS (
    SELECT s.pool, s.second
      FROM limiter_seconds s
     WHERE s.pool = $1 AND s.second < clock_timestamp() - interval '120 seconds'
     ORDER BY s.pool, s.second
       FOR UPDATE SKIP LOCKED
)
DELETE FROM limiter_seconds s
 USING doomed d
 WHERE s.pool = d.pool AND s.second = d.second;

-- name: limiter_usage
-- What pool $1 used in the last $2 seconds (requests and tokens as the limiter counts them, the
-- provider's view included), and its permits in flight: for status and tests.
SELECT w.o_requests AS requests, w.o_tokens AS tokens,
       (SELECT count(*) FROM limiter_permits l
         WHERE l.pool = $1 AND l.released_at IS NULL AND l.expires_at > clock_timestamp()) AS in_flight
  FROM lading_limiter_window($1, clock_timestamp() - make_interval(secs => $2)) w;

-- name: limiter_permit_delete_expired
-- Retention (worker/lading_worker/cleaning.py): at most $2 permits acquired more than $1 seconds ago that no
-- longer hold a slot (released, or past their expiry). A held permit never qualifies, whatever
-- its age. Oldest first through limiter_permits_acquired (migration 0016); SKIP LOCKED.
WITH doomed AS (
    SELECT id FROM limiter_permits
     WHERE acquired_at < now() - make_interval(secs => $1)
       AND (released_at IS NOT NULL OR expires_at < now())
     ORDER BY acquired_at
     LIMIT $2
       FOR UPDATE SKIP LOCKED
), gone AS (
    DELETE FROM limiter_permits p USING doomed d WHERE p.id = d.id RETURNING 1
)
SELECT count(*)::bigint FROM gone;

-- name: limiter_permit_oldest_age
SELECT extract(epoch FROM clock_timestamp() - min(acquired_at))::float8 FROM limiter_permits;

-- name: limiter_second_delete_expired
-- Retention: at most $2 per-second sums older than $1 seconds (limiter_seconds_second).
WITH doomed AS (
    SELECT pool, second FROM limiter_seconds
     WHERE second < now() - make_interval(secs => $1)
     ORDER BY second
     LIMIT $2
       FOR UPDATE SKIP LOCKED
), gone AS (
    DELETE FROM limiter_seconds s USING doomed d WHERE s.pool = d.pool AND s.second = d.second RETURNING 1
)
SELECT count(*)::bigint FROM gone;

-- name: limiter_second_oldest_age
SELECT extract(epoch FROM clock_timestamp() - min(second))::float8 FROM limiter_seconds;

-- name: limiter_estimates_of_pool
-- What pool $1's provider was seen to count for a prompt, per schema: the factor on the local
-- estimate, and how many answers it was learned from.
SELECT schema, factor, samples FROM limiter_estimates WHERE pool = $1 ORDER BY schema;

-- name: limiter_estimate_upsert
-- Record what a worker learned for pool $1 and schema $2: factor $3 from $4 answers. The latest
-- worker's view wins (every worker learns from the same provider).
INSERT INTO limiter_estimates AS e (pool, schema, factor, samples)
VALUES ($1, $2, $3, $4)
ON CONFLICT (pool, schema) DO UPDATE
   SET factor = EXCLUDED.factor, samples = EXCLUDED.samples, updated_at = clock_timestamp();
