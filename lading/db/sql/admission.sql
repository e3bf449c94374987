-- What admission (lading/applying.py) reads, read at once: one statement instead of one per rule.

-- fragment: admission_context
-- Everything the quota rules need about the namespaces, pools and endpoints of CTE `asked`
-- (columns namespaces, pools, endpoints: text arrays), as one jsonb object:
--   tenants    {namespace: [every tenant listing it, by name]}   one: its tenant; more: a conflict
--   rules      {tenant: {maxQueuedJobs, maxQueuedBytes, allowedPools, allowedPriorities,
--              budgetCurrency, queuedJobs, queuedBytes}}         of the namespaces' only tenants; the
--              queued sums (migration 0025's counters) only where a limit bounds them, else 0
--   pools      {name: {provider, model, spec, paused}}            those that exist
--   endpoints  [name, ...]                                        those that exist
WITH owners AS (
    SELECT ns AS namespace,
           coalesce((SELECT jsonb_agg(t.name ORDER BY t.name) FROM tenants t WHERE ns = ANY (t.namespaces)),
                    '[]'::jsonb) AS tenants
      FROM unnest((SELECT a.namespaces FROM asked a)) AS ns
)
SELECT jsonb_build_object(
           'tenants', coalesce((SELECT jsonb_object_agg(o.namespace, o.tenants) FROM owners o), '{}'::jsonb),
           'rules', coalesce((
               SELECT jsonb_object_agg(t.name, jsonb_build_object(
                          'maxQueuedJobs', t.max_queued_jobs,
                          'maxQueuedBytes', (t.spec ->> 'maxQueuedBytes')::bigint,
                          'allowedPools', t.spec -> 'allowedPools',
                          'allowedPriorities', t.spec -> 'allowedPriorities',
                          'budgetCurrency', t.budget_currency,
                          'queuedJobs', CASE WHEN t.max_queued_jobs IS NULL THEN 0 ELSE q.jobs END,
                          'queuedBytes', CASE WHEN t.spec ->> 'maxQueuedBytes' IS NULL THEN 0 ELSE q.bytes END))
                 FROM tenants t
                 -- read (by index scan, migration 0052) only for a tenant that a limit bounds
                 LEFT JOIN LATERAL (SELECT * FROM lading_tenant_queued_sums(t.name)
                                     WHERE t.max_queued_jobs IS NOT NULL OR t.spec ->> 'maxQueuedBytes' IS NOT NULL) q
                        ON true
                WHERE t.name IN (SELECT o.tenants ->> 0 FROM owners o WHERE jsonb_array_length(o.tenants) = 1)
           ), '{}'::jsonb),
           'pools', coalesce((
               SELECT jsonb_object_agg(p.name, jsonb_build_object(
                          'provider', p.provider, 'model', p.model, 'spec', p.spec, 'paused', p.paused))
                 FROM pools p
                WHERE p.name = ANY ((SELECT a.pools FROM asked a)::text[])
           ), '{}'::jsonb),
           'endpoints', coalesce((
               SELECT jsonb_agg(e.name) FROM endpoints e WHERE e.name = ANY ((SELECT a.endpoints FROM asked a)::text[])
           ), '[]'::jsonb))

-- name: admission_context_get
-- The admission context (fragment admission_context) of namespaces $1, pools $2, endpoints $3.
WITH asked AS (SELECT $1::text[] AS namespaces, $2::text[] AS pools, $3::text[] AS endpoints)
SELECT {{admission_context}} AS context;
