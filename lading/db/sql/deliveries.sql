-- Deliveries (migration 0006): every statement that changes deliveries.state is here, guarded
-- by the source states lading/delivery/states.py allows for its target; the exhaustive test
-- tests/integration/delivery/test_delivery_transitions.py tries each against every state.
-- Leases are decided by the database clock (clock_timestamp()), never a dispatcher's clock.
-- Rows are created by the trigger of 0006, never here.

-- name: delivery_claim
-- PENDING | RETRY_SCHEDULED -> IN_FLIGHT for up to $2 due deliveries of the endpoints $1, oldest
-- due first. One statement: pick with SKIP LOCKED, take ownership (attempt+1, fence+1, lease $4 s
-- for owner $3), open the attempt row, and return what signing and the body need. $5: a breaker
-- probe, which may claim for an endpoint whose breaker is not closed (the caller admitted it);
-- otherwise an endpoint must be registered with its breaker closed at this instant.
-- The candidates are each endpoint's first due deliveries in deliveries_due_by_endpoint's order
-- (migration 0048): a claim reads a bounded number of rows however long the backlog, and never the
-- backlog of an endpoint it may not claim for. Each endpoint offers 4 x $2 of them, so that a claim
-- beside other dispatchers' claims in flight (whose rows it skips) still finds $2 free ones.
WITH candidates AS (
    SELECT c.delivery_id, c.next_attempt_at
      FROM endpoints e
     CROSS JOIN LATERAL (
            SELECT d.delivery_id, d.next_attempt_at
              FROM deliveries d
             WHERE d.endpoint = e.name
               AND d.state IN ('PENDING', 'RETRY_SCHEDULED')
               AND d.next_attempt_at <= clock_timestamp()
             ORDER BY d.next_attempt_at
             LIMIT 4 * $2::int) c
     WHERE e.name = ANY($1::text[]) AND ($5::bool OR e.breaker_state = 'closed')
), picked AS (
    SELECT d.delivery_id
      FROM candidates c
      JOIN deliveries d ON d.delivery_id = c.delivery_id
     WHERE d.state IN ('PENDING', 'RETRY_SCHEDULED')
       AND d.next_attempt_at <= clock_timestamp()
     ORDER BY c.next_attempt_at, c.delivery_id
     LIMIT $2
       FOR UPDATE OF d SKIP LOCKED
), claimed AS (
    UPDATE deliveries d
       SET state = 'IN_FLIGHT', attempt = d.attempt + 1, budget_attempts = d.budget_attempts + 1,
           fence = d.fence + 1, owner = $3, lease_until = clock_timestamp() + make_interval(secs => $4),
           first_attempt_at = coalesce(d.first_attempt_at, clock_timestamp()), updated_at = clock_timestamp()
      FROM picked
     WHERE d.delivery_id = picked.delivery_id
    RETURNING d.delivery_id, d.job_id, d.endpoint, d.attempt, d.budget_attempts, d.ambiguous_attempts, d.fence,
              d.first_attempt_at, d.created_at
), opened AS (
    INSERT INTO delivery_attempts (delivery_id, fence, attempt, owner, started_at)
    SELECT delivery_id, fence, attempt, $3, clock_timestamp() FROM claimed
)
SELECT c.*, clock_timestamp() AS claimed_at,
       j.tenant, j.document_key, j.schema, b.id AS batch_id, b.namespace AS batch_namespace, b.name AS batch_name,
       r.result, coalesce(r.validation_policy, j.validation_policy) AS validation_policy,
       CASE rd.decision WHEN 'approved' THEN 'approved' WHEN 'corrected' THEN 'corrected' ELSE 'passed' END
           AS validation_outcome,
       j.cost, j.cost_currency, u.tokens_in, u.tokens_out
  FROM claimed c
  JOIN extraction_jobs j ON j.id = c.job_id
  JOIN batches b ON b.id = j.batch_id
  LEFT JOIN results r ON r.job_id = c.job_id
  LEFT JOIN review_decisions rd ON rd.job_id = c.job_id
  -- The job's usage over all its attempts (payload v1 `usage`; a settled job's attempts are final).
  LEFT JOIN LATERAL (SELECT sum(a.tokens_in)::bigint AS tokens_in, sum(a.tokens_out)::bigint AS tokens_out
                       FROM job_attempts a WHERE a.job_id = c.job_id) u ON true
 ORDER BY c.delivery_id;

