-- The delivery claim reads a bounded number of rows, whatever the backlog (lading/db/sql/deliveries.sql,
-- delivery_claim). It picked the oldest due deliveries of the claimable endpoints with one scan over
-- deliveries_due (next_attempt_at) filtered by endpoint: on statistics taken while the table was
-- small, PostgreSQL chose a bitmap scan of every due delivery, a join to its endpoint and a sort,
-- to return 64 of them, so each claim cost O(backlog): 90 ms per claim at 17,000 due deliveries,
-- and a backlog of N cost O(N^2) to drain. An ordered scan of deliveries_due would also read the due
-- deliveries of endpoints that may not be claimed (an open breaker, no secret) on every claim.
--
-- The claim now reads, per claimable endpoint, the first due deliveries in this index's order, and
-- takes the oldest among them: an index that matches `endpoint = $1 ORDER BY next_attempt_at LIMIT n`
-- exactly, whatever the statistics say. It replaces deliveries_due, whose one other reader
-- (delivery_due_count_by_endpoint, per endpoint) it serves as well.
CREATE INDEX deliveries_due_by_endpoint ON deliveries (endpoint, next_attempt_at)
    WHERE state IN ('PENDING', 'RETRY_SCHEDULED');
DROP INDEX deliveries_due;
