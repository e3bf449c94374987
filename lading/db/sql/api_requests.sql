-- The HTTP intake's idempotency record (migration 0020): one row per (namespace, Idempotency-Key)
-- answered 202, with the canonical request digest and the answer to replay.

-- name: api_request_claim
-- Take key ($1 namespace, $2 key) for a request with digest $3, inside the caller's transaction:
-- returns the row when it is ours now; nothing when the key was answered before (read it with
-- api_request_get). A concurrent request with the same key waits here for the first's outcome
-- (bounded by the transaction's lock_timeout: the key is in progress). The placeholder answer is
-- replaced by api_request_answer before the caller commits, so no other transaction ever sees it.
INSERT INTO api_requests (namespace, idempotency_key, request_sha256, status, location, body)
VALUES ($1, $2, $3, 202, '', '{}'::jsonb)
ON CONFLICT (namespace, idempotency_key) DO NOTHING
RETURNING request_sha256;

-- name: api_request_get
SELECT request_sha256, status, location, body, created_at
  FROM api_requests
 WHERE namespace = $1 AND idempotency_key = $2;

-- name: api_request_answer
-- The answer to replay for key ($1, $2): status $3, Location $4, body $5.
UPDATE api_requests SET status = $3, location = $4, body = $5
 WHERE namespace = $1 AND idempotency_key = $2;

-- name: api_request_delete_expired
-- Retention (lading/cleaning.py): at most $2 records answered more than $1 seconds ago, oldest
-- first through api_requests_created, SKIP LOCKED (a record being written is never waited on).
WITH doomed AS (
    SELECT ctid AS row_id FROM api_requests
     WHERE created_at < now() - make_interval(secs => $1)
     ORDER BY created_at
     LIMIT $2
       FOR UPDATE SKIP LOCKED
), gone AS (
    DELETE FROM api_requests WHERE ctid = ANY (ARRAY(SELECT row_id FROM doomed)) RETURNING 1
)
SELECT count(*)::bigint FROM gone;

-- name: api_request_oldest_age
SELECT extract(epoch FROM clock_timestamp() - min(created_at))::float8 FROM api_requests;

-- name: api_request_commit_lazily
-- For the rest of the caller's transaction: its commit does not wait for the WAL flush. Safe for
-- the idempotency record alone: the acceptance it records committed durably before, and is itself
-- idempotent, so a record lost in a crash only means a retry is accepted again into the same job.
SET LOCAL synchronous_commit = off;

-- name: api_request_get_many
SELECT r.namespace, r.idempotency_key, r.request_sha256, r.status, r.location, r.body, r.created_at
  FROM unnest($1::text[], $2::text[]) AS k(namespace, idempotency_key)
  JOIN api_requests r ON r.namespace = k.namespace AND r.idempotency_key = k.idempotency_key;