-- name: delivery_finish_many
-- IN_FLIGHT -> DELIVERED | RETRY_SCHEDULED | FAILED_TERMINAL | UNKNOWN_EXTERNAL for many attempts
-- in one statement. Each row is a compare-and-set on (owner $11, fence, unexpired lease): a stale
-- attempt (its lease ran out, another dispatcher owns the delivery now) changes nothing and its
-- attempt row is closed as `stale`. Returns the deliveries that moved.
-- Lock order (docs/architecture.md): every delivery row of the input first, in delivery_id
-- order, whatever order the input came in; then their attempt rows, which only a holder of the
-- delivery row changes. Two dispatchers recording overlapping rounds then never wait in a cycle.
WITH input AS (
    SELECT *
      FROM unnest($1::uuid[], $2::bigint[], $3::text[], $4::float8[], $5::text[], $6::int[], $7::text[],
                  $8::text[], $9::int[], $10::bool[])
           AS t(delivery_id, fence, to_state, retry_in_s, outcome, http_status, error_class, error,
                latency_ms, ambiguous)
), locked AS (
    SELECT d.delivery_id FROM deliveries d WHERE d.delivery_id = ANY($1::uuid[]) ORDER BY d.delivery_id FOR UPDATE
), finished AS (
    UPDATE deliveries d
       SET state = i.to_state,
           lease_until = NULL,
           owner = NULL,
           ambiguous_attempts = d.ambiguous_attempts + CASE WHEN i.ambiguous THEN 1 ELSE 0 END,
           next_attempt_at = CASE WHEN i.to_state = 'RETRY_SCHEDULED'
                                  THEN clock_timestamp() + make_interval(secs => coalesce(i.retry_in_s, 0))
                                  ELSE d.next_attempt_at END,
           delivered_at = CASE WHEN i.to_state = 'DELIVERED' THEN clock_timestamp() END,
           last_status = i.http_status,
           last_error_class = i.error_class,
           last_error = i.error,
           updated_at = clock_timestamp()
      FROM input i JOIN locked l ON l.delivery_id = i.delivery_id
     WHERE d.delivery_id = i.delivery_id
       AND d.state = 'IN_FLIGHT'
       AND d.fence = i.fence
       AND d.owner = $11
       AND d.lease_until > clock_timestamp()
       AND i.to_state IN ('DELIVERED', 'RETRY_SCHEDULED', 'FAILED_TERMINAL', 'UNKNOWN_EXTERNAL')
    RETURNING d.delivery_id, d.state
), closed AS (
    UPDATE delivery_attempts a
       SET finished_at = clock_timestamp(),
           outcome = CASE WHEN i.delivery_id IN (SELECT delivery_id FROM finished) THEN i.outcome ELSE 'stale' END,
           http_status = i.http_status, error_class = i.error_class, error = i.error, latency_ms = i.latency_ms
      FROM input i
     WHERE a.delivery_id = i.delivery_id AND a.fence = i.fence AND a.finished_at IS NULL
)
SELECT delivery_id, state FROM finished;

-- name: delivery_lock_expired_leases
-- Inside a transaction: lock in-flight deliveries whose lease ran out (their dispatcher died or
-- hung mid-request), with what the retry budget decision needs, and the database's now.
SELECT d.delivery_id, d.fence, d.endpoint, d.budget_attempts, d.ambiguous_attempts, d.first_attempt_at,
       coalesce(e.spec, '{}'::jsonb) AS endpoint_spec, clock_timestamp() AS now
  FROM deliveries d
  LEFT JOIN endpoints e ON e.name = d.endpoint
 WHERE d.state = 'IN_FLIGHT' AND d.lease_until <= clock_timestamp()
 ORDER BY d.lease_until
 LIMIT $1
   FOR UPDATE OF d SKIP LOCKED;

