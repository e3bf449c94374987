-- An outbox row the relay cannot settle because PostgreSQL refuses the statement that would
-- record its fate (marking it published, or releasing it) with a data error (SQLSTATE class 22
-- or 54). Retrying cannot help and, left claimable, the row would come back in every group and
-- hold the relay: it is set aside instead (lading.events.relay), once, terminally:
--
--   set_aside_at   when the relay gave up on it; never claimed again
--   error_class    'UNSTORABLE' (lading.db.storable.UNSTORABLE)
--   error          the error's class and SQLSTATE, never the value
--
-- published_at stays NULL (the row may or may not have reached the broker: consumers dedup by
-- event_id, so a human may simply clear set_aside_at once the cause is fixed, and the relay
-- publishes it again). Set-aside rows do not count as the oldest unpublished event.
ALTER TABLE outbox_events
    ADD COLUMN set_aside_at timestamptz,
    ADD COLUMN error_class  text,
    ADD COLUMN error        text;

-- The columns are new, so every existing row satisfies this already: NOT VALID skips a scan of
-- what may be a large table under an exclusive lock; new and updated rows are checked.
ALTER TABLE outbox_events
    ADD CONSTRAINT outbox_events_set_aside_has_a_reason
    CHECK ((set_aside_at IS NULL) = (error_class IS NULL)) NOT VALID;

CREATE INDEX outbox_events_set_aside ON outbox_events (id) WHERE set_aside_at IS NOT NULL;
