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
--   through      the tenant's eligible jobs up to and including the batch's last eligible one
--   position     ahead + the other tenants' share of it: jobs of the pool claimed before the batch's next
--   remaining    through + the other tenants' share of it, + the batch's running jobs: calls until its last
--   calls_per_s  model calls of the pool that finished in the last $5 seconds, per second
-- Each count reads the claim index (extraction_jobs_fair_claimable) of the pool: its cost grows with
-- the pool's eligible backlog; the operator reads it at most once per status interval per batch.
WITH mine AS (
    SELECT f.rank AS first_rank, f.id AS first_id, l.rank AS last_rank, l.id AS last_id,
           (SELECT count(*) FROM extraction_jobs r WHERE r.batch_id = $3 AND r.state = 'RUNNING')::bigint AS running
      FROM (SELECT 1) one
      LEFT JOIN LATERAL (
          SELECT lading_claim_rank(j.available_at, j.priority) AS rank, j.id
            FROM extraction_jobs j
           WHERE j.pool = $1 AND j.tenant = $2 AND j.batch_id = $3 AND {{job_eligible}}
           ORDER BY lading_claim_rank(j.available_at, j.priority), j.id LIMIT 1) f ON true
      LEFT JOIN LATERAL (
          SELECT lading_claim_rank(j.available_at, j.priority) AS rank, j.id
            FROM extraction_jobs j
           WHERE j.pool = $1 AND j.tenant = $2 AND j.batch_id = $3 AND {{job_eligible}}
           ORDER BY lading_claim_rank(j.available_at, j.priority) DESC, j.id DESC LIMIT 1) l ON true
), own AS (
    SELECT count(j.id) FILTER (
               WHERE $3::bigint IS NULL
                  OR (lading_claim_rank(j.available_at, j.priority), j.id) < (m.first_rank, m.first_id))::bigint
               AS ahead,
           count(j.id) FILTER (
               WHERE $3::bigint IS NULL
                  OR (lading_claim_rank(j.available_at, j.priority), j.id) <= (m.last_rank, m.last_id))::bigint
               AS through
      FROM mine m
      LEFT JOIN extraction_jobs j ON j.pool = $1 AND j.tenant = $2 AND {{job_eligible}}
     GROUP BY m.first_id, m.last_id
), counted AS (
    SELECT o.ahead,
           o.through + CASE WHEN $3::bigint IS NULL THEN $4::bigint ELSE 0 END AS through,
           m.first_id IS NOT NULL AS has_eligible, m.running
      FROM own o CROSS JOIN mine m
), others AS (
    SELECT coalesce(t.weight, 1)::numeric AS weight, d.due
      FROM (SELECT j.tenant, count(*)::bigint AS due
              FROM extraction_jobs j
             WHERE j.pool = $1 AND j.tenant <> $2 AND {{job_eligible}}
             GROUP BY j.tenant) d
      LEFT JOIN tenants t ON t.name = d.tenant
), weight AS (
    SELECT coalesce((SELECT t.weight FROM tenants t WHERE t.name = $2), 1)::numeric AS mine
), throughput AS (
    SELECT count(*)::float8 / $5 AS calls_per_s
      FROM limiter_permits
     WHERE pool = $1 AND acquired_at > now() - make_interval(secs => $5) AND released_at IS NOT NULL
)
SELECT c.has_eligible, c.running,
       (c.ahead + coalesce((SELECT sum(least(o.due, ceil(c.ahead * o.weight / w.mine))) FROM others o), 0))::bigint
           AS position,
       (c.through + c.running
          + coalesce((SELECT sum(least(o.due, ceil(c.through * o.weight / w.mine))) FROM others o), 0))::bigint
           AS remaining,
       tp.calls_per_s
  FROM counted c CROSS JOIN weight w CROSS JOIN throughput tp;
