-- Indexes for the day-2 questions `lading jobs show` and `lading status` ask, so that none
-- of them reads a whole table.

-- A job's events (jobs show): outbox rows by job.
CREATE INDEX outbox_events_by_job ON outbox_events (aggregate_id) WHERE aggregate_type = 'job';

-- The review queue (status): its size and its oldest entry.
CREATE INDEX extraction_jobs_review_queue ON extraction_jobs (updated_at) WHERE state = 'REVIEW_REQUIRED';

-- Recent stale completions (status).
CREATE INDEX stale_completions_at ON stale_completions (at);
