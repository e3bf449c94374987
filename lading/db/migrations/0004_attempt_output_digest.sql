-- The digest of an attempt's invalid model output, so that a deterministic failure (the
-- same bad output again, as temperature 0 reproduces it) is recognised and not retried.
ALTER TABLE job_attempts ADD COLUMN output_sha256 text;
