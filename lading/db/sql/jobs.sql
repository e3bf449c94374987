-- Every statement that changes extraction_jobs.state is here, guarded by the source
-- states that lading/jobs/states.py allows for its target state. The exhaustive test
-- tests/integration/test_job_transitions.py tries each against every source state.
-- Lease decisions use clock_timestamp() (the database clock now), never now() (the
-- transaction's start) and never a worker's clock.

-- fragment: job_eligible
-- An eligible job: one a claim could take now. Waiting (READY, or RETRY_SCHEDULED), not
-- suspended, due, inside its deadline and its attempt budget. The condition itself is the
-- database function lading_job_eligible (migration 0024), which lading_claim_plan's contenders'
-- probe calls too; this fragment applies it to alias `j` of extraction_jobs and is included as
-- {{job_eligible}} by the claim (job_claim_batch), the gauges (job_oldest_eligible_age_by_pool),
-- the scaler (pool_scaling_load), KEDA's triggers (lading_operator.rendering) and the reports
-- (pool_status_report, batch_get_observed, tenant_queues_of_pool). The planner inlines the
-- function, so the condition's first two terms are still the predicate of the claim index
-- (extraction_jobs_fair_claimable, migration 0010) and every user can read that index. "Now" is
-- clock_timestamp(), the database clock when the row is read, as every lease decision uses.
lading_job_eligible(j.state, j.suspended, j.available_at, j.deadline_at, j.attempt, j.max_attempts)

-- name: job_allocate_ids
-- $1 new job ids as ONE int8[] value (a 10,000-job batch decodes no Record per id).
SELECT coalesce(array_agg(nextval('extraction_jobs_id_seq')), '{}') AS ids FROM generate_series(1, $1);

-- name: job_ids_of_batch
-- Batch $1's job ids in batch order as ONE int8[] value: a million ids decode to a list of
-- ints without a Record per row.
SELECT coalesce(array_agg(id ORDER BY ordinal), '{}') AS ids FROM extraction_jobs WHERE batch_id = $1;

-- name: job_hold_batch
-- Mark every job of batch $1 suspended, so none enters the claim index
-- (extraction_jobs_fair_claimable); acceptance runs it, after the job rows are in, for a batch
-- accepted suspended (docs/fairness.md). Resumption is batch_set_suspended.
UPDATE extraction_jobs SET suspended = true WHERE batch_id = $1;

-- name: job_insert_settings_set_local
-- Until the transaction ends: work_mem $1 (the counters' triggers, migration 0025, keep each
-- statement's inserted rows, a batch's job rows or its documents' text, in a tuplestore that
-- spills to a temporary file beyond work_mem), and lading.queued_counted $2: 'on' when the
-- transaction writes its own tenant_queued row for the jobs and documents it inserts (the insert
-- triggers then skip their work, migration 0032), 'off' to leave the counting to them.
SELECT set_config('work_mem', $1, true), set_config('lading.queued_counted', $2, true);

-- name: job_queued_add
-- Add $2 queued jobs and $3 bytes of their documents to tenant $1's queue counters, for a
-- transaction that set lading.queued_counted (job_insert_settings_set_local), and set it back to
-- 'off': whatever the same transaction inserts afterwards is counted by the triggers again.
SELECT lading_tenant_queued_add($1, $2, $3), set_config('lading.queued_counted', 'off', true);

-- name: job_notify_available
-- Wake the idle claimers of pool $1 (NOTIFY on channel lading_jobs, delivered at commit).
SELECT pg_notify('lading_jobs', $1);

-- name: job_claim_batch
-- READY | RETRY_SCHEDULED -> RUNNING for up to $2 jobs of pool $1, shared fairly among its
-- tenants; $3 worker id, $4 lease TTL (s). One statement:
--  * plan: lading_claim_plan (migration 0010, docs/fairness.md) says which tenants get how
--    many (weighted virtual time, in-flight caps, daily token budgets, paused pool) and locks
--    those tenants until commit. It reads under its locks with fresh snapshots, so caps and
--    virtual times are exact across replicas;
--  * pick: each tenant's next jobs by aged priority (lading_claim_rank: due time + 300 s per
--    class) from extraction_jobs_fair_claimable, `take` index entries per tenant whatever the
--    backlog, SKIP LOCKED. (A job claimed by a concurrent claim since this statement began fails
--    the recheck of the lock and the scan moves on, so the plan's count is still met);
--  * take ownership (attempt+1, fence+1, lease), mark the job's result-reuse key for a worker that
--    calls model $5 with prompt version $6 and judging settings $7 (lading_reuse_key; NULL $5: the
--    mark is left as it is), so that a copy claimed later waits for this job (lading_reuse_resolve,
--    migration 0029: a job that waits has its mark cleared there), in the row version the claim
--    writes anyway; open the attempt row, charge each tenant's
--    virtual time for what it got, and return what the executor needs: the document's text, or
--    for a document given by manifest (text NULL) its URI, SHA-256, size and the batch's
--    namespace (file:// URIs are read only beneath <root>/<namespace>/), which the worker fetches
--    and verifies outside any transaction. One statement, one read of each row.
WITH plan AS (
    SELECT * FROM lading_claim_plan($1, $2)
), picked AS (
    SELECT h.id
      FROM plan p
     CROSS JOIN LATERAL (
           SELECT j.id
             FROM extraction_jobs j
            WHERE j.pool = $1 AND j.tenant = p.tenant AND {{job_eligible}}
              -- Due means ranked within 600 s of now (class 2 x 300 s): the scan stops there. (The
              -- statement's start, not clock_timestamp(): a bound an index scan can use.)
              AND lading_claim_rank(j.available_at, j.priority) <= statement_timestamp() + interval '600 seconds'
            ORDER BY lading_claim_rank(j.available_at, j.priority), j.id
            LIMIT p.take
              FOR UPDATE SKIP LOCKED
           ) h
     LIMIT $2  -- tells the planner how few rows follow (and so to join the documents by index)
), claimed AS (
    UPDATE extraction_jobs j
       SET state = 'RUNNING', attempt = j.attempt + 1, fence = j.fence + 1, worker_id = $3,
           lease_until = clock_timestamp() + make_interval(secs => $4), updated_at = clock_timestamp(),
           reuse_key = CASE WHEN $5::text IS NULL THEN j.reuse_key
                            ELSE lading_reuse_key(j.content_sha256, j.schema, j.validation_policy, $5, $6, $7) END
      FROM picked
     WHERE j.id = picked.id
    RETURNING j.id, j.tenant, j.batch_id, j.document_key, j.attempt, j.max_attempts, j.fence,
              j.lease_until, j.deadline_at, j.schema, j.validation_policy, j.pool
), opened AS (
    INSERT INTO job_attempts (job_id, fence, attempt, worker_id, started_at)
    SELECT id, fence, attempt, $3, clock_timestamp() FROM claimed
), charged AS (
    UPDATE tenant_queues q
       SET vtime = p.vtime + g.n::float8 / p.weight, served = q.served + g.n, served_at = clock_timestamp()
      FROM (SELECT tenant, count(*) AS n FROM claimed GROUP BY tenant) g
      JOIN plan p ON p.tenant = g.tenant
     WHERE q.pool = $1 AND q.tenant = g.tenant
)
SELECT c.*, d.text, d.uri, d.sha256, d.bytes,
       CASE WHEN d.uri IS NOT NULL THEN (SELECT b.namespace FROM batches b WHERE b.id = c.batch_id) END AS namespace,
       -- Whether the job may take an earlier result or wait for a copy (its batch's spec.reuse and its
       -- tenant's resultReuse; asked only with $5): a claimed batch of which no job may needs no
       -- lading_reuse_resolve at all.
       CASE WHEN $5::text IS NOT NULL THEN
            (SELECT b.reuse FROM batches b WHERE b.id = c.batch_id)
            AND coalesce((SELECT t.spec ->> 'resultReuse' FROM tenants t WHERE t.name = c.tenant), 'tenant') <> 'none'
       END AS may_reuse,
       clock_timestamp() AS claimed_at, prev.error_class AS previous_error_class,
       prev.output_sha256 AS previous_output_sha256
  FROM claimed c
  JOIN job_documents d ON d.job_id = c.id
  LEFT JOIN LATERAL (
       -- A first claim (fence 1) has no earlier attempt: not looked for (whatever plan the
       -- statement runs, made once per connection: migration 0043).
       SELECT a.error_class, a.output_sha256 FROM job_attempts a
        WHERE c.fence > 1 AND a.job_id = c.id AND a.fence < c.fence
        ORDER BY a.fence DESC LIMIT 1
       ) prev ON true
 ORDER BY c.id;

-- name: job_finish_many
-- RUNNING -> SUCCEEDED | REVIEW_REQUIRED | RETRY_SCHEDULED | FAILED_TERMINAL, for many
-- attempts in one statement. Each row is a compare-and-set on (owner, fence, unexpired
-- lease): a stale attempt changes nothing and is recorded in stale_completions. The
-- attempt row, the result row and (by trigger) the outbox row commit with the state.
-- "Running" is written as `lease_until > clock_timestamp()`: the CHECK running_has_lease
-- makes a lease exist exactly while a job is RUNNING, and this form keeps the planner on
-- the primary key instead of joining every submitted row against every running job.
-- A value PostgreSQL cannot store fails the whole statement with a data error (SQLSTATE class
-- 22/54); the committer then splits the group to isolate it (lading.storable.isolate).
-- $1..$14 and $16, $17 are the per-attempt arrays, one element per attempt; $15 is the committing
-- worker. $16/$17: what the attempt cost and in which currency (NULL: an unpriced pool), added to
-- the attempt, the job, its batch's sum (batch_costs) and the tenant's spend of the day
-- (tenant_spend) whether or not the attempt was stale: the call was paid for (docs/cost.md). A
-- stale attempt the reaper already closed was charged its reservation there and is not charged
-- again. NULL cost with a currency: a pool priced by GPU time, whose attempt's cost is pending
-- until its interval closes (lading_elected.gpu_costs); nothing is added here.
WITH input AS (
    SELECT *
      FROM unnest($1::bigint[], $2::bigint[], $3::text[], $4::float8[], $5::text[], $6::text[], $7::text[],
                  $8::bigint[], $9::bigint[], $10::int[], $11::jsonb[], $12::jsonb[], $13::text[], $14::bool[],
                  $16::numeric[], $17::text[])
           AS t(job_id, fence, to_state, retry_in_s, outcome, error_class, error,
                tokens_in, tokens_out, latency_ms, result, validation, output_sha256, give_back,
                cost, cost_currency)
), locked AS (
    -- Lock the rows in id order before changing them (see job_heartbeat_many); with each attempt's
    -- input, its job's tenant and batch, read here once for the updates and the usage and spend rows
    -- below, so that none of them joins two of these row sets (whose sizes the planner cannot know:
    -- a nested loop over two of them costs n² comparisons).
    SELECT i.*, j.tenant, j.batch_id
      FROM input i JOIN extraction_jobs j ON j.id = i.job_id
     ORDER BY j.id
       FOR UPDATE OF j
), finished AS (
    UPDATE extraction_jobs j
       SET state = i.to_state,
           -- An attempt the endpoint could not serve at all (key refused, quota spent) is given back.
           attempt = j.attempt - CASE WHEN i.give_back AND i.to_state = 'RETRY_SCHEDULED' THEN 1 ELSE 0 END,
           lease_until = NULL,
           worker_id = NULL,
           available_at = CASE WHEN i.to_state = 'RETRY_SCHEDULED'
                               THEN clock_timestamp() + make_interval(secs => coalesce(i.retry_in_s, 0))
                               ELSE j.available_at END,
           finished_at = CASE WHEN i.to_state IN ('SUCCEEDED', 'FAILED_TERMINAL') THEN clock_timestamp() END,
           last_error_class = i.error_class,
           last_error = i.error,
           cost = CASE WHEN i.cost IS NULL OR j.cost_currency <> i.cost_currency THEN j.cost
                       ELSE coalesce(j.cost, 0) + i.cost END,
           cost_currency = CASE WHEN i.cost IS NULL THEN j.cost_currency
                                ELSE coalesce(j.cost_currency, i.cost_currency) END,
           updated_at = clock_timestamp()
      FROM locked i
     WHERE j.id = i.job_id
       AND j.fence = i.fence
       AND j.worker_id = $15
       AND j.lease_until > clock_timestamp()
       AND i.to_state IN ('SUCCEEDED', 'REVIEW_REQUIRED', 'RETRY_SCHEDULED', 'FAILED_TERMINAL')
    RETURNING j.id, j.fence, j.schema, j.validation_policy, i.to_state, i.result, i.validation, j.batch_id,
              CASE WHEN j.cost_currency = i.cost_currency THEN i.cost END AS added, i.cost_currency
), closed AS (
    -- Each attempt found by primary key (the LATERAL ... LIMIT 1 is planned per attempt), then
    -- changed by its row address, whatever job_attempts' statistics say. Joined to the input, the
    -- planner hashed every open attempt of the table on statistics taken while it was empty or
    -- small (a new or emptied database before autovacuum): a sequential scan per commit, growing
    -- with the attempts. (On a table of a few dozen pages it still scans it: cheaper there.)
    UPDATE job_attempts a
       SET finished_at = clock_timestamp(),
           outcome = CASE WHEN i.job_id IN (SELECT id FROM finished) THEN i.outcome ELSE 'stale' END,
           error_class = i.error_class, error = i.error,
           tokens_in = i.tokens_in, tokens_out = i.tokens_out, latency_ms = i.latency_ms,
           output_sha256 = i.output_sha256, cost = i.cost, cost_currency = i.cost_currency
      FROM input i
     WHERE a.ctid = ANY (ARRAY(SELECT x.tid
                                  FROM input k
                                 CROSS JOIN LATERAL (SELECT o.ctid AS tid FROM job_attempts o
                                                      WHERE o.job_id = k.job_id AND o.fence = k.fence LIMIT 1) x))
       AND a.job_id = i.job_id AND a.fence = i.fence AND a.finished_at IS NULL
    RETURNING a.job_id
), stored AS (
    INSERT INTO results (job_id, fence, schema, validation_policy, result, validation)
    SELECT id, fence, schema, validation_policy, result, validation
      FROM finished
     WHERE result IS NOT NULL AND to_state IN ('SUCCEEDED', 'REVIEW_REQUIRED')
), stale AS (
    INSERT INTO stale_completions (job_id, fence, worker_id)
    SELECT i.job_id, i.fence, $15 FROM input i WHERE i.job_id NOT IN (SELECT id FROM finished)
), stale_cost AS (
    -- A stale attempt's call was paid for too: its job's sum includes it (rows held by `locked`).
    UPDATE extraction_jobs j
       SET cost = coalesce(j.cost, 0) + i.cost, cost_currency = coalesce(j.cost_currency, i.cost_currency)
      FROM locked i
     WHERE j.id = i.job_id AND i.job_id NOT IN (SELECT id FROM finished)
       AND i.job_id IN (SELECT job_id FROM closed)  -- not one the reaper closed (charged there)
       AND i.cost IS NOT NULL AND (j.cost_currency IS NULL OR j.cost_currency = i.cost_currency)
    RETURNING j.id, j.batch_id, i.cost AS added, i.cost_currency
), spent AS (
    -- Money spent counts against the tenant's budget whether or not the attempt was stale (but
    -- once: not again for an attempt the reaper closed); rows in (tenant, currency) order, like
    -- tenant_usage below.
    INSERT INTO tenant_spend AS s (tenant, currency, day, amount)
    SELECT i.tenant, i.cost_currency, (clock_timestamp() AT TIME ZONE 'UTC')::date, sum(i.cost)
      FROM locked i
     WHERE i.cost > 0
       AND (i.job_id IN (SELECT id FROM finished) OR i.job_id IN (SELECT job_id FROM closed))
     GROUP BY i.tenant, i.cost_currency
     ORDER BY i.tenant, i.cost_currency
    ON CONFLICT (tenant, currency, day) DO UPDATE SET amount = s.amount + EXCLUDED.amount
), batch_spent AS (
    -- The batches' running sums (migration 0027): exactly what was added to their jobs above, in
    -- (batch, currency) order.
    INSERT INTO batch_costs AS b (batch_id, currency, amount)
    SELECT c.batch_id, c.cost_currency, sum(c.added)
      FROM (SELECT batch_id, cost_currency, added FROM finished
            UNION ALL SELECT batch_id, cost_currency, added FROM stale_cost) c
     WHERE c.added IS NOT NULL
     GROUP BY c.batch_id, c.cost_currency
     ORDER BY c.batch_id, c.cost_currency
    ON CONFLICT (batch_id, currency) DO UPDATE SET amount = b.amount + EXCLUDED.amount
), used AS (
    -- Tokens spent count against the tenant's daily budget whether or not the attempt was stale.
    -- Tenants in name order: two finishing statements lock their usage rows in the same order.
    INSERT INTO tenant_usage AS u (tenant, day, tokens)
    SELECT i.tenant, (clock_timestamp() AT TIME ZONE 'UTC')::date,
           sum(coalesce(i.tokens_in, 0)::bigint + coalesce(i.tokens_out, 0))
      FROM locked i
     WHERE coalesce(i.tokens_in, 0) + coalesce(i.tokens_out, 0) > 0
     GROUP BY i.tenant
     ORDER BY i.tenant
    ON CONFLICT (tenant, day) DO UPDATE SET tokens = u.tokens + EXCLUDED.tokens
)
SELECT id FROM finished;

-- name: job_heartbeat_many
-- Extend the leases this worker still owns; a job missing from the result is lost.
-- (A lease exists only while RUNNING; see job_finish_many on why it is written this way.)
-- Rows are locked in id order first, as job_finish_many does: the worker's heartbeater and
-- committer touch the same rows from two connections, and in any other order they deadlock.
WITH locked AS (
    SELECT j.id
      FROM extraction_jobs j JOIN unnest($1::bigint[], $2::bigint[]) AS h(job_id, fence) ON j.id = h.job_id
     WHERE j.fence = h.fence AND j.worker_id = $4 AND j.lease_until > clock_timestamp()
     ORDER BY j.id
       FOR UPDATE OF j
)
UPDATE extraction_jobs j
   SET lease_until = clock_timestamp() + make_interval(secs => $3), updated_at = clock_timestamp()
  FROM locked l
 WHERE j.id = l.id AND j.worker_id = $4 AND j.lease_until > clock_timestamp()
RETURNING j.id;

-- name: job_release_many
-- RUNNING -> RETRY_SCHEDULED, due at once, for claims whose model call never started
-- (prefetched by a worker that is shutting down). The unstarted attempt is given back
-- (attempt-1) and closed as cancelled; fence+1 so the old claim can never commit.
-- Rows are locked in id order first (see job_heartbeat_many): the heartbeater and committer
-- may still be touching the same rows from their own connections.
WITH input AS (
    SELECT * FROM unnest($1::bigint[], $2::bigint[]) AS t(job_id, fence)
), locked AS (
    SELECT j.id FROM extraction_jobs j WHERE j.id = ANY($1::bigint[]) ORDER BY j.id FOR UPDATE
), released AS (
    UPDATE extraction_jobs j
       SET state = 'RETRY_SCHEDULED', attempt = j.attempt - 1, fence = j.fence + 1, lease_until = NULL,
           worker_id = NULL, available_at = clock_timestamp(), updated_at = clock_timestamp()
      FROM input i JOIN locked l ON l.id = i.job_id
     WHERE j.id = i.job_id AND j.fence = i.fence AND j.worker_id = $3
       AND j.lease_until > clock_timestamp()  -- i.e. RUNNING and still ours
    RETURNING j.id, i.fence AS old_fence
), closed AS (
    UPDATE job_attempts a
       SET finished_at = clock_timestamp(), outcome = 'cancelled', error_class = 'Released',
           error = 'claimed ahead and released unstarted at worker shutdown'
      FROM released r
     WHERE a.job_id = r.id AND a.fence = r.old_fence AND a.finished_at IS NULL
)
SELECT id FROM released;

-- name: job_resolve_reuse
-- What each of the jobs $1 (fences $2) worker $3 just claimed does, for model $4, prompt version
-- $5 and judging settings $6: take an earlier result, wait for a duplicate in flight (only with its
-- deadline more than $7 s away), or lead (call the model). lading_reuse_resolve (migrations 0029, 0041).
SELECT job_id, decision, other_job, waits, result, validation, saved_cost, saved_currency
  FROM lading_reuse_resolve($1::bigint[], $2::bigint[], $3, $4, $5, $6, $7);

-- name: job_finish_reused_many
-- RUNNING -> SUCCEEDED for attempts that took an earlier accepted result instead of calling the
-- model (lading_reuse_resolve, migration 0019; docs/reuse.md). The compare-and-set of
-- job_finish_many on (owner, fence, unexpired lease); the job records the job it took the result
-- from (reused_from), its attempt row closes as `reused` with no tokens, the result and verdict are
-- stored as taken, and the triggers write the completion event and the delivery like for any other
-- success. A stale attempt changes nothing and is recorded in stale_completions.
-- On a priced pool the attempt costs exactly 0 in the pool's currency, and the job's and batch's
-- sums gain that 0 (a batch of reused jobs costs 0, not nothing); on an unpriced pool, NULL.
-- $1 job ids, $2 fences, $3 the jobs the results come from, $4 results, $5 verdicts; $6 the worker.
WITH input AS (
    SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::bigint[], $4::jsonb[], $5::jsonb[])
           AS t(job_id, fence, source, result, validation)
), locked AS (
    -- Lock the rows in id order before changing them (see job_heartbeat_many); with each attempt's
    -- input, its job's pool's currency (NULL: unpriced), read here once (see job_finish_many on why
    -- nothing below joins two of these row sets).
    SELECT i.*, p.spec -> 'pricing' ->> 'currency' AS currency
      FROM input i JOIN extraction_jobs j ON j.id = i.job_id LEFT JOIN pools p ON p.name = j.pool
     ORDER BY j.id
       FOR UPDATE OF j
), finished AS (
    UPDATE extraction_jobs j
       SET state = 'SUCCEEDED', reused_from = i.source, lease_until = NULL, worker_id = NULL,
           finished_at = clock_timestamp(), last_error_class = NULL, last_error = NULL,
           cost = CASE WHEN i.currency IS NOT NULL AND coalesce(j.cost_currency, i.currency) = i.currency
                       THEN coalesce(j.cost, 0) ELSE j.cost END,
           cost_currency = coalesce(j.cost_currency, i.currency),
           updated_at = clock_timestamp()
      FROM locked i
     WHERE j.id = i.job_id
       AND j.fence = i.fence
       AND j.worker_id = $6
       AND j.lease_until > clock_timestamp()
    RETURNING j.id, j.fence, j.schema, j.validation_policy, i.result, i.validation, j.batch_id,
              CASE WHEN j.cost_currency = i.currency THEN i.currency END AS currency
), closed AS (
    UPDATE job_attempts a
       SET finished_at = clock_timestamp(),
           outcome = CASE WHEN i.job_id IN (SELECT id FROM finished) THEN 'reused' ELSE 'stale' END,
           tokens_in = 0, tokens_out = 0, latency_ms = 0,
           cost = CASE WHEN i.currency IS NOT NULL THEN 0 END, cost_currency = i.currency
      FROM locked i
     WHERE a.job_id = i.job_id AND a.fence = i.fence AND a.finished_at IS NULL
), batch_spent AS (
    -- The batch's running sum (migration 0027) gains a row at 0, so the batch shows its currency.
    INSERT INTO batch_costs AS b (batch_id, currency)
    SELECT DISTINCT f.batch_id, f.currency FROM finished f WHERE f.currency IS NOT NULL
     ORDER BY f.batch_id, f.currency
    ON CONFLICT (batch_id, currency) DO NOTHING
), stored AS (
    INSERT INTO results (job_id, fence, schema, validation_policy, result, validation)
    SELECT id, fence, schema, validation_policy, result, validation FROM finished
), stale AS (
    INSERT INTO stale_completions (job_id, fence, worker_id)
    SELECT i.job_id, i.fence, $6 FROM input i WHERE i.job_id NOT IN (SELECT id FROM finished)
)
SELECT id FROM finished;

-- name: job_count_reused_of_batch
-- Jobs of batch $1 that took an earlier accepted result (extraction_jobs_reused_by_batch, migration
-- 0019: only such jobs are in it). For status, `lading run` and `lading status`.
SELECT count(*)::bigint FROM extraction_jobs WHERE batch_id = $1 AND reused_from IS NOT NULL;

-- name: job_lock_expired_leases
-- The reaper's first step, inside its transaction: running jobs whose lease ran out.
SELECT id, fence, attempt, max_attempts, deadline_at, clock_timestamp() AS now
  FROM extraction_jobs
 WHERE state = 'RUNNING' AND lease_until < clock_timestamp()
 ORDER BY lease_until
 LIMIT $1
   FOR UPDATE SKIP LOCKED;

-- name: job_reap_many
-- RUNNING (lease expired) -> RETRY_SCHEDULED | FAILED_TERMINAL, fence+1 so the old owner
-- can never commit; the abandoned attempt row is closed as lease-expired.
-- Its request may have been sent, and billed: on a pool priced per token the attempt is charged
-- its reservation (reserved_tokens_in/out, noted by the worker before it sent the request; none
-- noted, nothing sent: 0) at the pool's prices, and the charge is added to the job, its batch's
-- sum and the tenant's spend, like a timed-out request's (docs/cost.md). On a pool priced by GPU
-- time it is left pending (cost NULL, currency set), its reservation weighing as its tokens in its
-- interval's allocation.
WITH input AS (
    SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::text[], $4::float8[], $5::text[])
           AS t(job_id, fence, to_state, retry_in_s, error_class)
), charged AS (
    -- The rows are locked already (job_lock_expired_leases, same transaction).
    SELECT i.job_id, j.tenant, j.batch_id, pr.currency,
           CASE WHEN pr.price_in IS NOT NULL AND pr.price_out IS NOT NULL
                THEN (coalesce(a.reserved_tokens_in, 0) * pr.price_in
                      + coalesce(a.reserved_tokens_out, 0) * pr.price_out) * 0.000001 END AS cost
      FROM input i
      JOIN extraction_jobs j ON j.id = i.job_id AND j.fence = i.fence AND j.lease_until < clock_timestamp()
      JOIN job_attempts a ON a.job_id = i.job_id AND a.fence = i.fence AND a.finished_at IS NULL
      LEFT JOIN pools p ON p.name = j.pool
      CROSS JOIN LATERAL (
          SELECT p.spec -> 'pricing' ->> 'currency' AS currency,
                 (p.spec -> 'pricing' ->> 'inputPerMillionTokens')::numeric AS price_in,
                 (p.spec -> 'pricing' ->> 'outputPerMillionTokens')::numeric AS price_out
      ) pr
     WHERE i.to_state IN ('RETRY_SCHEDULED', 'FAILED_TERMINAL')
), reaped AS (
    UPDATE extraction_jobs j
       SET state = i.to_state,
           fence = j.fence + 1,
           lease_until = NULL,
           worker_id = NULL,
           available_at = clock_timestamp() + make_interval(secs => coalesce(i.retry_in_s, 0)),
           finished_at = CASE WHEN i.to_state = 'FAILED_TERMINAL' THEN clock_timestamp() END,
           last_error_class = i.error_class,
           last_error = 'lease expired: the worker stopped heartbeating',
           cost = CASE WHEN c.cost IS NULL OR j.cost_currency <> c.currency THEN j.cost
                       ELSE coalesce(j.cost, 0) + c.cost END,
           cost_currency = CASE WHEN c.cost IS NULL THEN j.cost_currency
                                ELSE coalesce(j.cost_currency, c.currency) END,
           updated_at = clock_timestamp()
      FROM input i LEFT JOIN charged c ON c.job_id = i.job_id
     WHERE j.id = i.job_id AND j.fence = i.fence AND j.lease_until < clock_timestamp()  -- i.e. RUNNING, expired
       AND i.to_state IN ('RETRY_SCHEDULED', 'FAILED_TERMINAL')
    RETURNING j.id, i.fence AS old_fence, i.to_state, j.batch_id,
              CASE WHEN j.cost_currency = c.currency THEN c.cost END AS added, c.currency
), closed AS (
    UPDATE job_attempts a
       SET finished_at = clock_timestamp(), outcome = 'lease-expired', error_class = 'LeaseExpired',
           cost = c.cost, cost_currency = c.currency
      FROM reaped r LEFT JOIN charged c ON c.job_id = r.id
     WHERE a.job_id = r.id AND a.fence = r.old_fence AND a.finished_at IS NULL
), spent AS (
    -- Rows in (tenant, currency) order, like job_finish_many.
    INSERT INTO tenant_spend AS s (tenant, currency, day, amount)
    SELECT c.tenant, c.currency, (clock_timestamp() AT TIME ZONE 'UTC')::date, sum(c.cost)
      FROM charged c JOIN reaped r ON r.id = c.job_id
     WHERE c.cost > 0
     GROUP BY c.tenant, c.currency
     ORDER BY c.tenant, c.currency
    ON CONFLICT (tenant, currency, day) DO UPDATE SET amount = s.amount + EXCLUDED.amount
), batch_spent AS (
    INSERT INTO batch_costs AS b (batch_id, currency, amount)
    SELECT r.batch_id, r.currency, sum(r.added)
      FROM reaped r
     WHERE r.added IS NOT NULL
     GROUP BY r.batch_id, r.currency
     ORDER BY r.batch_id, r.currency
    ON CONFLICT (batch_id, currency) DO UPDATE SET amount = b.amount + EXCLUDED.amount
)
SELECT id, to_state FROM reaped;

-- name: job_expire_waiting
-- READY | RETRY_SCHEDULED -> FAILED_TERMINAL for jobs whose deadline passed while waiting.
WITH expired AS (
    SELECT id FROM extraction_jobs
     WHERE state IN ('READY', 'RETRY_SCHEDULED') AND deadline_at <= clock_timestamp()
     ORDER BY deadline_at
     LIMIT $1
       FOR UPDATE SKIP LOCKED
)
UPDATE extraction_jobs j
   SET state = 'FAILED_TERMINAL', finished_at = clock_timestamp(), updated_at = clock_timestamp(),
       last_error_class = 'DEADLINE_EXCEEDED', last_error = 'the job deadline passed before it could run'
  FROM expired
 WHERE j.id = expired.id
RETURNING j.id;

-- name: job_cancel_batch
-- Any non-terminal state -> CANCELLED (a deleted or cancelled batch). A running attempt
-- loses its lease here and its late completion is discarded as stale.
-- The batch's rows are locked in id order first: running ones are also locked, in id order,
-- by their workers' heartbeats and group commits.
WITH locked AS (
    SELECT j.id
      FROM extraction_jobs j
     WHERE j.batch_id = $1 AND j.state IN ('READY', 'RUNNING', 'RETRY_SCHEDULED', 'REVIEW_REQUIRED')
     ORDER BY j.id
       FOR UPDATE
)
UPDATE extraction_jobs j
   SET state = 'CANCELLED', lease_until = NULL, worker_id = NULL, finished_at = clock_timestamp(),
       updated_at = clock_timestamp(), last_error_class = 'CANCELLED', last_error = $2
  FROM locked l
 WHERE j.id = l.id
   AND j.state IN ('READY', 'RUNNING', 'RETRY_SCHEDULED', 'REVIEW_REQUIRED')
RETURNING j.id;

-- name: job_cancel
UPDATE extraction_jobs
   SET state = 'CANCELLED', lease_until = NULL, worker_id = NULL, finished_at = clock_timestamp(),
       updated_at = clock_timestamp(), last_error_class = 'CANCELLED', last_error = $2
 WHERE id = $1
   AND state IN ('READY', 'RUNNING', 'RETRY_SCHEDULED', 'REVIEW_REQUIRED')
RETURNING id;

-- name: job_review_decide
-- REVIEW_REQUIRED -> SUCCEEDED (approved) | FAILED_TERMINAL (rejected), by a reviewer.
-- $3, the reviewer's note, becomes the error of a rejected job; an approved one has none.
-- (Who decided and why is in review_decisions: lading/reviewing.py writes both at once.)
UPDATE extraction_jobs
   SET state = $2, finished_at = clock_timestamp(), updated_at = clock_timestamp(),
       last_error_class = CASE WHEN $2 = 'FAILED_TERMINAL' THEN 'REJECTED_BY_REVIEWER' END,
       last_error = CASE WHEN $2 = 'FAILED_TERMINAL' THEN $3 END
 WHERE id = $1 AND state = 'REVIEW_REQUIRED' AND $2 IN ('SUCCEEDED', 'FAILED_TERMINAL')
RETURNING id;

-- name: job_get
SELECT id, tenant, batch_id, document_key, state, attempt, max_attempts, fence, lease_until, worker_id,
       available_at, deadline_at, finished_at, last_error_class, last_error, priority, pool
  FROM extraction_jobs WHERE id = $1;

-- name: job_attempts_of
SELECT fence, attempt, worker_id, started_at, finished_at, outcome, error_class, error,
       tokens_in, tokens_out, latency_ms
  FROM job_attempts WHERE job_id = $1 ORDER BY fence;

-- name: job_review_queue_list
-- One keyset page of the jobs waiting for a reviewer, in id order: ids after $1 (0 = from the
-- start), at most $2 rows (the caller asks for one more than it shows, to learn whether
-- another page exists), of tenant $3 (NULL = every tenant). Walks
-- extraction_jobs_review_queue_by_id (migration 0003); the failed check ids come from the
-- stored verdict ({"failed_checks": [{"check": ...}, ...]}), [] when it has none.
SELECT j.id, j.tenant, b.namespace AS batch_namespace, b.name AS batch_name, j.document_key,
       j.validation_policy, j.updated_at AS waiting_since,
       extract(epoch FROM now() - j.updated_at)::float8 AS waiting_age_s,
       coalesce(jsonb_path_query_array(r.validation, '$.failed_checks[*].check'), '[]'::jsonb) AS failed_checks
  FROM extraction_jobs j
  JOIN batches b ON b.id = j.batch_id
  LEFT JOIN results r ON r.job_id = j.id
 WHERE j.state = 'REVIEW_REQUIRED'
   AND j.id > $1
   AND ($3::text IS NULL OR j.tenant = $3)
 ORDER BY j.id
 LIMIT $2;

-- name: job_get_for_correction
-- What judging a correction of job $1 needs: its schema, its validation policy and its
-- document's text (which the policy's evidence checks quote).
SELECT j.schema, j.validation_policy, d.text
  FROM extraction_jobs j
  JOIN job_documents d ON d.job_id = j.id
 WHERE j.id = $1;

