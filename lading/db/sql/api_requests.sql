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

-- name: api_request_claim_many
-- api_request_claim for keys ($1[i] namespace, $2[i] key) with digests $3[i] at once, in the order
-- given (callers sort them: one lock order), with the transaction's lock_timeout set to $4 (e.g.
-- '200ms': how long a key another transaction holds is waited for, then the statement fails) for
-- the claims and to $5 once they are made, in this one round trip: the one-time filter sets $4
-- before the first row is inserted, and the aggregate sets $5 after the last. Returns the keys
-- that are ours now, as two arrays.
WITH wait AS MATERIALIZED (
    SELECT set_config('lock_timeout', $4, true) AS lock_timeout
), claimed AS (
    INSERT INTO api_requests (namespace, idempotency_key, request_sha256, status, location, body)
    SELECT k.namespace, k.idempotency_key, k.request_sha256, 202, '', '{}'::jsonb
      FROM unnest($1::text[], $2::text[], $3::text[]) AS k(namespace, idempotency_key, request_sha256)
     WHERE (SELECT lock_timeout FROM wait) IS NOT NULL
    ON CONFLICT (namespace, idempotency_key) DO NOTHING
    RETURNING namespace, idempotency_key
)
SELECT coalesce(array_agg(namespace), '{}') AS namespaces, coalesce(array_agg(idempotency_key), '{}') AS keys,
       set_config('lock_timeout', $5, true) AS lock_timeout
  FROM claimed;

-- name: api_request_get_many
SELECT r.namespace, r.idempotency_key, r.request_sha256, r.status, r.location, r.body, r.created_at
  FROM unnest($1::text[], $2::text[]) AS k(namespace, idempotency_key)
  JOIN api_requests r ON r.namespace = k.namespace AND r.idempotency_key = k.idempotency_key;

-- name: api_request_release_many
-- Keys ($1[i], $2[i]) claimed in the caller's transaction for requests that were refused: no
-- record is kept (as when a single request's transaction rolls back).
DELETE FROM api_requests r
 USING unnest($1::text[], $2::text[]) AS k(namespace, idempotency_key)
 WHERE r.namespace = k.namespace AND r.idempotency_key = k.idempotency_key;

-- name: api_request_answer_many
-- api_request_answer for keys ($1[i], $2[i]): status $3[i], Location $4[i], body $5[i] (JSON text).
UPDATE api_requests r SET status = k.status, location = k.location, body = k.body::jsonb
  FROM unnest($1::text[], $2::text[], $3::integer[], $4::text[], $5::text[])
       AS k(namespace, idempotency_key, status, location, body)
 WHERE r.namespace = k.namespace AND r.idempotency_key = k.idempotency_key;
