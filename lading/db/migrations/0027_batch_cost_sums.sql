-- A batch's cost as a running sum per currency (docs/cost.md), added in the same statements that
-- add to its jobs' costs (job_finish_many, job_finish_reused_many, job_reap_many and the GPU-time
-- allocator), so a status refresh reads one row instead of scanning the batch's jobs.
-- No foreign key to batches, like the other per-job tables (see 0001).
CREATE TABLE batch_costs (
    batch_id bigint  NOT NULL,
    currency text    NOT NULL,
    amount   numeric NOT NULL DEFAULT 0 CHECK (amount >= 0),
    PRIMARY KEY (batch_id, currency)
);

INSERT INTO batch_costs (batch_id, currency, amount)
SELECT batch_id, cost_currency, sum(cost)
  FROM extraction_jobs
 WHERE cost IS NOT NULL
 GROUP BY batch_id, cost_currency;
