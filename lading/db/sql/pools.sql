-- name: pool_upsert
INSERT INTO pools (name, provider, model, spec, paused)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (name) DO UPDATE
   SET provider = EXCLUDED.provider, model = EXCLUDED.model, spec = EXCLUDED.spec, paused = EXCLUDED.paused,
       updated_at = clock_timestamp();

-- name: pool_get
SELECT name, provider, model, spec, paused FROM pools WHERE name = $1;

-- name: endpoint_upsert
INSERT INTO endpoints (name, url, spec) VALUES ($1, $2, $3)
ON CONFLICT (name) DO UPDATE SET url = EXCLUDED.url, spec = EXCLUDED.spec, updated_at = clock_timestamp();
