-- stale_completions: completions that arrived under a lost lease or an old fence (written by
-- job_finish_many in jobs.sql).

-- name: stale_completion_count_report
-- Completions discarded in the last $1 seconds (stale_completions_at, migration 0002).
SELECT count(*)::bigint FROM stale_completions WHERE at > now() - make_interval(secs => $1);

-- name: stale_completion_delete_expired
-- Retention (worker/lading_worker/cleaning.py): at most $2 records older than $1 seconds, oldest first through
-- stale_completions_at. The table has no key: rows are named by ctid within the statement, as an
-- array, so the delete is a TID scan (joined, the planner may hash the whole table).
WITH doomed AS (
    SELECT ctid AS row_id FROM stale_completions
     WHERE at < now() - make_interval(secs => $1)
     ORDER BY at
     LIMIT $2
       FOR UPDATE SKIP LOCKED
), gone AS (
    DELETE FROM stale_completions WHERE ctid = ANY (ARRAY(SELECT row_id FROM doomed)) RETURNING 1
)
SELECT count(*)::bigint FROM gone;

-- name: stale_completion_oldest_age
SELECT extract(epoch FROM clock_timestamp() - min(at))::float8 FROM stale_completions;
