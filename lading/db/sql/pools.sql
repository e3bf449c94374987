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

-- name: pool_pause
-- Pause pool $1 for $2 seconds (never shortening a longer pause) with reason $3.
UPDATE pools
   SET paused_until = greatest(coalesce(paused_until, clock_timestamp()), clock_timestamp() + make_interval(secs => $2)),
       paused_reason = $3, updated_at = clock_timestamp()
 WHERE name = $1
RETURNING paused_until;

-- name: endpoint_exists
-- Whether a DeliveryEndpoint ("namespace/name") is registered: deliveries to one that is not wait.
SELECT EXISTS (SELECT 1 FROM endpoints WHERE name = $1);

-- name: pool_delete_unused
-- Unregister pool $1 unless a batch refers to it (those rows stay, with their history).
DELETE FROM pools p WHERE p.name = $1 AND NOT EXISTS (SELECT 1 FROM batches b WHERE b.pool = p.name)
RETURNING p.name;
