-- Acceptance writes every new job into each index whose predicate it meets: a waiting job went
-- into five (the primary key, (batch_id, document_key), the claim index, the waiting-deadline
-- index and extraction_jobs_claimable), and a retry into the last three again.
-- extraction_jobs_claimable (pool, priority, available_at, id) over waiting jobs was the claim's
-- path before fair claiming; no plan reads it any more: the claim, the gauges, the scaler and
-- the queue position read eligible jobs through extraction_jobs_fair_claimable (pool, tenant,
-- rank, id; the eligible condition of migration 0024 implies its predicate), and the readers of
-- all waiting jobs (batch_list_report's open set, the pool status report, the waiting-job expiry)
-- use extraction_jobs_waiting_deadline, which has the same predicate and a narrower key.
DROP INDEX IF EXISTS extraction_jobs_claimable;