-- name: delivery_reap_many
-- IN_FLIGHT (lease expired) -> RETRY_SCHEDULED | UNKNOWN_EXTERNAL: the request may have been sent,
-- so the attempt counts as ambiguous. Guarded by fence and expiry: a dispatcher that recorded its
-- result first wins. The attempt row is closed as `lease-expired`.
WITH input AS (
    SELECT * FROM unnest($1::uuid[], $2::bigint[], $3::text[], $4::float8[]) AS t(delivery_id, fence, to_state,
                                                                                    retry_in_s)
), reaped AS (
    UPDATE deliveries d
       SET state = i.to_state, lease_until = NULL, owner = NULL,
           ambiguous_attempts = d.ambiguous_attempts + 1,
           next_attempt_at = CASE WHEN i.to_state = 'RETRY_SCHEDULED'
                                  THEN clock_timestamp() + make_interval(secs => coalesce(i.retry_in_s, 0))
                                  ELSE d.next_attempt_at END,
           last_status = NULL, last_error_class = 'LeaseExpired',
           last_error = 'the dispatcher holding this delivery stopped before recording an outcome',
           updated_at = clock_timestamp()
      FROM input i
     WHERE d.delivery_id = i.delivery_id AND d.state = 'IN_FLIGHT' AND d.fence = i.fence
       AND d.lease_until <= clock_timestamp()
       AND i.to_state IN ('RETRY_SCHEDULED', 'UNKNOWN_EXTERNAL')
    RETURNING d.delivery_id, d.fence, d.state
), closed AS (
    UPDATE delivery_attempts a
       SET finished_at = clock_timestamp(), outcome = 'lease-expired', error_class = 'LeaseExpired'
      FROM reaped r
     WHERE a.delivery_id = r.delivery_id AND a.fence = r.fence AND a.finished_at IS NULL
)
SELECT delivery_id, state FROM reaped;

-- name: delivery_redeliver
-- FAILED_TERMINAL | UNKNOWN_EXTERNAL -> PENDING, due now, with a fresh retry budget and the same
-- delivery id (the receiver dedups by it). $2: who and why, kept as the last error for the record.
-- Not once retention deleted the job's result (nothing to send): the job row is taken FOR SHARE
-- first (job before delivery), so the cleaner's result_delete_expired either waits for this to
-- commit and then sees the delivery pending, or has already marked the job and this sends nothing.
WITH job AS (
    SELECT j.id FROM extraction_jobs j
     WHERE j.id = (SELECT d.job_id FROM deliveries d WHERE d.delivery_id = $1) AND j.result_deleted_at IS NULL
       FOR SHARE
)
UPDATE deliveries
   SET state = 'PENDING', budget_attempts = 0, ambiguous_attempts = 0, first_attempt_at = NULL,
       next_attempt_at = clock_timestamp(), last_error_class = 'Redelivered', last_error = $2,
       updated_at = clock_timestamp()
 WHERE delivery_id = $1 AND state IN ('FAILED_TERMINAL', 'UNKNOWN_EXTERNAL') AND job_id IN (SELECT id FROM job)
RETURNING delivery_id;

-- name: delivery_resolve
-- UNKNOWN_EXTERNAL -> DELIVERED after reconciliation showed the receiver has it: $2 who, $3 why.
UPDATE deliveries
   SET state = 'DELIVERED', delivered_at = clock_timestamp(), resolved_by = $2, resolved_reason = $3,
       updated_at = clock_timestamp()
 WHERE delivery_id = $1 AND state = 'UNKNOWN_EXTERNAL'
RETURNING delivery_id;

-- name: delivery_get
SELECT d.delivery_id, d.job_id, d.endpoint, d.state, d.attempt, d.budget_attempts, d.ambiguous_attempts,
       d.fence, d.owner, d.lease_until, d.next_attempt_at, d.first_attempt_at, d.last_status,
       d.last_error_class, d.last_error, d.created_at, d.updated_at, d.delivered_at, d.resolved_by,
       d.resolved_reason
  FROM deliveries d
 WHERE d.delivery_id = $1;

-- name: delivery_list
-- One keyset page in (created_at, delivery_id) order after delivery $1 (NULL: from the start),
-- at most $2 rows, filtered by state $3 and endpoint $4 (NULL: any).
SELECT d.delivery_id, d.job_id, d.endpoint, d.state, d.attempt, d.budget_attempts, d.ambiguous_attempts,
       d.fence, d.owner, d.lease_until, d.next_attempt_at, d.first_attempt_at, d.last_status,
       d.last_error_class, d.last_error, d.created_at, d.updated_at, d.delivered_at, d.resolved_by,
       d.resolved_reason
  FROM deliveries d
 WHERE ($3::text IS NULL OR d.state = $3)
   AND ($4::text IS NULL OR d.endpoint = $4)
   AND ($1::uuid IS NULL
        OR (d.created_at, d.delivery_id) > (SELECT created_at, delivery_id FROM deliveries WHERE delivery_id = $1))
 ORDER BY d.created_at, d.delivery_id
 LIMIT $2;

-- name: delivery_attempts_of
SELECT fence, attempt, owner, started_at, finished_at, outcome, http_status, error_class, error, latency_ms
  FROM delivery_attempts
 WHERE delivery_id = $1
 ORDER BY fence;

