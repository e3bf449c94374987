-- Token counts a provider reports are bigint wherever they land: the attempt row and the
-- limiter's reconciliation of a permit (tenant_usage.tokens is bigint since 0010). A count that
-- passes the worker's check (lading.providers.base.checked: at most 2^31-1 per call) is stored
-- whatever its size, and the sum of a call's two counts always fits; a count past that check
-- is refused there, and should one still arrive, PostgreSQL refuses it as a data error that the
-- committer isolates (lading_worker.committing), never as a statement failing for ever.
-- limiter_permits.tokens_reserved stays integer: it is the worker's own estimate of one call,
-- never a reported count.
ALTER TABLE job_attempts
    ALTER COLUMN tokens_in TYPE bigint,
    ALTER COLUMN tokens_out TYPE bigint;

ALTER TABLE limiter_permits
    ALTER COLUMN tokens_used TYPE bigint;
