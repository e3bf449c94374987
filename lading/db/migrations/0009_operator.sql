-- The operator finds a batch by its identity (`namespace/name/uid`) alone when it resumes one:
-- the tenant that accepted it may no longer cover its namespace, and accepting it again under
-- another tenant would duplicate its jobs. One row per batch; the index stays small.
CREATE INDEX batches_idempotency_key ON batches (idempotency_key);
