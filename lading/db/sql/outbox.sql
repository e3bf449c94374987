-- The outbox relay and the broker ingress inbox (lading/events/). Claims are leases on the
-- database clock: a relay that dies mid-batch leaves rows that another relay takes once
-- claim_until has passed. No statement here is ever held open across a broker publish.

-- name: outbox_insert_batch_accepted
-- The batch.accepted.v1 event of batch $1 with payload $2, written in the accepting
-- transaction (it commits with the batch or not at all).
INSERT INTO outbox_events (event_id, aggregate_type, aggregate_id, type, payload)
VALUES (gen_random_uuid(), 'batch', $1, 'batch.accepted.v1', $2);

-- name: outbox_claim_batch
-- Up to $2 committed, unpublished events whose claim is free or expired, oldest first,
-- claimed by relay $1 for $3 seconds. SKIP LOCKED: concurrent relays take disjoint rows.
-- A row set aside (outbox_set_aside) is never claimed again.
WITH picked AS (
    SELECT id
      FROM outbox_events
     WHERE published_at IS NULL
       AND set_aside_at IS NULL
       AND (claim_until IS NULL OR claim_until < clock_timestamp())
     ORDER BY id
     LIMIT $2
       FOR UPDATE SKIP LOCKED
)
UPDATE outbox_events o
   SET claim_owner = $1, claim_until = clock_timestamp() + make_interval(secs => $3)
  FROM picked
 WHERE o.id = picked.id
RETURNING o.id, o.event_id, o.aggregate_type, o.aggregate_id, o.type, o.payload, o.created_at;

-- name: outbox_mark_published
-- Events $1 the broker confirmed, still claimed by relay $2. A relay whose claim expired and
-- was taken over marks nothing: the new owner publishes again (consumers dedup by event_id).
-- Rows are locked in id order first (docs/architecture.md, "Lock order"): an old and a new
-- owner marking overlapping rows never wait on each other in a cycle.
WITH locked AS (
    SELECT o.id
      FROM outbox_events o
     WHERE o.id = ANY($1::bigint[]) AND o.claim_owner = $2 AND o.published_at IS NULL
     ORDER BY o.id
       FOR UPDATE
)
UPDATE outbox_events o
   SET published_at = clock_timestamp(), claim_owner = NULL, claim_until = NULL
  FROM locked l
 WHERE o.id = l.id
   AND o.claim_owner = $2
   AND o.published_at IS NULL
RETURNING o.id;

-- name: outbox_release
-- Events $1 that relay $2 could not get confirmed: free them after $3 seconds (0 = at once,
-- after a lost connection; longer after a nack or a return, so a refused event does not spin).
-- Rows are locked in id order first, as outbox_mark_published does.
WITH locked AS (
    SELECT o.id
      FROM outbox_events o
     WHERE o.id = ANY($1::bigint[]) AND o.claim_owner = $2 AND o.published_at IS NULL
     ORDER BY o.id
       FOR UPDATE
)
UPDATE outbox_events o
   SET claim_until = clock_timestamp() + make_interval(secs => $3)
  FROM locked l
 WHERE o.id = l.id
   AND o.claim_owner = $2
   AND o.published_at IS NULL
RETURNING o.id;

-- name: outbox_set_aside
-- Event $1, claimed by relay $2, whose mark or release PostgreSQL refused with a data error:
-- set aside for good with error class $3 and error $4 (migration 0015). Returns the row when
-- it was set aside (not when another relay took it over meanwhile).
UPDATE outbox_events
   SET set_aside_at = clock_timestamp(), error_class = $3, error = $4, claim_owner = NULL, claim_until = NULL
 WHERE id = $1
   AND claim_owner = $2
   AND published_at IS NULL
   AND set_aside_at IS NULL
RETURNING id;

-- name: outbox_oldest_unpublished
-- Age in seconds of the oldest unpublished event (NULL when none), from the unpublished index.
-- Set-aside rows wait for a human, not for the relay: they do not count.
SELECT extract(epoch FROM clock_timestamp() - created_at)::float8 AS age_s
  FROM outbox_events
 WHERE published_at IS NULL
   AND set_aside_at IS NULL
 ORDER BY id
 LIMIT 1;

-- name: inbox_record
-- Record event $1 unless its id is already there. Returns the row only when inserted.
INSERT INTO execution_inbox (event_id, type, digest, payload)
VALUES ($1, $2, $3, $4)
ON CONFLICT (event_id) DO NOTHING
RETURNING event_id;

-- name: inbox_digest
-- The digest recorded for event $1 (a redelivery compares against it).
SELECT digest FROM execution_inbox WHERE event_id = $1;

