-- stale_completions: completions that arrived under a lost lease or an old fence (written by
-- job_finish_many in jobs.sql).

-- name: stale_completion_count_report
-- Completions discarded in the last $1 seconds (stale_completions_at, migration 0002).
SELECT count(*)::bigint FROM stale_completions WHERE at > now() - make_interval(secs => $1);