-- name: job_count_unfinished_by_state
-- Non-terminal jobs by pool, tenant and state. Terminal states are not counted here: they grow
-- without bound and a count over them would cost a scan of history every interval; the
-- attempts-finished counters and `lading jobs list` cover them.
SELECT pool, tenant, state, count(*)::bigint AS n
  FROM extraction_jobs
 WHERE state IN ('READY', 'RETRY_SCHEDULED', 'RUNNING', 'REVIEW_REQUIRED')
 GROUP BY pool, tenant, state;

-- name: job_oldest_eligible_age_by_pool
-- Per pool: age of the oldest eligible job (the autoscaling signal). Never below 0: a job that
-- became due after the transaction began (now()) is eligible by the database clock.
SELECT j.pool, greatest(extract(epoch FROM now() - min(j.available_at)), 0)::float8 AS age_s
  FROM extraction_jobs j
 WHERE {{job_eligible}}
 GROUP BY j.pool;

-- name: job_review_queue_summary
-- Jobs awaiting a reviewer, and how long the oldest has waited.
SELECT count(*)::bigint AS size, coalesce(extract(epoch FROM now() - min(updated_at)), 0)::float8 AS oldest_age_s
  FROM extraction_jobs
 WHERE state = 'REVIEW_REQUIRED';