-- name: inbox_quarantine_insert
-- A redelivery of event $1 with digest $2 that differs from the recorded $3. Kept once per
-- (event, digest); returns the row only the first time.
INSERT INTO inbox_quarantine (event_id, digest, first_digest, payload)
VALUES ($1, $2, $3, $4)
ON CONFLICT (event_id, digest) DO NOTHING
RETURNING event_id;

-- name: outbox_backlog_summary
-- Events waiting for the relay, and the age of the oldest (from the unpublished index); and the
-- events set aside as unstorable (migration 0015), which wait for a human instead.
SELECT count(*) FILTER (WHERE set_aside_at IS NULL)::bigint AS unpublished,
       coalesce(extract(epoch FROM now() - min(created_at) FILTER (WHERE set_aside_at IS NULL)), 0)::float8
           AS oldest_age_s,
       count(*) FILTER (WHERE set_aside_at IS NOT NULL)::bigint AS set_aside
  FROM outbox_events
 WHERE published_at IS NULL;

-- name: outbox_list_report
-- The events of job $1 (state changes written by the trigger), at most $2.
-- Uses outbox_events_by_job (migration 0002).
SELECT id, event_id, type, created_at, published_at
  FROM outbox_events
 WHERE aggregate_type = 'job' AND aggregate_id = $1
 ORDER BY id
 LIMIT $2;

-- name: outbox_backlog_report
-- Events waiting for the relay, and the oldest of them, from the unpublished index. Events set
-- aside as unstorable (migration 0015) wait for a human, not the relay: they are not backlog.
WITH oldest AS (
    SELECT created_at FROM outbox_events WHERE published_at IS NULL AND set_aside_at IS NULL ORDER BY id LIMIT 1
)
SELECT (SELECT count(*) FROM outbox_events WHERE published_at IS NULL AND set_aside_at IS NULL)::bigint
           AS unpublished,
       (SELECT created_at FROM oldest) AS oldest_at,
       extract(epoch FROM now() - (SELECT created_at FROM oldest))::float8 AS oldest_age_s;

-- Retention (worker/lading_worker/cleaning.py). Each delete takes at most $2 rows past a retention of $1
-- seconds, oldest first through a partial index (migration 0016), locked SKIP LOCKED so it
-- never waits on the relay; each returns how many rows went. The cut-off is measured from now()
-- (the statement's start, in autocommit), not clock_timestamp(): a stable cut-off is an index
-- condition, so the scan stops at the first row inside the retention; a volatile one is a filter,
-- and an idle round would read every retained row's index entry. Each `_oldest` query is the age in
-- seconds of the oldest row the delete could take one day (NULL when none).

-- name: outbox_delete_published
-- Published events only: an unpublished or set-aside event (published_at NULL) never qualifies.
WITH doomed AS (
    SELECT id FROM outbox_events
     WHERE published_at < now() - make_interval(secs => $1)
     ORDER BY published_at
     LIMIT $2
       FOR UPDATE SKIP LOCKED
), gone AS (
    DELETE FROM outbox_events o USING doomed d WHERE o.id = d.id RETURNING 1
)
SELECT count(*)::bigint FROM gone;

-- name: outbox_oldest_published_age
SELECT extract(epoch FROM clock_timestamp() - min(published_at))::float8
  FROM outbox_events WHERE published_at IS NOT NULL;

-- name: inbox_delete_expired
-- Inbox rows past the dedup retention: a redelivery of one of them would be applied again, so
-- the retention is bounded below in CleanerSettings.
WITH doomed AS (
    SELECT event_id FROM execution_inbox
     WHERE received_at < now() - make_interval(secs => $1)
     ORDER BY received_at
     LIMIT $2
       FOR UPDATE SKIP LOCKED
), gone AS (
    DELETE FROM execution_inbox i USING doomed d WHERE i.event_id = d.event_id RETURNING 1
)
SELECT count(*)::bigint FROM gone;

-- name: inbox_oldest_age
SELECT extract(epoch FROM clock_timestamp() - min(received_at))::float8 FROM execution_inbox;

-- name: inbox_quarantine_delete_expired
-- Rows are named by ctid within the statement, as an array (a TID scan): joined on the key, the
-- planner, which cannot estimate the clock_timestamp() cut-off, chose to hash the whole table.
WITH doomed AS (
    SELECT ctid AS row_id FROM inbox_quarantine
     WHERE received_at < now() - make_interval(secs => $1)
     ORDER BY received_at
     LIMIT $2
       FOR UPDATE SKIP LOCKED
), gone AS (
    DELETE FROM inbox_quarantine WHERE ctid = ANY (ARRAY(SELECT row_id FROM doomed)) RETURNING 1
)
SELECT count(*)::bigint FROM gone;

-- name: inbox_quarantine_oldest_age
SELECT extract(epoch FROM clock_timestamp() - min(received_at))::float8 FROM inbox_quarantine;
