-- A batch's place in its pool's queue: its priority class, changed after acceptance, and its
-- position among the pool's eligible work under fair share, with the pool's throughput for an
-- ETA (docs/fairness.md, "Queue position and ETA"). Repository: lading/db/queue.py.

-- name: batch_get_priority
-- The priority class batch $1 was accepted with, or last changed to.
SELECT priority FROM batches WHERE id = $1;

-- name: job_set_priority_of_batch
-- Priority class $2 for at most $3 unfinished jobs of batch $1 that have another one. Waiting
-- jobs re-rank in the claim index at once; running ones keep it for their retry. Rows are locked
-- in id order (docs/architecture.md, "Lock order"), as the heartbeats and group commits that also
-- lock running jobs do; the caller repeats until fewer than $3 changed, one short transaction each.
WITH locked AS (
    SELECT j.id
      FROM extraction_jobs j
     WHERE j.batch_id = $1 AND j.state IN ('READY', 'RETRY_SCHEDULED', 'RUNNING') AND j.priority <> $2
     ORDER BY j.id
     LIMIT $3
       FOR UPDATE
)
UPDATE extraction_jobs j
   SET priority = $2, updated_at = clock_timestamp()
  FROM locked l
 WHERE j.id = l.id AND j.state IN ('READY', 'RETRY_SCHEDULED', 'RUNNING')
RETURNING j.id;

-- name: batch_set_priority
-- The batch row takes priority class $2 once its jobs have it (so a change cut short by a crash
-- is seen as not applied yet, and applied again).
UPDATE batches SET priority = $2 WHERE id = $1;

-- name: job_queue_position_of_batch
-- Where the work of batch $3 (tenant $2, pool $1) stands among the pool's eligible jobs
-- ({{job_eligible}}) under weighted fair share. $3 NULL: a batch not accepted yet, of $4 documents,
-- queued behind all of its tenant's eligible work. Inside the tenant, jobs go in claim order
-- (lading_claim_rank, then id: the claim index's own order); while the tenant is served n jobs,
-- another tenant with due work is served min(its due jobs, ceil(n * its weight / the tenant's
-- weight)) (equal virtual times assumed: lading_fair_fill's steady state).
--   ahead        the tenant's eligible jobs of other batches before the batch's first eligible one
--   span         the tenant's eligible jobs from the batch's first to its last eligible one (its own among them)
--   position     ahead + the other tenants' share of it: jobs of the pool claimed before the batch's next
--   remaining    ahead + span + the other tenants' share of that + the batch's running jobs: calls until
--                its last is done
--   calls_per_s  model calls of the pool that finished in the last $5 seconds, per second
-- Each count is a range of the claim index (extraction_jobs_fair_claimable: pool, tenant, rank, id), so
-- a read costs the jobs ahead of the batch and its own span, and for each other tenant at most its share;
-- the operator reads it at most once per status interval per batch.
WITH batch_jobs AS MATERIALIZED (
    -- The batch's own eligible jobs, found by its batch_id (never by scanning the pool's queue).
    SELECT lading_claim_rank(j.available_at, j.priority) AS rank, j.id
      FROM extraction_jobs j
     WHERE j.batch_id = $3 AND {{job_eligible}}
), mine AS (
    SELECT f.rank AS first_rank, f.id AS first_id, l.rank AS last_rank, l.id AS last_id,
           (SELECT count(*) FROM extraction_jobs r WHERE r.batch_id = $3 AND r.state = 'RUNNING')::bigint AS running
      FROM (SELECT 1) one
      LEFT JOIN LATERAL (SELECT b.rank, b.id FROM batch_jobs b ORDER BY b.rank, b.id LIMIT 1) f ON true
      LEFT JOIN LATERAL (SELECT b.rank, b.id FROM batch_jobs b ORDER BY b.rank DESC, b.id DESC LIMIT 1) l ON true
), counted AS (
    SELECT CASE
             WHEN $3::bigint IS NULL THEN   -- not accepted yet: behind all of the tenant's eligible work
                 (SELECT count(*) FROM extraction_jobs j WHERE j.pool = $1 AND j.tenant = $2 AND {{job_eligible}})
             WHEN m.first_id IS NULL THEN 0
             ELSE (SELECT count(*) FROM extraction_jobs j
                    WHERE j.pool = $1 AND j.tenant = $2 AND {{job_eligible}}
                      AND (lading_claim_rank(j.available_at, j.priority), j.id) < (m.first_rank, m.first_id))
           END::bigint AS ahead,
           CASE
             WHEN $3::bigint IS NULL THEN $4::bigint
             WHEN m.first_id IS NULL THEN 0
             ELSE (SELECT count(*) FROM extraction_jobs j
                    WHERE j.pool = $1 AND j.tenant = $2 AND {{job_eligible}}
                      AND (lading_claim_rank(j.available_at, j.priority), j.id) >= (m.first_rank, m.first_id)
                      AND (lading_claim_rank(j.available_at, j.priority), j.id) <= (m.last_rank, m.last_id))
           END::bigint AS span,
           m.first_id IS NOT NULL AS has_eligible, m.running
      FROM mine m
), weight AS (
    SELECT coalesce((SELECT t.weight FROM tenants t WHERE t.name = $2), 1)::numeric AS mine
), shares AS (
    -- Each other tenant of the pool with due work: its share while the tenant is served `ahead` and
    -- `ahead + span` jobs, each counted on its own index range and never beyond that share.
    SELECT (SELECT count(*) FROM (SELECT 1 FROM extraction_jobs j
                                   WHERE j.pool = $1 AND j.tenant = q.tenant AND {{job_eligible}}
                                   LIMIT ceil(c.ahead * coalesce(t.weight, 1) / w.mine)::bigint) x)::bigint AS before,
           (SELECT count(*) FROM (SELECT 1 FROM extraction_jobs j
                                   WHERE j.pool = $1 AND j.tenant = q.tenant AND {{job_eligible}}
                                   LIMIT ceil((c.ahead + c.span) * coalesce(t.weight, 1) / w.mine)::bigint) x)::bigint
               AS until_last
      FROM tenant_queues q
      LEFT JOIN tenants t ON t.name = q.tenant
     CROSS JOIN counted c CROSS JOIN weight w
     WHERE q.pool = $1 AND q.tenant <> $2
), throughput AS (
    SELECT count(*)::float8 / $5 AS calls_per_s
      FROM limiter_permits
     WHERE pool = $1 AND acquired_at > now() - make_interval(secs => $5) AND released_at IS NOT NULL
)
SELECT c.has_eligible, c.running,
       (c.ahead + coalesce((SELECT sum(s.before) FROM shares s), 0))::bigint AS position,
       (c.ahead + c.span + c.running + coalesce((SELECT sum(s.until_last) FROM shares s), 0))::bigint AS remaining,
       tp.calls_per_s
  FROM counted c CROSS JOIN throughput tp;
