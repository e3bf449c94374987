-- The HTTP intake (`lading api`): bearer tokens and the HTTP-level idempotency record.

-- A bearer token is scoped to namespaces; only the SHA-256 of the token is stored (the token is
-- printed once by `lading tokens create` and never again). A token is high-entropy random, so an
-- unsalted digest is enough: there is nothing to guess a dictionary of.
CREATE TABLE api_tokens (
    id           bigserial   PRIMARY KEY,
    name         text        NOT NULL UNIQUE CHECK (name ~ '^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$' AND length(name) <= 63),
    token_sha256 text        NOT NULL UNIQUE CHECK (token_sha256 ~ '^[0-9a-f]{64}$'),
    namespaces   text[]      NOT NULL CHECK (cardinality(namespaces) > 0),
    created_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    expires_at   timestamptz,
    revoked_at   timestamptz
);

-- One row per (namespace, Idempotency-Key) whose POST was answered 202: the canonical request
-- digest it was answered for and the answer itself, replayed to a retry with the same key. A
-- request still being processed holds its row uncommitted (the primary key decides concurrent
-- requests with one key); a refused request leaves no row, so its key may be used again. Rows
-- go after the retention (at least 24 h) through `api_requests_created` (the cleaner).
CREATE TABLE api_requests (
    namespace       text        NOT NULL,
    idempotency_key text        NOT NULL,
    request_sha256  text        NOT NULL,
    status          smallint    NOT NULL CHECK (status BETWEEN 200 AND 299),
    location        text        NOT NULL,
    body            jsonb       NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (namespace, idempotency_key)
);
CREATE INDEX api_requests_created ON api_requests (created_at);

-- `GET /v1/namespaces/{ns}/batches/{name}` finds the newest batch of that name in the namespace.
CREATE INDEX batches_namespace_name ON batches (namespace, name, id);
