-- name: erp_inbox_claim
-- Claim a delivery id. No row back: the id was committed before (or by a concurrent
-- transaction, which this statement waited for); read it with erp_inbox_get.
INSERT INTO erp_inbox (delivery_id, payload_sha256, event_type, adapter)
VALUES ($1, $2, $3, $4)
ON CONFLICT (delivery_id) DO NOTHING
RETURNING delivery_id;

-- name: erp_inbox_get
SELECT delivery_id, payload_sha256, status, reference
  FROM erp_inbox
 WHERE delivery_id = $1;

-- name: erp_inbox_record_answer
UPDATE erp_inbox SET status = $2, reference = $3
 WHERE delivery_id = $1 AND status IS NULL
RETURNING delivery_id;

-- name: erp_inbox_count_by_status
SELECT status, count(*) AS n FROM erp_inbox GROUP BY status;

-- name: erp_inbox_delete_expired
-- Retention (cleaning.py): at most $2 answered inbox rows received more than $1 seconds ago,
-- oldest first through erp_inbox_received_at, locked SKIP LOCKED (a delivery's transaction is
-- never waited on; a concurrent cleaner of another replica takes other rows). The cut-off is
-- now() of this statement (autocommit), the database's clock, as received_at is: a stable
-- value, so it is an index condition and the scan stops at the first row inside the retention.
-- The retention is bounded below by the dedup window (settings.ReceiverSettings), so no row a
-- redelivery could still match goes. The ledger is never touched: booked invoices stay.
WITH doomed AS (
    SELECT delivery_id FROM erp_inbox
     WHERE received_at < now() - make_interval(secs => $1) AND status IS NOT NULL
     ORDER BY received_at
     LIMIT $2
       FOR UPDATE SKIP LOCKED
), gone AS (
    DELETE FROM erp_inbox i USING doomed d WHERE i.delivery_id = d.delivery_id RETURNING 1
)
SELECT count(*)::bigint FROM gone;

-- name: erp_inbox_oldest_age
-- Age in seconds of the oldest inbox row (NULL when none), from erp_inbox_received_at.
SELECT extract(epoch FROM clock_timestamp() - min(received_at))::float8 FROM erp_inbox;

-- name: erp_inbox_claim_many
-- Claim a group of delivery ids in one statement (the group commit, inbox.GroupCommitter): the
-- ids come distinct and are inserted in id order, so two groups claiming overlapping ids lock
-- them in one order. An id with no row back was committed before (or by a concurrent group,
-- which this statement waited for); read it with erp_inbox_get_many.
INSERT INTO erp_inbox (delivery_id, payload_sha256, event_type, adapter)
SELECT t.delivery_id, t.payload_sha256, t.event_type, $4
  FROM unnest($1::text[], $2::bytea[], $3::text[]) AS t(delivery_id, payload_sha256, event_type)
 ORDER BY t.delivery_id
ON CONFLICT (delivery_id) DO NOTHING
RETURNING delivery_id;

-- name: erp_inbox_get_many
SELECT delivery_id, payload_sha256, status, reference
  FROM erp_inbox
 WHERE delivery_id = ANY($1::text[]);

-- name: erp_inbox_record_answers
-- The answers of a group's claimed rows, in one statement (rows locked in id order).
UPDATE erp_inbox i
   SET status = t.status, reference = t.reference
  FROM (SELECT * FROM unnest($1::text[], $2::text[], $3::text[]) AS u(delivery_id, status, reference)
         ORDER BY delivery_id) AS t
 WHERE i.delivery_id = t.delivery_id AND i.status IS NULL;