-- name: job_list_failures_of_batch
-- The most recent terminal failures of batch $1, newest first, at most $2.
SELECT document_key, coalesce(last_error_class, 'Failed') AS error_class, coalesce(last_error, '') AS error,
       finished_at
  FROM extraction_jobs
 WHERE batch_id = $1 AND state = 'FAILED_TERMINAL'
 ORDER BY finished_at DESC, id DESC
 LIMIT $2;

-- name: job_list_report
-- One keyset page of jobs in id order: ids after $1 (0 = from the start), at most $2 rows
-- (the caller asks for one more than it shows, to learn whether another page exists).
-- Filters are NULL when not given: $3 tenant, $4 states, $5 pool. Walks the primary key
-- until the page is full: no index serves tenant or a settled state, so a rare match costs
-- a longer walk, never more than the table.
SELECT j.id, j.tenant, b.namespace AS batch_namespace, b.name AS batch_name, j.document_key, j.state,
       j.attempt, j.max_attempts, j.last_error_class, j.updated_at,
       extract(epoch FROM now() - j.updated_at)::float8 AS updated_age_s
  FROM extraction_jobs j
  JOIN batches b ON b.id = j.batch_id
 WHERE j.id > $1
   AND ($3::text IS NULL OR j.tenant = $3)
   AND ($4::text[] IS NULL OR j.state = ANY ($4::text[]))
   AND ($5::text IS NULL OR j.pool = $5)
 ORDER BY j.id
 LIMIT $2;