-- name: delivery_count_by_state
-- How many deliveries are in each state, per endpoint: for metrics and `lading status`.
SELECT endpoint, state, count(*)::bigint AS n
  FROM deliveries
 GROUP BY endpoint, state;

-- name: delivery_due_count_by_endpoint
-- Deliveries due now, per endpoint: those of an endpoint with no signing secret wait here.
SELECT endpoint, count(*)::bigint AS n
  FROM deliveries
 WHERE state IN ('PENDING', 'RETRY_SCHEDULED') AND next_attempt_at <= clock_timestamp()
 GROUP BY endpoint;

-- name: delivery_count_delivered_of_batch
SELECT count(*)::bigint
  FROM deliveries d
  JOIN extraction_jobs j ON j.id = d.job_id
 WHERE j.batch_id = $1 AND d.state = 'DELIVERED';

-- name: delivery_count_open_of_batches
-- Deliveries of the batches $1 that are still due, retrying or in flight (`lading run` waits for none).
SELECT count(*)::bigint
  FROM deliveries d
  JOIN extraction_jobs j ON j.id = d.job_id
 WHERE j.batch_id = ANY($1::bigint[]) AND d.state IN ('PENDING', 'IN_FLIGHT', 'RETRY_SCHEDULED');

-- name: endpoint_list_for_dispatch
-- Every registered endpoint with its health, and the database's now.
SELECT name, url, spec, breaker_state, breaker_failures, breaker_opens, breaker_open_until, breaker_probe_until,
       auth_failures, auth_failing, auth_failing_since, last_auth_status, clock_timestamp() AS now
  FROM endpoints
 ORDER BY name;

