-- Retention (lading/cleaning.py): every batch the cleaner deletes is found through an index on the
-- column its retention is measured by, so a round costs the rows it removes, not a scan of the table.
-- Partial where only settled rows qualify: the index holds nothing the cleaner must keep.

-- Published outbox events, by publication time (unpublished and set-aside rows are never in it).
CREATE INDEX outbox_events_published ON outbox_events (published_at) WHERE published_at IS NOT NULL;
-- Quarantined inbox redeliveries, by arrival.
CREATE INDEX inbox_quarantine_received ON inbox_quarantine (received_at);
-- Delivered deliveries, by delivery time (every other state is still needed).
CREATE INDEX deliveries_delivered ON deliveries (delivered_at) WHERE state = 'DELIVERED';
-- Limiter permits and per-second sums by time, whatever the pool (the existing indexes lead with it).
CREATE INDEX limiter_permits_acquired ON limiter_permits (acquired_at);
CREATE INDEX limiter_seconds_second ON limiter_seconds (second);
