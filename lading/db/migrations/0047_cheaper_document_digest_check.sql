-- The same rule for a manifest document's SHA-256 (migration 0008: 64 characters, each a
-- lowercase hex digit), checked at a fraction of the cost. PostgreSQL's regular expressions run
-- the bounded repetition of `^[0-9a-f]{64}$` through an automaton of 64 states, about 7 µs per
-- row: the check was a quarter of the PostgreSQL CPU of a manifest acceptance (100,000 rows:
-- 0.7-1.0 s of the insert; a length and a negated class cost 0.06-0.1 s, backend CPU measured
-- with both side by side). Inline documents have no digest (NULL passes either way).
--
-- NOT VALID: every existing row passed the old constraint, which states the same rule, so
-- validating would only scan the table under this migration's lock. New and updated rows are
-- checked as before.
ALTER TABLE job_documents
    DROP CONSTRAINT job_documents_sha256_hex,
    ADD CONSTRAINT job_documents_sha256_hex CHECK (length(sha256) = 64 AND sha256 !~ '[^0-9a-f]') NOT VALID;