-- name: endpoint_breaker_admit_probe
-- open (cool-down over) | half_open (previous probe's lease over) -> half_open with a probe lease of
-- $2 s: at most one dispatcher replica probes an endpoint at a time. Returns the name when admitted.
-- Only while one of its deliveries is due: an admission with nothing to send would hold the probe
-- slot for $2 s, and deliveries falling due a moment later (their backoff running out just after
-- the cool-down) would wait that long for the next probe. Nobody else claims for an endpoint whose
-- breaker is not closed, so the due delivery seen here is still there for the probe's claim.
UPDATE endpoints e
   SET breaker_state = 'half_open', breaker_probe_until = clock_timestamp() + make_interval(secs => $2),
       breaker_changed_at = CASE WHEN breaker_state = 'half_open' THEN breaker_changed_at ELSE clock_timestamp() END
 WHERE name = $1
   AND ((breaker_state = 'open' AND breaker_open_until <= clock_timestamp())
        OR (breaker_state = 'half_open' AND (breaker_probe_until IS NULL OR breaker_probe_until <= clock_timestamp())))
   AND EXISTS (SELECT FROM deliveries d
                WHERE d.endpoint = e.name AND d.state IN ('PENDING', 'RETRY_SCHEDULED')
                  AND d.next_attempt_at <= clock_timestamp())
RETURNING name;

-- name: endpoint_record_outcomes
-- Fold one round of attempt outcomes of endpoint $1 into its health. $2 answers that show the
-- endpoint is up (2xx, or a 4xx other than 401/403/429), $3 failures (5xx, 429, 401/403, network,
-- time-outs), $4 401/403 answers, $5 2xx answers, $6 the last 401/403 status. Breaker: an up answer
-- closes it; failures open it after $7 in a row (at once when half-open), for
-- min($9, $8 * 2^openings) s. Auth: a 2xx clears AuthFailing; $10 401/403 in a row set it.
UPDATE endpoints e
   SET breaker_state = CASE
           WHEN $2 > 0 THEN 'closed'
           WHEN $3 > 0 AND (e.breaker_state = 'half_open' OR (e.breaker_state = 'closed'
                                                            AND e.breaker_failures + $3 >= $7)) THEN 'open'
           ELSE e.breaker_state END,
       breaker_open_until = CASE
           WHEN $2 > 0 THEN NULL
           WHEN $3 > 0 AND (e.breaker_state = 'half_open' OR (e.breaker_state = 'closed'
                                                            AND e.breaker_failures + $3 >= $7))
           THEN clock_timestamp() + make_interval(secs => least($9::float8, $8::float8 * 2 ^ least(e.breaker_opens, 30)))
           ELSE e.breaker_open_until END,
       breaker_opens = CASE
           WHEN $2 > 0 THEN 0
           WHEN $3 > 0 AND (e.breaker_state = 'half_open' OR (e.breaker_state = 'closed'
                                                            AND e.breaker_failures + $3 >= $7))
           THEN e.breaker_opens + 1
           ELSE e.breaker_opens END,
       breaker_changed_at = CASE
           WHEN $2 > 0 AND e.breaker_state <> 'closed' THEN clock_timestamp()
           WHEN $2 = 0 AND $3 > 0 AND (e.breaker_state = 'half_open' OR (e.breaker_state = 'closed'
                                                                      AND e.breaker_failures + $3 >= $7))
           THEN clock_timestamp()
           ELSE e.breaker_changed_at END,
       breaker_probe_until = CASE WHEN $2 > 0 OR $3 > 0 THEN NULL ELSE e.breaker_probe_until END,
       breaker_failures = CASE WHEN $2 > 0 THEN 0 ELSE e.breaker_failures + $3 END,
       auth_failures = CASE WHEN $5 > 0 THEN 0 ELSE e.auth_failures + $4 END,
       auth_failing = CASE WHEN $5 > 0 THEN false
                           WHEN e.auth_failures + $4 >= $10 THEN true
                           ELSE e.auth_failing END,
       auth_failing_since = CASE WHEN $5 > 0 THEN NULL
                                 WHEN e.auth_failures + $4 >= $10 THEN coalesce(e.auth_failing_since, clock_timestamp())
                                 ELSE e.auth_failing_since END,
       last_auth_status = coalesce($6, e.last_auth_status)
 WHERE e.name = $1
RETURNING e.breaker_state, e.auth_failing;

-- name: delivery_count_waiting_for_endpoint_by_tenant
-- Per tenant: deliveries due or retrying whose DeliveryEndpoint is not registered (the batch named
-- one that does not exist, or it was deleted). The claim skips them, so they wait, invisible to every
-- other metric, until the endpoint appears. Reads the partial index of due deliveries only.
SELECT j.tenant, count(*)::bigint AS n
  FROM deliveries d
  JOIN extraction_jobs j ON j.id = d.job_id
 WHERE d.state IN ('PENDING', 'RETRY_SCHEDULED')
   AND NOT EXISTS (SELECT 1 FROM endpoints e WHERE e.name = d.endpoint)
 GROUP BY j.tenant;

-- name: endpoint_get_health
-- The dispatcher's view of an endpoint: breaker and auth state, and delivery counts by state.
SELECT e.breaker_state, e.auth_failing, e.last_auth_status,
       (SELECT count(*) FROM deliveries d WHERE d.endpoint = e.name AND d.state = 'DELIVERED')::bigint AS delivered,
       (SELECT count(*) FROM deliveries d
         WHERE d.endpoint = e.name AND d.state IN ('PENDING', 'IN_FLIGHT', 'RETRY_SCHEDULED'))::bigint AS pending,
       (SELECT count(*) FROM deliveries d WHERE d.endpoint = e.name AND d.state = 'UNKNOWN_EXTERNAL')::bigint AS unknown,
       (SELECT count(*) FROM deliveries d WHERE d.endpoint = e.name AND d.state = 'FAILED_TERMINAL')::bigint AS failed
  FROM endpoints e WHERE e.name = $1;

-- name: delivery_delete_delivered
-- Retention (worker/lading_worker/cleaning.py): at most $2 deliveries DELIVERED more than $1 seconds ago, with
-- their attempt rows (parent locked before child; SKIP LOCKED, so a redelivery holding one is
-- passed over). Every other state is still needed and never qualifies (deliveries_delivered,
-- migration 0016). Returns how many deliveries went.
WITH doomed AS (
    SELECT delivery_id FROM deliveries
     WHERE state = 'DELIVERED' AND delivered_at < now() - make_interval(secs => $1)
     ORDER BY delivered_at
     LIMIT $2
       FOR UPDATE SKIP LOCKED
), attempts_gone AS (
    DELETE FROM delivery_attempts a USING doomed d WHERE a.delivery_id = d.delivery_id RETURNING 1
), gone AS (
    DELETE FROM deliveries x USING doomed d WHERE x.delivery_id = d.delivery_id RETURNING 1
)
SELECT count(*)::bigint FROM gone;

-- name: delivery_oldest_delivered_age
SELECT extract(epoch FROM clock_timestamp() - min(delivered_at))::float8
  FROM deliveries WHERE state = 'DELIVERED';
