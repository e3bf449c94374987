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
