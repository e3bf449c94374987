-- Closing an attempt of an unpriced pool (job_finish_many's `closed`, job_reap_many) rewrites its
-- row in place: a HOT update, with no new entry in job_attempts_pkey.
--
-- 1. job_attempts_cost_pending (migration 0026) was keyed on finished_at, which every close sets:
--    PostgreSQL cannot update a row in place when a column an index reads (its key or its
--    predicate) changes, so each close also inserted the row's new version into the primary key.
--    Keyed on (job_id, fence) with the same predicate, the index holds the same rows (an attempt
--    of a pool priced by the GPU hour whose cost is pending: a few minutes' worth at most) and the
--    pending-price queries still read it (attempt_gpu_pending_of_pool in the order it asks for);
--    the close of an attempt of an unpriced pool changes no column an index reads (cost and
--    cost_currency stay NULL).
-- 2. An attempt row is inserted by the claim and rewritten by its close moments later: with the
--    table's pages filled only half by inserts, the new version fits on the old one's page.
DROP INDEX job_attempts_cost_pending;
CREATE INDEX job_attempts_cost_pending ON job_attempts (job_id, fence)
    WHERE cost IS NULL AND cost_currency IS NOT NULL;

ALTER TABLE job_attempts SET (fillfactor = 50);
