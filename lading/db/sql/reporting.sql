-- Read-only queries for people: `lading jobs list`, `lading jobs show`, `lading status`
-- (run by lading/db/reporting.py). They change nothing and take no locks beyond a snapshot.
--
-- Every list has a LIMIT and follows an index. Counts read a partial index (the claimable,
-- leases and unpublished sets, which are the work still to do) or one batch's rows, except
-- the two marked "no index": those read a whole table (see their notes).
--
-- Ages are measured against now(), the start of the caller's transaction, never the
-- client's clock: `lading status` runs its queries in one read-only snapshot, so its
-- figures agree with each other. (A row committed just after that transaction started can
-- be a few milliseconds "younger than now": the repository reads such an age as 0.)

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
       j.last_error_class, j.last_error, now() AS as_of
  FROM extraction_jobs j
  JOIN batches b ON b.id = j.batch_id
 WHERE j.id = $1;

-- name: attempt_list_report
-- Every attempt of job $1 in fence order, at most $2 (primary key (job_id, fence)).
SELECT fence, attempt, worker_id, started_at, finished_at, outcome, error_class, error,
       tokens_in, tokens_out, latency_ms
  FROM job_attempts
 WHERE job_id = $1
 ORDER BY fence
 LIMIT $2;

-- name: result_get_report
SELECT fence, schema, validation_policy, result, validation, created_at FROM results WHERE job_id = $1;

-- name: document_get_report
-- The document text: only on explicit request (`lading jobs show --show-document`).
SELECT text FROM job_documents WHERE job_id = $1;

-- name: outbox_list_report
-- The events of job $1 (state changes written by the trigger), at most $2.
-- Uses outbox_events_by_job (migration 0002).
SELECT id, event_id, type, created_at, published_at
  FROM outbox_events
 WHERE aggregate_type = 'job' AND aggregate_id = $1
 ORDER BY id
 LIMIT $2;

-- name: pool_status_report
-- Per pool (at most $1, by name): the due backlog and the oldest due job, from the claimable
-- index (pool, priority, available_at, id); running jobs from the leases index.
WITH running AS (
    SELECT pool, count(*)::bigint AS n FROM extraction_jobs WHERE state = 'RUNNING' GROUP BY pool
)
SELECT p.name, p.paused, q.backlog, coalesce(r.n, 0)::bigint AS running, q.oldest_available_at,
       extract(epoch FROM now() - q.oldest_available_at)::float8 AS oldest_age_s
  FROM (SELECT name, paused OR coalesce(paused_until > now(), false) AS paused  -- by spec, or for a refused key/quota
          FROM pools ORDER BY name LIMIT $1) p
 CROSS JOIN LATERAL (
       SELECT count(*)::bigint AS backlog, min(available_at) AS oldest_available_at
         FROM extraction_jobs
        WHERE pool = p.name AND state IN ('READY', 'RETRY_SCHEDULED') AND available_at <= now()
       ) q
  LEFT JOIN running r ON r.pool = p.name
 ORDER BY p.name;

-- name: batch_list_report
-- Batches in progress (a job not yet settled: waiting or running), oldest first, at most $1,
-- with per-state counts. The open set comes from the claimable and leases indexes; the counts
-- from the (batch_id, document_key) index, one batch at a time.
WITH open AS (
    SELECT batch_id FROM extraction_jobs WHERE state IN ('READY', 'RETRY_SCHEDULED')
     UNION
    SELECT batch_id FROM extraction_jobs WHERE state = 'RUNNING'
), picked AS (
    SELECT b.id, b.tenant, b.namespace, b.name, b.pool, b.total_jobs, b.suspended, b.created_at
      FROM batches b
     WHERE b.id IN (SELECT batch_id FROM open)
     ORDER BY b.id
     LIMIT $1
)
SELECT p.id, p.tenant, p.namespace, p.name, p.pool, p.total_jobs, p.suspended, p.created_at,
       extract(epoch FROM now() - p.created_at)::float8 AS age_s, c.states, c.counts
  FROM picked p
 CROSS JOIN LATERAL (
       SELECT array_agg(s.state ORDER BY s.state) AS states, array_agg(s.n ORDER BY s.state) AS counts
         FROM (SELECT state, count(*)::int AS n FROM extraction_jobs WHERE batch_id = p.id GROUP BY state) s
       ) c
 ORDER BY p.id;

-- name: job_review_queue_report
-- Jobs waiting for a reviewer, and since when (updated_at is when they entered the state:
-- nothing touches a job in REVIEW_REQUIRED until a reviewer or a cancellation moves it).
-- Uses extraction_jobs_review_queue (migration 0002).
SELECT count(*)::bigint AS size, min(updated_at) AS oldest_at,
       extract(epoch FROM now() - min(updated_at))::float8 AS oldest_age_s
  FROM extraction_jobs
 WHERE state = 'REVIEW_REQUIRED';

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

-- name: stale_completion_count_report
-- Completions discarded in the last $1 seconds (stale_completions_at, migration 0002).
SELECT count(*)::bigint FROM stale_completions WHERE at > now() - make_interval(secs => $1);