-- name: job_list_report_in_batch
-- job_list_report for the jobs of the batches named $6/$7 (namespace, name: several when
-- one was deleted and created again). MATERIALIZED makes the planner find them through the
-- (batch_id, document_key) index and sort them, costing one batch, instead of walking the
-- primary key across every older job to fill the page.
WITH named AS (
    SELECT id, namespace, name FROM batches WHERE namespace = $6 AND name = $7 ORDER BY id LIMIT 100
), candidates AS MATERIALIZED (
    SELECT j.id, j.tenant, n.namespace AS batch_namespace, n.name AS batch_name, j.document_key, j.state,
           j.attempt, j.max_attempts, j.last_error_class, j.updated_at
      FROM named n
      JOIN extraction_jobs j ON j.batch_id = n.id
     WHERE j.id > $1
       AND ($3::text IS NULL OR j.tenant = $3)
       AND ($4::text[] IS NULL OR j.state = ANY ($4::text[]))
       AND ($5::text IS NULL OR j.pool = $5)
)
SELECT c.*, extract(epoch FROM now() - c.updated_at)::float8 AS updated_age_s
  FROM candidates c
 ORDER BY c.id
 LIMIT $2;

-- name: job_get_report
-- One job with its batch's name, by primary key. Never the document text: see document_get_report.
SELECT j.id, j.tenant, j.batch_id, b.namespace AS batch_namespace, b.name AS batch_name, j.pool, j.schema,
       j.validation_policy, j.document_key, j.state, j.priority, j.attempt, j.max_attempts, j.fence,
       j.lease_until, j.worker_id, j.available_at, j.deadline_at, j.created_at, j.updated_at, j.finished_at,
       j.last_error_class, j.last_error, j.document_deleted_at, j.result_deleted_at, j.reused_from, now() AS as_of
  FROM extraction_jobs j
  JOIN batches b ON b.id = j.batch_id
 WHERE j.id = $1;

-- name: job_review_queue_report
-- Jobs waiting for a reviewer, and since when (updated_at is when they entered the state:
-- nothing touches a job in REVIEW_REQUIRED until a reviewer or a cancellation moves it).
-- Uses extraction_jobs_review_queue (migration 0002).
SELECT count(*)::bigint AS size, min(updated_at) AS oldest_at,
       extract(epoch FROM now() - min(updated_at))::float8 AS oldest_age_s
  FROM extraction_jobs
 WHERE state = 'REVIEW_REQUIRED';
