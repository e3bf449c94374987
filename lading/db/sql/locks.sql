-- Lock waits of the caller's transaction.

-- name: lock_timeout_set_local
-- Wait at most $1 (e.g. '5000ms') for any lock until this transaction ends (set_config's
-- is_local): a statement still waiting then fails with lock_not_available (SQLSTATE 55P03).
SELECT set_config('lock_timeout', $1, true);

-- name: lock_try_session
-- Take session-level advisory lock $1 without waiting: true when this session now holds it. It
-- is held until released or until the session ends (a dead process's connection frees it).
SELECT pg_try_advisory_lock($1);
