-- Human review: the audit trail of who moved a job out of REVIEW_REQUIRED, how and why
-- (lading/reviewing.py writes it; `lading review` is its CLI).
--
-- One row per decision, written in the same transaction as the decision's state change
-- (and, for `corrected`, the replaced results row), so a decided job always has its row
-- and a row always has its decided job. The state change's outbox event comes from the
-- trigger of 0001, like every other state change.

CREATE TABLE review_decisions (
    id                   bigserial PRIMARY KEY,
    -- Unlike the per-job tables of 0001, a foreign key here: decisions come at human pace,
    -- so its lookup costs nothing that matters, and a decision must never outlive its job.
    -- Unique: a job leaves REVIEW_REQUIRED once (lading/jobs/states.py has no way back
    -- into it), so a second decision for a job is a bug, refused here too.
    job_id               bigint      NOT NULL UNIQUE REFERENCES extraction_jobs (id),
    decision             text        NOT NULL CHECK (decision IN ('approved', 'corrected', 'rejected')),
    -- Who and why: required, trimmed, bounded (lading.reviewing.REVIEWER_MAX_CHARS and
    -- REASON_MAX_CHARS say the same).
    reviewer             text        NOT NULL CHECK (length(reviewer) BETWEEN 1 AND 200 AND reviewer = btrim(reviewer)),
    reason               text        NOT NULL CHECK (length(reason) BETWEEN 1 AND 2000 AND reason = btrim(reason)),
    decided_at           timestamptz NOT NULL DEFAULT clock_timestamp(),
    -- For `corrected` only: the result and verdict it replaced (NULL if the job had no
    -- results row), the reviewer's result (stored in results) and the policy's verdict on it.
    -- The verdict is reported, not enforced: the reviewer decides.
    previous_result      jsonb,
    previous_validation  jsonb,
    corrected_result     jsonb,
    corrected_validation jsonb,
    CONSTRAINT correction_has_result CHECK (
        (decision = 'corrected') = (corrected_result IS NOT NULL AND corrected_validation IS NOT NULL)),
    CONSTRAINT only_corrections_keep_results CHECK (
        decision = 'corrected'
        OR (previous_result IS NULL AND previous_validation IS NULL
            AND corrected_result IS NULL AND corrected_validation IS NULL))
);

-- The review queue, paged by job id (`lading review list --after ID`): walks only the jobs
-- waiting for a reviewer, never the whole primary key.
CREATE INDEX extraction_jobs_review_queue_by_id ON extraction_jobs (id) WHERE state = 'REVIEW_REQUIRED';
