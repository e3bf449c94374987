-- The HTTP intake's bearer tokens (migration 0020): only a token's SHA-256 is stored.

-- name: api_token_insert
-- A new token; nothing when the name is taken (the caller says so).
INSERT INTO api_tokens (name, token_sha256, namespaces, expires_at)
VALUES ($1, $2, $3, $4)
ON CONFLICT (name) DO NOTHING
RETURNING id, name, namespaces, created_at, expires_at, revoked_at;

-- name: api_token_authenticate
-- The namespaces a presented token (by its digest $1) may act in: nothing when it is unknown,
-- revoked or expired, judged by the database clock.
SELECT name, namespaces
  FROM api_tokens
 WHERE token_sha256 = $1
   AND revoked_at IS NULL
   AND (expires_at IS NULL OR expires_at > clock_timestamp());

-- name: api_token_list
SELECT name, namespaces, created_at, expires_at, revoked_at,
       (revoked_at IS NULL AND (expires_at IS NULL OR expires_at > clock_timestamp())) AS active
  FROM api_tokens
 ORDER BY name;

-- name: api_token_revoke
-- Revoke token $1 by name, at once (every later request with it answers 401); returns nothing when
-- there is no such token. Revoking twice keeps the first time.
UPDATE api_tokens SET revoked_at = coalesce(revoked_at, clock_timestamp())
 WHERE name = $1
RETURNING name, revoked_at;
