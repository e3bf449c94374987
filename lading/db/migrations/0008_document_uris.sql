-- Documents of large batches are not stored in the database: their row holds the URI the
-- manifest gave, the SHA-256 the worker verifies after fetching, and the size in bytes.
-- Inline documents keep their text. Exactly one of the two is set on every row.
ALTER TABLE job_documents ALTER COLUMN text DROP NOT NULL;
ALTER TABLE job_documents ADD COLUMN uri text;
ALTER TABLE job_documents ADD COLUMN sha256 text;
ALTER TABLE job_documents ADD CONSTRAINT job_documents_text_or_uri CHECK ((text IS NULL) <> (uri IS NULL));
ALTER TABLE job_documents ADD CONSTRAINT job_documents_uri_has_sha256 CHECK ((uri IS NULL) = (sha256 IS NULL));
ALTER TABLE job_documents ADD CONSTRAINT job_documents_sha256_hex CHECK (sha256 ~ '^[0-9a-f]{64}$');
